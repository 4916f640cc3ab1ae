"""Tests of modeling/configuration_transformer.py: the paper's sizes and refused settings."""

import pytest
from helpers import tiny_config

from modeling import TransformerConfig


def test_presets_match_table_3():
    base, big = TransformerConfig.base(), TransformerConfig.big(vocab_size=32000)
    assert (base.encoder_layers, base.d_model, base.encoder_ffn_dim, base.encoder_attention_heads) == (6, 512, 2048, 8)
    assert base.dropout == 0.1 and base.activation_function == "relu" and base.scale_embedding
    assert (big.d_model, big.decoder_ffn_dim, big.decoder_attention_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert big.vocab_size == 32000 and big.hidden_size == 1024 and big.num_attention_heads == 16


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 30, "encoder_attention_heads": 4}, "divisible by encoder_attention_heads"),
        ({"decoder_attention_heads": 5}, "divisible by decoder_attention_heads"),
        ({"positional_encoding_layout": "rotary"}, "Unknown positional_encoding_layout"),
        ({"positional_encoding_frequencies": "fairseq"}, "Unknown positional_encoding_frequencies 'fairseq'"),
        ({"positional_encoding_offset": -1}, "positional_encoding_offset must be a non-negative integer, got -1"),
        ({"encoder_layers": 0}, r"encoder_layers must be at least 1 \(N of Table 3\), got 0"),
        ({"decoder_layers": -1}, "decoder_layers must be at least 1"),
        ({"dropout": 1.5}, "dropout must be a probability between 0 and 1, got 1.5"),
        ({"attention_dropout": -0.1}, "attention_dropout must be a probability between 0 and 1"),
        ({"activation_dropout": 2}, "activation_dropout must be a probability"),
    ],
)
def test_bad_config_raises_value_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_positional_encoding_defaults_are_the_papers_so_saved_models_load_as_before():
    config = TransformerConfig()
    assert (config.positional_encoding_frequencies, config.positional_encoding_offset) == ("paper", 0)
    # a config.json written before these fields existed
    old = {key: value for key, value in tiny_config().to_dict().items() if not key.startswith("positional_encoding_")}
    loaded = TransformerConfig.from_dict(old)
    assert (loaded.positional_encoding_frequencies, loaded.positional_encoding_offset) == ("paper", 0)
