"""Attention weights of a trained model, and heatmaps of them (`scripts/plot_attention.py`)."""

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .files import atomic_path

logger = logging.getLogger(__name__)

FIGURE_DPI = 120
# 0.3 inch per token and per map grows with the square of the input: a 322-token sentence asked for gigabytes.
# 25 megapixels (5000 x 5000) draw in a few hundred MB and still show the attention patterns of long inputs, which
# a user plotting a given sentence wants more than a refusal; only the labels, no longer legible, are lost.
MAX_FIGURE_PIXELS = 25_000_000

ATTENTION_KINDS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention",
}


@dataclass
class AttentionMaps:
    """Attention weights of every layer and head for one sentence pair, shaped (layers, heads, queries, keys).

    Decoder queries are labelled with the target token each position predicts; decoder self-attention keys with
    the token each position reads (the start token, then the target shifted right).
    """

    source_tokens: list[str]
    target_tokens: list[str]
    decoder_input_tokens: list[str]
    encoder: torch.Tensor
    decoder: torch.Tensor
    cross: torch.Tensor

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(query labels, key labels) of one kind of attention."""
        return {
            "encoder": (self.source_tokens, self.source_tokens),
            "decoder": (self.target_tokens, self.decoder_input_tokens),
            "cross": (self.target_tokens, self.source_tokens),
        }[kind]


def attention_maps(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source: str, target: str | None = None
) -> AttentionMaps:
    """Run the model teacher-forced on (source, target) and collect its attention weights.

    `target=None` takes the model's own translation as the tokens it generated: its decoded text, tokenised again,
    had lost what decoding drops (`<unk>`, other special tokens) and so was another sequence than the one generated.
    SDPA and flash attention never materialise the weights, so the model must be loaded with
    `attn_implementation="eager"`.
    """
    if model.config._attn_implementation != "eager":
        raise ValueError(
            f"The model uses {model.config._attn_implementation!r} attention, which returns no weights: "
            "load it with attn_implementation='eager'."
        )
    # stripped as `translate` strips the source it translates: a trailing space or newline (a line pasted whole)
    # was a token of its own ("▁", "<unk>"), mapped beside a translation made without it
    source_ids = tokenizer(source.strip(), return_tensors="pt")["input_ids"].to(model.device)
    training = model.training
    model.eval()  # a model fresh from training: without this, dropout would make every call's maps differ
    try:
        with torch.inference_mode():
            if target is None:  # one sentence: no padding; the start token generate() began with, then the rest
                generated = model.generate(input_ids=source_ids, attention_mask=torch.ones_like(source_ids))
                labels, decoder_input_ids = generated[:, 1:], generated[:, :-1]
            else:
                labels = tokenizer(text_target=target.strip(), return_tensors="pt")["input_ids"].to(model.device)
                decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
            outputs = model(input_ids=source_ids, decoder_input_ids=decoder_input_ids, output_attentions=True)
    finally:
        model.train(training)

    def stack(per_layer: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.stack([weights[0] for weights in per_layer]).float().cpu()

    return AttentionMaps(
        source_tokens=tokenizer.convert_ids_to_tokens(source_ids[0].tolist()),
        target_tokens=tokenizer.convert_ids_to_tokens(labels[0].tolist()),
        decoder_input_tokens=tokenizer.convert_ids_to_tokens(decoder_input_ids[0].tolist()),
        encoder=stack(outputs.encoder_attentions),
        decoder=stack(outputs.decoder_attentions),
        cross=stack(outputs.cross_attentions),
    )


def _select(weights: torch.Tensor, head: int | None) -> torch.Tensor:
    heads = weights.shape[0]
    if head is None:
        return weights.mean(0)
    if not 0 <= head < heads:
        raise ValueError(f"head {head} does not exist: this attention has heads 0 to {heads - 1}.")
    return weights[head]


def figure_format(path: str | os.PathLike) -> str:
    """The format `path` is drawn in: its suffix's, PNG without one. A suffix matplotlib has no writer for
    (`maps.v2`) is refused naming the file, before the model is loaded and the maps drawn: savefig refused it once
    all was done, in words that named neither the file nor --output."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise ValueError(
            f"cannot write {os.fspath(path)}: matplotlib draws no .{suffix} files; end the name in .png, .pdf or "
            f".svg (or {', '.join(f'.{name}' for name in sorted(formats))})."
        )
    return suffix or "png"


def plot_attention_maps(
    maps: AttentionMaps,
    output_png: str | Path,
    *,
    layer: int | None = None,
    head: int | None = None,
    kinds: Sequence[str] = tuple(ATTENTION_KINDS),
) -> Path:
    """Draw heatmaps, one row per layer (`None`: all layers) and one column per kind of attention.

    `head=None` averages the heads. Uses a bare matplotlib `Figure`, leaving the caller's pyplot backend alone.
    """
    from matplotlib.figure import Figure

    unknown = set(kinds) - set(ATTENTION_KINDS)
    if unknown or not kinds:
        problem = f"Unknown attention kinds {sorted(unknown)}" if unknown else "No attention kind to draw"
        raise ValueError(f"{problem}; choose among {list(ATTENTION_KINDS)}.")
    image_format = figure_format(output_png)
    num_layers = {kind: getattr(maps, kind).shape[0] for kind in kinds}
    layers = range(max(num_layers.values())) if layer is None else [layer]
    for kind, count in num_layers.items():
        if layer is not None and not 0 <= layer < count:
            raise ValueError(f"layer {layer} does not exist: the {kind} has layers 0 to {count - 1}.")

    longest = max(len(maps.source_tokens), len(maps.target_tokens))
    cell = max(3.0, 0.3 * longest)
    pixels = (cell * FIGURE_DPI) ** 2 * len(kinds) * len(layers)
    if pixels > MAX_FIGURE_PIXELS:
        cell *= math.sqrt(MAX_FIGURE_PIXELS / pixels)
        logger.warning(
            "%d tokens in %d maps need a %.0f-megapixel figure: drawing it at %.0f megapixels, where its labels may "
            "be unreadable (plot one layer or fewer kinds of attention for larger maps)",
            longest,
            len(kinds) * len(layers),
            pixels / 1e6,
            (cell * FIGURE_DPI) ** 2 * len(kinds) * len(layers) / 1e6,
        )
    figure = Figure(figsize=(cell * len(kinds), cell * len(layers)), layout="constrained")
    grid = figure.subplots(len(layers), len(kinds), squeeze=False)
    head_name = "mean of heads" if head is None else f"head {head}"
    for row, layer_index in enumerate(layers):
        for column, kind in enumerate(kinds):
            axes = grid[row][column]
            if layer_index >= num_layers[kind]:
                axes.set_axis_off()
                continue
            queries, keys = maps.labels(kind)
            image = axes.imshow(_select(getattr(maps, kind)[layer_index], head).numpy(), cmap="viridis", vmin=0)
            axes.set_xticks(range(len(keys)), keys, rotation=90, fontsize=8)
            axes.set_yticks(range(len(queries)), queries, fontsize=8)
            axes.set_title(f"{ATTENTION_KINDS[kind]}, layer {layer_index}, {head_name}", fontsize=9)
            figure.colorbar(image, ax=axes, shrink=0.8)
    output_png = Path(output_png)
    with atomic_path(output_png) as temporary:
        figure.savefig(temporary, dpi=FIGURE_DPI, format=image_format)
    return output_png
