"""Tests of modeling/attention.py: attention maps of a trained model."""

import logging
import struct

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from modeling import attention
from modeling.attention import AttentionMaps, attention_maps, plot_attention_maps
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


def test_a_model_in_training_mode_gives_its_maps_without_dropout_and_stays_in_training_mode(tiny_checkpoint):
    """A model straight from the Trainer: each call's maps differed, dropped out."""
    model_dir, _, _ = tiny_checkpoint
    model, tokenizer = load_model_and_tokenizer(str(model_dir), attn_implementation="eager")
    expected = attention_maps(model, tokenizer, "the small dog.", "der kleine Hund.")
    assert model.config.dropout > 0
    model.train()
    maps = attention_maps(model, tokenizer, "the small dog.", "der kleine Hund.")
    assert model.training and torch.equal(maps.cross, expected.cross) and torch.equal(maps.encoder, expected.encoder)


def test_the_figure_of_a_long_input_is_capped_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(attention, "MAX_FIGURE_PIXELS", 300_000, raising=False)  # 40 tokens exceed it
    tokens = [f"t{i}" for i in range(40)]
    weights = torch.full((2, 1, 40, 40), 1 / 40)
    maps = AttentionMaps(tokens, tokens, tokens, weights, weights, weights)
    with caplog.at_level(logging.WARNING, logger="modeling.attention"):
        plot_attention_maps(maps, tmp_path / "long.png")
    width, height = struct.unpack(">II", (tmp_path / "long.png").read_bytes()[16:24])  # the PNG header's size
    assert width * height <= 300_000 and width / height == pytest.approx(3 / 2, rel=0.01)
    assert "labels may be unreadable" in caplog.text and "40 tokens" in caplog.text
