"""Tests of modeling/attention.py: attention maps of a trained model."""

import logging
import re
import struct

import pytest
import torch
from matplotlib.figure import Figure
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


def test_the_maps_are_of_the_sentences_stripped_as_translate_strips_the_source(tiny_checkpoint):
    """A pasted line's newline was a token of its own (`<unk>`), mapped beside a translation made without it."""
    model_dir, _, _ = tiny_checkpoint
    model, tokenizer = load_model_and_tokenizer(str(model_dir), attn_implementation="eager")
    expected = attention_maps(model, tokenizer, "the small dog.", "der kleine Hund.")
    maps = attention_maps(model, tokenizer, " the small dog.\n", "der kleine Hund. ")
    assert maps.source_tokens == expected.source_tokens and maps.target_tokens == expected.target_tokens
    assert torch.equal(maps.cross, expected.cross)


def test_without_a_target_the_maps_are_of_the_tokens_the_model_generated_unknown_ones_included(tiny_checkpoint):
    """The translation's text, tokenised again, had lost its `<unk>` tokens (decoding drops special tokens): here
    all of them, leaving a map of `</s>` alone for a sentence the model had translated."""
    model_dir, _, _ = tiny_checkpoint
    model, tokenizer = load_model_and_tokenizer(str(model_dir), attn_implementation="eager")
    with torch.no_grad():  # the output projection (tied to the embeddings) made to prefer <unk> to a common word
        model.lm_head.weight[tokenizer.unk_token_id] = (
            3 * model.lm_head.weight[tokenizer.convert_tokens_to_ids("▁likes")]
        )
    source = tokenizer(["a dog."], return_tensors="pt")
    generated = model.eval().generate(**source)[0].tolist()
    assert "<unk>" in tokenizer.convert_ids_to_tokens(generated)
    maps = attention_maps(model, tokenizer, "a dog.")
    assert maps.target_tokens == tokenizer.convert_ids_to_tokens(generated[1:])
    assert maps.decoder_input_tokens == tokenizer.convert_ids_to_tokens(generated[:-1])
    assert maps.cross.shape[-2:] == (len(generated) - 1, len(maps.source_tokens))


def test_a_model_in_training_mode_gives_its_maps_without_dropout_and_stays_in_training_mode(tiny_checkpoint):
    """A model straight from the Trainer: each call's maps differed, dropped out."""
    model_dir, _, _ = tiny_checkpoint
    model, tokenizer = load_model_and_tokenizer(str(model_dir), attn_implementation="eager")
    expected = attention_maps(model, tokenizer, "the small dog.", "der kleine Hund.")
    assert model.config.dropout > 0
    model.train()
    maps = attention_maps(model, tokenizer, "the small dog.", "der kleine Hund.")
    assert model.training and torch.equal(maps.cross, expected.cross) and torch.equal(maps.encoder, expected.encoder)


def png_size(path) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG header."""
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_each_map_is_0_3_inch_per_token_of_the_longer_sentence_and_at_least_3_inches(tmp_path):
    for length, inches in ((4, 3.0), (20, 6.0)):
        tokens = [f"t{i}" for i in range(length)]
        weights = torch.full((1, 1, length, length), 1 / length)
        maps = AttentionMaps(tokens, tokens[:2], tokens[:2], weights, weights[..., :2, :2], weights[..., :2, :])
        plot_attention_maps(maps, tmp_path / f"{length}.png", kinds=["encoder", "cross"])
        assert png_size(tmp_path / f"{length}.png") == (
            2 * inches * attention.FIGURE_DPI,
            inches * attention.FIGURE_DPI,
        )


def test_the_figure_of_a_long_input_is_capped_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(attention, "MAX_FIGURE_PIXELS", 300_000, raising=False)  # 40 tokens exceed it
    tokens = [f"t{i}" for i in range(40)]
    weights = torch.full((2, 1, 40, 40), 1 / 40)
    maps = AttentionMaps(tokens, tokens, tokens, weights, weights, weights)
    with caplog.at_level(logging.WARNING, logger="modeling.attention"):
        plot_attention_maps(maps, tmp_path / "long.png")
    width, height = png_size(tmp_path / "long.png")
    assert width * height <= 300_000 and width / height == pytest.approx(3 / 2, rel=0.01)
    assert "labels may be unreadable" in caplog.text and "40 tokens" in caplog.text


def distinct_maps() -> AttentionMaps:
    """Maps whose every (layer, head) differs, with a 2-layer encoder over a 1-layer decoder and 3 heads: no size
    equals another."""
    source, target = ["a", "b", "c", "d"], ["x", "</s>"]
    decoder_input = ["</s>", "x"]

    def weights(layers: int, queries: int, keys: int) -> torch.Tensor:
        return torch.rand(layers, 3, queries, keys, generator=torch.Generator().manual_seed(keys))

    return AttentionMaps(source, target, decoder_input, weights(2, 4, 4), weights(1, 2, 2), weights(1, 2, 4))


@pytest.fixture
def saved_figures(monkeypatch) -> list[Figure]:
    """The figures `plot_attention_maps` saves, as drawn."""
    saved = []
    savefig = Figure.savefig

    def recording_savefig(figure, *args, **kwargs):
        saved.append(figure)
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    return saved


def test_each_heatmap_is_its_layer_and_head_labelled_with_the_tokens_it_relates(tmp_path, saved_figures):
    maps = distinct_maps()
    assert plot_attention_maps(maps, tmp_path / "all.png") == tmp_path / "all.png"
    (figure,) = saved_figures
    grid = figure.axes[:6]  # a row per layer, a column per kind; the colorbars' axes follow
    drawn = {(0, "encoder"): grid[0], (0, "decoder"): grid[1], (0, "cross"): grid[2], (1, "encoder"): grid[3]}
    for (layer, kind), axes in drawn.items():
        queries, keys = maps.labels(kind)
        (image,) = axes.images
        assert torch.allclose(torch.as_tensor(image.get_array()), getattr(maps, kind)[layer].mean(0))
        assert image.get_clim()[0] == 0 and image.colorbar is not None, "one colour scale from zero, shown"
        assert [label.get_text() for label in axes.get_xticklabels()] == keys
        assert [label.get_text() for label in axes.get_yticklabels()] == queries
        assert axes.get_title() == f"{attention.ATTENTION_KINDS[kind]}, layer {layer}, mean of heads"
    assert not grid[4].axison and not grid[5].axison and not grid[4].images, "the decoder has no layer 1"

    plot_attention_maps(maps, tmp_path / "one", layer=0, head=0, kinds=["cross"])
    (axes, _colorbar) = saved_figures[1].axes
    assert torch.allclose(torch.as_tensor(axes.images[0].get_array()), maps.cross[0, 0])
    assert axes.get_title() == "cross-attention, layer 0, head 0"
    assert (tmp_path / "one").read_bytes().startswith(b"\x89PNG"), "no suffix: a PNG"


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ({"kinds": ["self"]}, r"Unknown attention kinds \['self'\]; choose among \['encoder', 'decoder', 'cross'\]"),
        ({"kinds": []}, r"No attention kind to draw; choose among \['encoder', 'decoder', 'cross'\]"),
        ({"layer": 1}, "layer 1 does not exist: the decoder has layers 0 to 0"),
        ({"layer": 2, "kinds": ["encoder"]}, "layer 2 does not exist: the encoder has layers 0 to 1"),
        ({"layer": -1}, "layer -1 does not exist"),
        ({"head": 3}, "head 3 does not exist: this attention has heads 0 to 2"),
        ({"head": -1}, "head -1 does not exist"),
    ],
)
def test_a_kind_layer_or_head_the_maps_lack_is_refused_before_anything_is_written(tmp_path, selection, message):
    with pytest.raises(ValueError, match=message):
        plot_attention_maps(distinct_maps(), tmp_path / "maps.png", **selection)
    assert not list(tmp_path.iterdir())


def test_an_output_name_matplotlib_draws_no_format_for_is_refused_naming_it_and_others_follow_their_suffix(tmp_path):
    """Before, `maps.v2` was drawn, then refused by savefig as "Format 'v2' is not supported (...)": neither the
    file nor --output named, after the model had been loaded and run."""
    refusal = f"cannot write {tmp_path / 'maps.v2'}: matplotlib draws no .v2 files; end the name in .png, .pdf or .svg"
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}"):
        plot_attention_maps(distinct_maps(), tmp_path / "maps.v2")
    assert not list(tmp_path.iterdir())

    for name, start in (("maps.PDF", b"%PDF"), ("maps.svg", b"<?xml"), ("maps", b"\x89PNG")):
        plot_attention_maps(distinct_maps(), tmp_path / name, layer=0, kinds=["cross"])
        assert (tmp_path / name).read_bytes().startswith(start), name
