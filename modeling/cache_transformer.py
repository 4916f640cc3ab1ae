"""Where beam search keeps the decoder's keys and values: `StaticBeamCache`, written in place.

`TransformerAttention` (in the model file) reads a cache through the interface of a transformers
`EncoderDecoderCache` (`self_attention_cache.update`, `cross_attention_cache.layers`, `is_updated`);
`StaticBeamCache` offers the same, without that cache's copies, for the decoding loop of `generation_transformer.py`.

This file travels with every checkpoint as remote code, beside the decoding file that imports it: it imports only
torch.
"""

from types import SimpleNamespace

import torch

# The attention implementations whose decoding steps `StaticBeamCache` serves; others take transformers' loop.
STATIC_CACHE_ATTENTION = ("sdpa", "eager")


class _CrossAttention:
    """Cross-attention keys and values of every layer, computed once from the encoder output at the first step."""

    def __init__(self):
        self.layers: list[SimpleNamespace] = []  # `.keys`, `.values`: (rows, H, S, Dh), where the attention reads

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Each decoder layer stores its own once, in layer order; the attention then reads `layers[layer_idx]`.
        if layer_idx != len(self.layers):
            raise RuntimeError(
                f"cross-attention keys and values of layer {layer_idx} came in layer {len(self.layers)}'s place"
            )
        self.layers.append(SimpleNamespace(keys=key_states, values=value_states))
        return key_states, value_states

    def select(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)


class _SelfAttention:
    """Self-attention keys and values of every layer, in one buffer of `max_rows` rows written in place, laid out
    (rows, steps, layers, keys/values, H, Dh): the steps a row has written are one contiguous block, so that beam
    search's reordering is a single copy of whole blocks rather than a strided copy per layer, keys and values.
    The room for steps starts at `FIRST_STEPS` and doubles when it is full (up to `max_steps`): most sentences end
    long before the length limit, and a buffer for the limit would hold memory they never use."""

    FIRST_STEPS = 16

    def __init__(self, max_rows: int, max_steps: int, num_layers: int):
        self.max_rows, self.max_steps, self.num_layers = max_rows, max_steps, num_layers
        self.length = self.rows = 0  # steps written; hypotheses held
        self.buffer: torch.Tensor | None = None  # (max_rows, room, layers, 2, H, Dh)
        self.spare: torch.Tensor | None = None  # the same shape: where the next selection is copied to

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a step's (rows, H, 1, Dh) at position `length`; return the layer's keys and values so far, each
        (rows, H, length + 1, Dh)."""
        if self.buffer is None:  # the first step allocates
            self.rows = key_states.shape[0]
            room = min(self.FIRST_STEPS, self.max_steps)
            shape = (self.max_rows, room, self.num_layers, 2, key_states.shape[1], key_states.shape[3])
            self.buffer, self.spare = key_states.new_empty(shape), key_states.new_empty(shape)
        if self.length == self.buffer.shape[1]:
            self._grow()
        layer = self.buffer[: self.rows, :, layer_idx]  # (rows, room, 2, H, Dh)
        layer[:, self.length, 0], layer[:, self.length, 1] = key_states[:, :, 0], value_states[:, :, 0]
        written = layer[:, : self.length + 1].transpose(1, 3)  # (rows, H, 2, length + 1, Dh)
        return written[:, :, 0], written[:, :, 1]

    def _grow(self) -> None:
        """Twice the room for steps (at most `max_steps`), keeping the steps written."""
        shape = list(self.buffer.shape)
        shape[1] = min(2 * shape[1], self.max_steps)
        self.spare = None  # freed first: at no point more memory than the grown pair holds
        grown = self.buffer.new_empty(shape)
        grown[:, : self.length] = self.buffer[:, : self.length]
        self.buffer = grown
        self.spare = grown.new_empty(shape)

    def select(self, rows: torch.Tensor) -> None:
        """Keep the histories of `rows` (indices into the current rows, repeats allowed), copying only the steps
        written, into the spare buffer, which then takes the place of the current one."""
        count, written = rows.shape[0], slice(0, self.length)
        torch.index_select(self.buffer[: self.rows, written], 0, rows, out=self.spare[:count, written])
        self.buffer, self.spare = self.spare, self.buffer
        self.rows = count


class StaticBeamCache:
    """The decoder's keys and values during beam search, where `TransformerAttention` reads them from a transformers
    `EncoderDecoderCache` (`self_attention_cache.update`, `cross_attention_cache.layers`, `is_updated`), without that
    cache's copies: self-attention keys and values are written in place into one buffer with room for several steps
    (a `DynamicCache` concatenates, copying all earlier steps at every one), and beam search's reordering copies only
    the steps written so far; cross-attention keys and values are computed once per sentence, at the first step, then
    repeated for its beams. (On this project's 2-core CPUs that makes decoding a few percent faster at most, not
    more: docs/results.md says where a step's time goes.)
    """

    def __init__(
        self,
        max_rows: int,
        max_steps: int,
        num_layers: int,
        encoder_hidden_states: torch.Tensor,
        cross_attention_mask: torch.Tensor | None,
    ):
        self.self_attention_cache = _SelfAttention(max_rows, max_steps, num_layers)
        self.cross_attention_cache = _CrossAttention()
        self.is_updated: dict[int, bool] = {}  # set by each layer's cross-attention once it has stored its keys
        self.encoder_hidden_states = encoder_hidden_states  # (B, S, D): projected at the first step only
        self.cross_attention_mask = cross_attention_mask  # (rows, 1, 1, S), or None without padding

    @property
    def length(self) -> int:
        return self.self_attention_cache.length

    def advance(self) -> None:
        """Every layer has stored this step's keys and values."""
        self.self_attention_cache.length += 1

    def select(self, hypotheses: torch.Tensor, sentences: torch.Tensor | None = None) -> None:
        """Keep the hypotheses `hypotheses`, in this order; with `sentences`, the batch's rows change too (finished
        sentences leave, or one row per sentence becomes K): the cross-attention's rows follow. Beam search alone
        needs no `sentences`: beams move within their sentence, whose rows hold the same encoder keys and values."""
        self.self_attention_cache.select(hypotheses)
        if sentences is not None:
            self.cross_attention_cache.select(sentences)
            if self.cross_attention_mask is not None:
                self.cross_attention_mask = self.cross_attention_mask.index_select(0, sentences)
