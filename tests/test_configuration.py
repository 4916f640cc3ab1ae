"""Tests of modeling/configuration_transformer.py: the paper's sizes and refused settings."""

import importlib.util

import pytest
import torch
import transformers
from helpers import tiny_config, tiny_model
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from modeling import TransformerConfig, TransformerForConditionalGeneration, configuration_transformer
from modeling.tokenization import train_shared_bpe


def test_presets_match_table_3():
    base, big = TransformerConfig.base(), TransformerConfig.big(vocab_size=32000)
    assert (base.encoder_layers, base.d_model, base.encoder_ffn_dim, base.encoder_attention_heads) == (6, 512, 2048, 8)
    assert (base.decoder_layers, base.decoder_ffn_dim, base.decoder_attention_heads) == (6, 2048, 8)
    assert base.dropout == 0.1 and base.activation_function == "relu" and base.scale_embedding
    assert (big.d_model, big.decoder_ffn_dim, big.decoder_attention_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert (big.encoder_ffn_dim, big.encoder_layers, big.decoder_layers) == (4096, 6, 6)
    assert big.vocab_size == 32000 and big.hidden_size == 1024 and big.num_attention_heads == 16


def test_defaults_are_the_papers_model_over_the_shared_bpe():
    """Sec. 3.4: one embedding matrix for both stacks and the output projection; Sec. 3.2.2: plain projection
    matrices; Sec. 5.1: a shared vocabulary of about 37000 tokens, whose special ids the shared BPE gives."""
    config = TransformerConfig()
    assert config.tie_word_embeddings and not config.attention_bias and config.vocab_size == 37000
    assert config.attention_dropout == config.activation_dropout == 0
    assert config.is_encoder_decoder and config.use_cache
    tokenizer = train_shared_bpe(["a small dog .", "ein kleiner Hund ."], vocab_size=40, min_frequency=1)
    assert (config.pad_token_id, config.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    assert config.decoder_start_token_id == tokenizer.eos_token_id  # the decoder starts from </s>, as fairseq's


def test_the_smallest_values_are_accepted_and_build_a_model():
    """Each check refuses only what no model can be built from."""
    config = TransformerConfig(
        vocab_size=3,  # <pad>, <unk>, </s>
        d_model=2,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=1,
        encoder_ffn_dim=1,
        decoder_ffn_dim=1,
        max_position_embeddings=1,
        dropout=0.0,
        init_std=0.0,
    )
    ids = torch.tensor([[1, 2]])
    assert TransformerForConditionalGeneration(config)(input_ids=ids, decoder_input_ids=ids).logits.shape == (1, 2, 3)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 30, "encoder_attention_heads": 4}, "divisible by encoder_attention_heads"),
        ({"decoder_attention_heads": 5}, "divisible by decoder_attention_heads"),
        ({"encoder_attention_heads": 0}, r"d_model \(32\) must be divisible by encoder_attention_heads \(0\)"),
        ({"positional_encoding_layout": "rotary"}, "Unknown positional_encoding_layout"),
        ({"positional_encoding_frequencies": "fairseq"}, "Unknown positional_encoding_frequencies 'fairseq'"),
        ({"positional_encoding_offset": -1}, "positional_encoding_offset must be a non-negative integer, got -1"),
        ({"encoder_layers": 0}, r"encoder_layers must be at least 1 \(N of Table 3\), got 0"),
        ({"decoder_layers": -1}, "decoder_layers must be at least 1"),
        ({"dropout": 1.5}, r"dropout must be a probability in \[0, 1\) \(1 drops everything\), got 1.5"),
        ({"attention_dropout": -0.1}, r"attention_dropout must be a probability in \[0, 1\)"),
        ({"activation_dropout": 2}, "activation_dropout must be a probability"),
        ({"num_attention_heads": 5}, "divisible by encoder_attention_heads"),  # an alias, set after the fields
        ({"dropout": 1.0}, r"dropout must be a probability in \[0, 1\) \(1 drops everything\), got 1.0"),
        ({"activation_dropout": 1}, r"activation_dropout must be a probability in \[0, 1\)"),
        ({"d_model": 0}, r"d_model must be a positive even number \(sinusoids come in sin/cos pairs\), got 0"),
        ({"d_model": -4}, "d_model must be a positive even number"),
        ({"d_model": 33, "encoder_attention_heads": 3}, "d_model must be a positive even number"),
        ({"vocab_size": 0}, "vocab_size must be at least 1, got 0"),
        ({"encoder_ffn_dim": 0}, "encoder_ffn_dim must be at least 1, got 0"),
        ({"decoder_ffn_dim": -1}, "decoder_ffn_dim must be at least 1, got -1"),
        ({"max_position_embeddings": 0}, "max_position_embeddings must be at least 1, got 0"),
        ({"layer_norm_eps": -1e-5}, "layer_norm_eps must be a positive number, got -1e-05"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps must be a positive number, got 0.0"),
        ({"layer_norm_eps": float("nan")}, "layer_norm_eps must be a positive number, got nan"),
        ({"layer_norm_eps": float("inf")}, "layer_norm_eps must be a positive number, got inf"),
        ({"init_std": -0.02}, "init_std must be a non-negative number, got -0.02"),
        ({"init_std": float("inf")}, "init_std must be a non-negative number, got inf"),
        ({"activation_function": "ReLU"}, r"Unknown activation_function 'ReLU'; expected one of \['gelu', "),
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


def test_keyword_overrides_of_a_saved_config_are_checked_once_all_are_in(tmp_path):
    """`from_pretrained` sets its keyword overrides one by one after building the config."""
    tiny_model().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"d_model \(36\) must be divisible by encoder_attention_heads \(8\)"):
        AutoConfig.from_pretrained(tmp_path, d_model=36, encoder_attention_heads=8)
    with pytest.raises(ValueError, match="Unknown positional_encoding_layout 'Interleaved'"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path, positional_encoding_layout="Interleaved")
    config, unused = AutoConfig.from_pretrained(  # invalid after the first override, valid after the last
        tmp_path, d_model=36, encoder_attention_heads=6, decoder_attention_heads=6, return_unused_kwargs=True
    )
    assert (config.d_model, config.encoder_attention_heads, config.decoder_attention_heads, unused) == (36, 6, 6, {})


def test_values_set_by_hand_are_refused_before_a_model_is_built_or_anything_is_saved(tmp_path):
    model = tiny_model()
    model.config.positional_encoding_layout = "foo"
    with pytest.raises(ValueError, match="Unknown positional_encoding_layout 'foo'"):
        TransformerForConditionalGeneration(model.config)
    with pytest.raises(ValueError, match="Unknown positional_encoding_layout 'foo'"):
        model.save_pretrained(tmp_path / "model")
    with pytest.raises(StrictDataclassClassValidationError, match="Unknown positional_encoding_layout 'foo'"):
        model.config.save_pretrained(tmp_path / "config")
    assert not list(tmp_path.rglob("*.json"))


def import_configuration_file_under(monkeypatch, version: str) -> None:
    """The version check runs as the file is imported: here a fresh copy of it, under a pretended version."""
    monkeypatch.setattr(transformers, "__version__", version)
    spec = importlib.util.spec_from_file_location("fresh_configuration", configuration_transformer.__file__)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_the_oldest_supported_transformers_is_accepted_and_an_older_one_refused(monkeypatch):
    import_configuration_file_under(monkeypatch, "5.24.0")  # MINIMUM_TRANSFORMERS itself
    with pytest.raises(ImportError, match=r"needs transformers>=5.24, found 5.23.2: pip install -U"):
        import_configuration_file_under(monkeypatch, "5.23.2")
