"""Tests of modeling/attention.py: attention maps of a trained model."""

import pytest
from transformers import AutoModelForSeq2SeqLM

from modeling.attention import attention_maps
from modeling.translation import load_model_and_tokenizer


def test_attention_maps_have_one_distribution_per_query(tiny_checkpoint):
    model_dir, _, _ = tiny_checkpoint
    model, tokenizer = load_model_and_tokenizer(str(model_dir), attn_implementation="eager")
    maps = attention_maps(model, tokenizer, "the small dog.", "der kleine Hund.")
    source, target = len(maps.source_tokens), len(maps.target_tokens)
    assert maps.encoder.shape == (2, 4, source, source)
    assert maps.decoder.shape == (2, 4, target, target)
    assert maps.cross.shape == (2, 4, target, source)
    for weights in (maps.encoder, maps.decoder, maps.cross):
        assert weights.sum(-1).allclose(weights.new_ones(()))
    assert maps.decoder[..., 0, 1:].abs().max() == 0, "the decoder's first position sees only the start token"
    assert maps.decoder_input_tokens[0] == "</s>" and maps.target_tokens[-1] == "</s>"

    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        attention_maps(AutoModelForSeq2SeqLM.from_pretrained(model_dir), tokenizer, "a", "b")
