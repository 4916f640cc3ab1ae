"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

Read top to bottom, this file follows the paper: positional encodings (Sec. 3.5), multi-head attention
(Sec. 3.2), the post-LayerNorm encoder and decoder layers (Sec. 3.1, 3.3), the stacks with one shared,
scaled embedding matrix (Sec. 3.4), the label-smoothed training loss (Sec. 5.4) and the translation model.
Its decoding, the paper's beam search (Sec. 6.1), lives beside it in `generation_transformer.py`.

This file travels with every checkpoint as remote code: it imports only torch, transformers and its siblings
(`configuration_transformer.py`, which refuses transformers releases older than it supports;
`generation_transformer.py`, which imports `cache_transformer.py`, the decoding's keys and values; and
`onednn_transformer.py`, through which every linear layer runs, on oneDNN where that is faster).
"""

import math
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, is_torchdynamo_compiling
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_transformer import TransformerConfig
from .generation_transformer import TransformerGenerationMixin, set_paper_decoding
from .onednn_transformer import functorch_active, is_plain_linear, linear, linears, matmul_transposed

if TYPE_CHECKING:  # hints only: generate()'s beam-search cache (defined in cache_transformer.py, which only
    # generation_transformer.py imports, so that this file's siblings stay those its code needs at run time)
    from .generation_transformer import StaticBeamCache

# --------------------------------------------------------------------------------------------------------------
# Positional encoding (Sec. 3.5)
# --------------------------------------------------------------------------------------------------------------


def sinusoidal_positional_encoding(
    positions: torch.Tensor, d_model: int, layout: str, frequencies: str = "paper"
) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    `layout="interleaved"` places the pair (sin, cos) of frequency i at dimensions (2i, 2i+1), as the formula
    reads; `"concatenated"` places all sines first, then all cosines (tensor2tensor, fairseq, Marian).
    `frequencies="paper"` is the formula above, computed in float64, then rounded to float32, so that both layouts
    match other implementations bit for bit. `"tensor2tensor"` is the form tensor2tensor and fairseq use, frequency
    exp(-ln(10000) · i / (d_model/2 - 1)) for i = 0 .. d_model/2 - 1, computed in float32 with fairseq's operations
    (`SinusoidalPositionalEmbedding.get_embedding`), so that converted fairseq models add fairseq's numbers: built
    in float64 instead, they would differ by up to 3e-5 at position 1000.
    """
    if frequencies == "tensor2tensor":
        half = d_model // 2
        scale = math.log(10000) / max(half - 1, 1)
        angular_frequencies = torch.exp(torch.arange(half, dtype=torch.float32) * -scale)  # (D/2,)
        angles = positions.to(torch.float32)[:, None] * angular_frequencies[None, :]  # (T, D/2)
    else:
        frequency_exponents = torch.arange(0, d_model, 2, dtype=torch.float64) / d_model  # (D/2,)
        angles = positions.to(torch.float64)[:, None] / torch.pow(10000.0, frequency_exponents)[None, :]  # (T, D/2)
    if layout == "interleaved":
        table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (T, D)
    else:
        table = torch.cat((angles.sin(), angles.cos()), dim=-1)  # (T, D)
    return table.to(torch.float32)


class TransformerPositionalEncoding(nn.Module):
    """Fixed sinusoids, not learned and not saved: the table is a non-persistent buffer, refilled by
    `_init_weights` after `from_pretrained` builds the model on the meta device, and by `load_state_dict` after
    PyTorch's own way does (`to_empty()`, which leaves it uninitialised memory).

    Row p of the table, and `forward(p, 1)`, encode the p-th token (0 for the first) as position
    p + `positional_encoding_offset`: everything that reads positions from this module (the stacks, the decoding
    loop, the CTranslate2 export) sees the offset."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.d_model = config.d_model
        self.layout = config.positional_encoding_layout
        self.frequencies = config.positional_encoding_frequencies
        self.offset = config.positional_encoding_offset
        self.register_buffer("table", self.compute_table(config.max_position_embeddings), persistent=False)

    def compute_table(self, num_positions: int, start: int = 0) -> torch.Tensor:
        positions = torch.arange(start + self.offset, start + self.offset + num_positions)
        return sinusoidal_positional_encoding(positions, self.d_model, self.layout, self.frequencies)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        if not self.table.is_meta:  # a state dict holds no table to load: it is computed again
            with torch.no_grad():
                self.table.copy_(self.compute_table(self.table.shape[0]))

    def forward(self, start: int, length: int) -> torch.Tensor:
        """Encodings of the tokens start, ..., start + length - 1 (positions offset as configured): (T, D)."""
        if start + length <= self.table.shape[0]:
            return self.table[start : start + length]
        # Beyond the precomputed table the formula still applies (Sec. 3.5: "may allow the model to
        # extrapolate to sequence lengths longer than the ones encountered during training").
        return self.compute_table(length, start).to(self.table.device)


# --------------------------------------------------------------------------------------------------------------
# Dropout (Sec. 5.4: on each sub-layer's output and on the sums of embeddings and positional encodings)
# --------------------------------------------------------------------------------------------------------------


def apply_dropout(hidden_states: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout`, with a faster mask on CPU.

    ATen's CPU dropout draws each element's Bernoulli variable from the serial generator on its own, about 5 ns
    an element where we measured: a tenth of a training step at the benchmark's sizes. Here each 64-bit word of
    the same generator gives two elements a 32-bit uniform u each; an element is kept when u >= p * 2^32, so it
    is dropped with probability within 2^-33 of p, and the kept ones are scaled by 1 / (1 - p). Elsewhere
    (GPUs draw masks in parallel) and under torch.compile, `F.dropout` itself.
    """
    if not training or p == 0.0:
        return hidden_states
    if hidden_states.device.type != "cpu" or is_torchdynamo_compiling() or not 0.0 < p < 1.0:
        return F.dropout(hidden_states, p=p, training=True)  # also the error for p outside [0, 1]
    count = hidden_states.numel()
    words = torch.empty((count + 1) // 2, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    uniforms = words.view(torch.int32)[:count].view(hidden_states.shape)  # uniform over [-2^31, 2^31)
    keep = uniforms >= round(p * 2**32) - 2**31
    return hidden_states * keep.to(hidden_states.dtype).mul_(1.0 / (1.0 - p))


# --------------------------------------------------------------------------------------------------------------
# Multi-head attention (Sec. 3.2)
# --------------------------------------------------------------------------------------------------------------


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, softmax(QK^T / sqrt(d_k)) V (Eq. 1), keeping the weights for inspection."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, Tq, Tk)
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = apply_dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value)  # (B, H, Tq, Dh)
    return attn_output.transpose(1, 2).contiguous(), attn_weights  # (B, Tq, H, Dh)


class TransformerAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Used three ways (Sec. 3.2.3): encoder self-attention, masked decoder self-attention, and encoder-decoder
    (cross) attention, whose keys and values come from the encoder output and are computed once per input.
    """

    def __init__(self, config: TransformerConfig, num_heads: int, is_causal: bool, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.is_causal = is_causal  # read by the sdpa and flash attention functions
        self.layer_idx = layer_idx
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.d_model, config.d_model, bias=bias)
        self.k_proj = nn.Linear(config.d_model, config.d_model, bias=bias)
        self.v_proj = nn.Linear(config.d_model, config.d_model, bias=bias)
        self.out_proj = nn.Linear(config.d_model, config.d_model, bias=bias)

    def _split_heads(self, states: torch.Tensor) -> torch.Tensor:
        return states.view(*states.shape[:-1], -1, self.head_dim).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: "EncoderDecoderCache | StaticBeamCache | None" = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        is_cross_attention = key_value_states is not None
        layer_cache = None
        if cache is not None:
            layer_cache = cache.cross_attention_cache if is_cross_attention else cache.self_attention_cache
        if not is_cross_attention:  # the three projections in one product while decoding (`linears`)
            projections = linears((self.q_proj, self.k_proj, self.v_proj), hidden_states)
            query_states, key_states, value_states = map(self._split_heads, projections)  # (B, H, T, Dh)
            if layer_cache is not None:
                key_states, value_states = layer_cache.update(key_states, value_states, self.layer_idx)
        else:
            query_states = self._split_heads(linear(self.q_proj, hidden_states))  # (B, H, Tq, Dh)
            if cache is not None and cache.is_updated.get(self.layer_idx):
                # The encoder output does not change while decoding: reuse its projections.
                key_states = layer_cache.layers[self.layer_idx].keys  # (B, H, S, Dh)
                value_states = layer_cache.layers[self.layer_idx].values
            else:
                key_states = self._split_heads(linear(self.k_proj, key_value_states))  # (B, H, S, Dh)
                value_states = self._split_heads(linear(self.v_proj, key_value_states))
                if layer_cache is not None:
                    key_states, value_states = layer_cache.update(key_states, value_states, self.layer_idx)
                    cache.is_updated[self.layer_idx] = True

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*hidden_states.shape[:-1], -1)  # (B, Tq, D)
        return linear(self.out_proj, attn_output), attn_weights


# --------------------------------------------------------------------------------------------------------------
# Encoder and decoder layers (Sec. 3.1, 3.3)
# --------------------------------------------------------------------------------------------------------------


class TransformerFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (Eq. 2), with the activation taken from the config."""

    def __init__(self, config: TransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_fn(linear(self.fc1, hidden_states))  # (B, T, d_ff)
        hidden_states = apply_dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return linear(self.fc2, hidden_states)  # (B, T, D)


class TransformerEncoderLayer(GradientCheckpointingLayer):
    """Self-attention, then feed-forward; each sublayer is LayerNorm(x + Dropout(Sublayer(x))) (Sec. 3.1, 5.4)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.dropout = config.dropout
        self.self_attn = TransformerAttention(config, config.encoder_attention_heads, is_causal=False)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = TransformerFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attn_output, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = self.self_attn_layer_norm(
            hidden_states + apply_dropout(attn_output, self.dropout, self.training)
        )
        ffn_output = self.ffn(hidden_states)
        return self.final_layer_norm(hidden_states + apply_dropout(ffn_output, self.dropout, self.training))


class TransformerDecoderLayer(GradientCheckpointingLayer):
    """Masked self-attention, attention over the encoder output, then feed-forward, each post-LayerNorm
    (Sec. 3.1: "a third sub-layer, which performs multi-head attention over the output of the encoder stack")."""

    def __init__(self, config: TransformerConfig, layer_idx: int):
        super().__init__()
        self.dropout = config.dropout
        heads = config.decoder_attention_heads
        self.self_attn = TransformerAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = TransformerAttention(config, heads, is_causal=False, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = TransformerFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: "EncoderDecoderCache | StaticBeamCache | None" = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attn_output, _ = self.self_attn(hidden_states, attention_mask=attention_mask, cache=cache, **kwargs)
        hidden_states = self.self_attn_layer_norm(
            hidden_states + apply_dropout(attn_output, self.dropout, self.training)
        )
        attn_output, _ = self.encoder_attn(
            hidden_states,
            key_value_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            cache=cache,
            **kwargs,
        )
        hidden_states = self.encoder_attn_layer_norm(
            hidden_states + apply_dropout(attn_output, self.dropout, self.training)
        )
        ffn_output = self.ffn(hidden_states)
        return self.final_layer_norm(hidden_states + apply_dropout(ffn_output, self.dropout, self.training))


# --------------------------------------------------------------------------------------------------------------
# Stacks and the shared embedding (Sec. 3.1, 3.4)
# --------------------------------------------------------------------------------------------------------------


class TransformerPreTrainedModel(PreTrainedModel):
    config: TransformerConfig
    config_class = TransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TransformerEncoderLayer", "TransformerDecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    def __init__(self, config: TransformerConfig, *inputs, **kwargs):
        # A config changed after it was built (attributes set by hand) never went through `__post_init__`'s checks.
        config.check_values()
        super().__init__(config, *inputs, **kwargs)

    def _init_weights(self, module: nn.Module) -> None:
        """fairseq's initialisation: Xavier-uniform projections with zero biases, N(0, d_model^-0.5) embeddings
        (so that the sqrt(d_model)-scaled embedding has unit variance) with a zero padding row."""
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = self.config.init_std if self.config.init_std is not None else self.config.d_model**-0.5
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, TransformerPositionalEncoding):
            init.copy_(module.table, module.compute_table(module.table.shape[0]))

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained`, refused in one line before anything is written for a model whose
        linear layers torch's dynamic quantisation replaced (`modeling.quantization.quantize_int8`), whose config
        holds a value set by hand that the model cannot be built from, or whose generation config transformers would
        refuse. The generation config is saved without the library defaults that `Seq2SeqTrainer` wrote into it
        (`generate()` says why). The config's `auto_map` names `TransformerModel` for `AutoModel` too: transformers
        writes only the saved class's."""
        self.config.check_values()
        int8_layers = int8_layer_names(self)
        if int8_layers:
            raise ValueError(
                f"cannot save to {save_directory}: {len(int8_layers)} layers ({int8_layers[0]}, ...) hold torch's "
                "packed int8 weights, which safetensors cannot store; save the float model and quantise it again "
                "after loading."
            )
        if hasattr(self, "undo_library_default_fill"):
            self.undo_library_default_fill()
        if self.can_generate():
            self.check_generation_config_savable(save_directory)
        if self._auto_class is not None:  # where transformers writes an auto_map and copies the code at all
            module = TransformerModel.__module__.rsplit(".", 1)[-1]  # as transformers names remote code
            self.config.auto_map = {
                **(getattr(self.config, "auto_map", None) or {}),
                "AutoModel": f"{module}.TransformerModel",
            }
        return super().save_pretrained(save_directory, *args, **kwargs)

    def check_generation_config_savable(self, save_directory: str | os.PathLike) -> None:
        """transformers refuses to save a generation config changed since loading that its strict validation faults
        (greedy decoding, `num_beams = 1`, beside the paper's early stopping and length penalty), but only after
        config.json and the code files are written: refused here first, in one line."""
        config = self.generation_config
        if getattr(config, "_original_object_hash", None) == hash(config):  # unchanged: transformers only warns
            return
        try:
            config.validate(strict=True)
        except ValueError as error:
            raise ValueError(
                f"cannot save to {save_directory}: {' '.join(str(error).split())} Or leave the model's generation "
                "config as it was and pass the setting to generate() (num_beams=1 to generate greedily; "
                "Seq2SeqTrainingArguments(generation_num_beams=1) to evaluate so)."
            ) from None

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        """`PreTrainedModel`'s, refusing a checkpoint whose embeddings do not match `tie_word_embeddings` (an
        override of its config's): tied matrices loaded untied would start the three from random values (the
        checkpoint's one `shared.weight` is dropped as what old untied checkpoints hold unused), untied ones loaded
        tied stay three matrices that transformers leaves untied, under a config that says otherwise and that
        exports and conversions trust. Either came with warnings only, and the model trained and saved on."""
        if not self.config.tie_word_embeddings:
            untied_embeddings_missing = any(key.endswith("embed_tokens.weight") for key in loading_info.missing_keys)
            holds_shared = any(re.search(r"(^|\.)shared\.weight$", key) for key in loading_info.unexpected_keys)
            if untied_embeddings_missing and holds_shared:
                raise ValueError(
                    f"tie_word_embeddings=False, but {self.name_or_path} holds one embedding matrix shared by the "
                    "encoder, the decoder and the output projection (shared.weight): untied, those three would start "
                    "from random values. Load it with tie_word_embeddings=True, as it was saved."
                )
        else:
            stacks = self.base_model
            embeddings = [stacks.encoder.embed_tokens, stacks.decoder.embed_tokens, self.get_output_embeddings()]
            if any(module is not None and module.weight is not stacks.shared.weight for module in embeddings):
                raise ValueError(
                    f"tie_word_embeddings=True, but {self.name_or_path} holds different embedding matrices for the "
                    "encoder, the decoder or the output projection: load it with tie_word_embeddings=False, as it was "
                    "saved."
                )
        super()._adjust_missing_and_unexpected_keys(loading_info)

    def _resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """`PreTrainedModel`'s, which resizes `get_input_embeddings()` and the output projection; untied, the
        decoder's own input embeddings too, their old rows kept, so that the three keep one vocabulary. (Tied,
        `tie_weights` hands the decoder the resized shared matrix.)"""
        embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        stacks = self.base_model
        if isinstance(stacks, TransformerModel) and stacks.shared is None:
            stacks.decoder.embed_tokens = self._get_resized_embeddings(
                stacks.decoder.embed_tokens, embeddings.num_embeddings, mean_resizing=mean_resizing
            )
        return embeddings


def int8_layer_names(model: nn.Module) -> list[str]:
    """The layers of `model` that torch's dynamic quantisation replaced: their int8 weights are packed objects,
    not tensors, so nothing that reads weights (saving, exporting) can take them."""
    quantized = [
        name
        for name, module in model.named_modules()
        if type(module).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized"))
    ]
    # Each replaced layer holds its packed weights in a quantized submodule of its own (`_packed_params`): counted
    # too, the refusals named twice as many layers as were quantised.
    return [name for name in quantized if name.rpartition(".")[0] not in quantized]


def _check_token_ids(input_ids: torch.Tensor, vocab_size: int, name: str) -> None:
    """An id outside the vocabulary would be an IndexError naming no input on CPU and a device assert on GPU."""
    if is_torchdynamo_compiling() or input_ids.numel() == 0:
        return
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name} holds token ids in [{low}, {high}], outside the vocabulary [0, {vocab_size}).")


def _check_mask_shape(mask: torch.Tensor | None, expected: tuple[int, ...], name: str) -> None:
    if mask is not None and not is_torchdynamo_compiling() and tuple(mask.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(expected)}.")


def _check_encoder_states(encoder_hidden_states: torch.Tensor, batch_size: int, d_model: int) -> None:
    """Unchecked, one encoder row silently served every decoder row (broadcast), and other mismatches failed in a
    later product, on oneDNN without naming a shape."""
    if is_torchdynamo_compiling():
        return
    if encoder_hidden_states.dim() != 3:
        raise ValueError(
            f"The encoder output has shape {tuple(encoder_hidden_states.shape)}, expected (batch, length, d_model)."
        )
    if encoder_hidden_states.shape[0] != batch_size:
        raise ValueError(
            f"The decoder input has batch size {batch_size}, the encoder output {encoder_hidden_states.shape[0]}: "
            "decoder_input_ids (or labels, decoder_inputs_embeds) and input_ids (or inputs_embeds, encoder_outputs) "
            "must hold the same sentences."
        )
    if encoder_hidden_states.shape[-1] != d_model:
        raise ValueError(
            f"The encoder output has width {encoder_hidden_states.shape[-1]}, expected d_model ({d_model})."
        )


class TransformerStack(TransformerPreTrainedModel):
    """What the encoder and the decoder share: the embedding of their input."""

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.dropout = config.dropout
        # Sec. 3.4: "In the embedding layers, we multiply those weights by sqrt(d_model)."
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = TransformerPositionalEncoding(config)

    def embed(self, inputs_embeds: torch.Tensor, start: int) -> torch.Tensor:
        """The first layer's input: the token embeddings `inputs_embeds` (B, T, D) scaled by sqrt(d_model)
        (Sec. 3.4), plus the positional encodings of tokens start, ..., start + T - 1 (Sec. 3.5), with dropout on
        the sum (Sec. 5.4). The stacks' forward and generate()'s decoding step (`_decoder_step`) all embed here."""
        positions = self.embed_positions(start, inputs_embeds.shape[1]).to(inputs_embeds.dtype)  # (T, D)
        hidden_states = inputs_embeds * self.embed_scale + positions  # (B, T, D)
        return apply_dropout(hidden_states, p=self.dropout, training=self.training)


class TransformerEncoder(TransformerStack):
    """N identical layers over the scaled token embeddings plus positional encodings."""

    _can_record_outputs = {
        "hidden_states": TransformerEncoderLayer,
        "attentions": TransformerAttention,
    }

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.layers = nn.ModuleList([TransformerEncoderLayer(config) for _ in range(config.encoder_layers)])
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds to the encoder.")
        if inputs_embeds is None:
            _check_token_ids(input_ids, self.config.vocab_size, "input_ids")
            inputs_embeds = self.embed_tokens(input_ids)
        if 0 in inputs_embeds.shape[:2]:  # else a reshape error deep inside attention, naming no input
            raise ValueError(
                f"The encoder got {'inputs_embeds' if input_ids is None else 'input_ids'} of shape "
                f"{tuple(inputs_embeds.shape[:2])}: no source token to encode (an empty batch, or sources of length "
                "0, where the tokenizer gives even an empty line its </s>)."
            )
        _check_mask_shape(attention_mask, inputs_embeds.shape[:2], "attention_mask")

        hidden_states = self.embed(inputs_embeds, start=0)  # (B, T, D)
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)


class TransformerDecoder(TransformerStack):
    """N identical layers; the causal mask keeps position i from attending to later positions (Sec. 3.1)."""

    _can_record_outputs = {
        "hidden_states": TransformerDecoderLayer,
        "attentions": OutputRecorder(TransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(TransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.layers = nn.ModuleList(
            [TransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)]
        )
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of decoder_input_ids and decoder_inputs_embeds to the decoder.")
        if encoder_hidden_states is None:
            raise ValueError("The decoder attends over the encoder output: pass encoder_hidden_states.")
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        cache_length = cache.get_seq_length() if cache is not None else 0

        if inputs_embeds is None:
            if cache_length == 0:  # later steps feed back ids the model itself produced
                _check_token_ids(input_ids, self.config.vocab_size, "decoder_input_ids")
            inputs_embeds = self.embed_tokens(input_ids)
        _check_encoder_states(encoder_hidden_states, inputs_embeds.shape[0], self.config.d_model)
        _check_mask_shape(
            encoder_attention_mask, encoder_hidden_states.shape[:2], "attention_mask (of the encoder input)"
        )

        hidden_states = self.embed(inputs_embeds, start=cache_length)  # (B, T, D)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            cache=cache.self_attention_cache if cache is not None else None,
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, for gradient checkpointing
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                **kwargs,
            )
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, cache=cache)


class TransformerModel(TransformerPreTrainedModel):
    """Encoder and decoder over one embedding matrix shared by both languages (Sec. 3.4), `shared`. Untied
    (`tie_word_embeddings=False`), each stack has its own and there is no `shared` (the config says more)."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }
    # Untied checkpoints saved before `shared` was left out of untied models hold it, trained by nothing.
    _keys_to_ignore_on_load_unexpected = [r"(^|\.)shared\.weight$"]

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        # transformers ties nothing when tie_word_embeddings is off, this tie of the two stacks included.
        self.shared = (
            nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            if config.tie_word_embeddings
            else None
        )
        self.encoder = TransformerEncoder(config)
        self.decoder = TransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        """The module that the encoder looks `input_ids` up in (what `inputs_embeds` stand for): tied, its weight is
        the shared matrix. The encoder's module, not `shared`, as MarianMT's: a hook on it (the Trainer's NEFTune, a
        user's own) must run on the lookup, and `shared` itself looks nothing up."""
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """The shared matrix of both stacks; untied, the encoder's alone (as MarianMT's)."""
        if self.shared is None:
            self.encoder.embed_tokens = value
            return
        self.shared = value
        self.encoder.embed_tokens = value
        self.decoder.embed_tokens = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif torch.is_tensor(encoder_outputs):  # indexed as a tuple, it would give its first sentence's states
            raise TypeError(
                "encoder_outputs is a tensor: pass the encoder's output (a BaseModelOutput or a tuple), or wrap "
                "the states: encoder_outputs=(encoder_hidden_states,)"
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


# --------------------------------------------------------------------------------------------------------------
# Training loss: cross-entropy with label smoothing (Sec. 5.4), fused with the output projection
# --------------------------------------------------------------------------------------------------------------

# The fused loss computes the logits of at most this many (row, token) pairs at once: 64 MiB in float32.
LOSS_CHUNK_ELEMENTS = 2**24


class LinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of the logits `hidden_states @ weight.T` against `labels`, with label smoothing ε
    spread uniformly over the vocabulary: the value and gradients of
    `F.cross_entropy(hidden_states @ weight.T, labels, reduction="sum", label_smoothing=ε)`, computed chunk by
    chunk of rows so that the (N, V) logits are never held whole. Each chunk's gradient is taken in the forward
    pass, while its logits are at hand; backward only scales it. This spares the passes that log-softmax, its
    backward and the gradient buffers of the unfused loss make over the full logits.
    """

    @staticmethod
    def forward(
        ctx, hidden_states: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, smoothing_epsilon: float
    ) -> torch.Tensor:
        # hidden_states (N, D), weight (V, D), labels (N,) in [0, V)
        vocab_size = weight.shape[0]
        rows_per_chunk = max(1, LOSS_CHUNK_ELEMENTS // vocab_size)
        loss = torch.zeros((), dtype=torch.float32, device=hidden_states.device)
        grad_hidden_states = torch.empty_like(hidden_states)
        grad_weight = None
        for start in range(0, hidden_states.shape[0], rows_per_chunk):
            hidden = hidden_states[start : start + rows_per_chunk]  # (C, D)
            target = labels[start : start + rows_per_chunk, None]  # (C, 1)
            logits = matmul_transposed(hidden, weight).float()  # (C, V)
            target_logits = logits.gather(1, target)  # (C, 1)
            mean_logits = logits.mean(dim=-1, keepdim=True)  # (C, 1)
            max_logits = logits.amax(dim=-1, keepdim=True)  # (C, 1)
            # From here on, in place: the chunk's logits become exp(logits - max), then the gradient.
            unnormalized = logits.sub_(max_logits).exp_()  # (C, V)
            normalizer = unnormalized.sum(dim=-1, keepdim=True)  # (C, 1)
            log_normalizer = normalizer.log() + max_logits  # (C, 1)
            # -sum_j q_j log p_j with q = (1 - ε) one-hot(target) + ε / V
            loss += (log_normalizer - (1 - smoothing_epsilon) * target_logits - smoothing_epsilon * mean_logits).sum()
            # d loss / d logits = p - q
            grad_logits = unnormalized.div_(normalizer)  # (C, V)
            if smoothing_epsilon:
                grad_logits.sub_(smoothing_epsilon / vocab_size)
            grad_logits.scatter_add_(1, target, grad_logits.new_full(target.shape, smoothing_epsilon - 1))
            grad_logits = grad_logits.to(weight.dtype)
            grad_hidden_states[start : start + rows_per_chunk] = matmul_transposed(grad_logits, weight.T)  # (C, D)
            grad_weight_chunk = matmul_transposed(grad_logits.T, hidden.T)  # (V, D)
            # Summed in float32 across chunks, so that bf16 weights round once, as in the unfused loss.
            grad_weight = grad_weight_chunk.float() if grad_weight is None else grad_weight.add_(grad_weight_chunk)
        if grad_weight is None:  # no labelled position
            grad_weight = torch.zeros_like(weight)
        ctx.save_for_backward(grad_hidden_states, grad_weight.to(weight.dtype))
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        grad_hidden_states, grad_weight = ctx.saved_tensors
        return grad_hidden_states * grad_loss, grad_weight * grad_loss, None, None


def shift_tokens_right(
    labels: torch.Tensor, pad_token_id: int | None, decoder_start_token_id: int | None
) -> torch.Tensor:
    """Decoder inputs for teacher forcing: the start token, then the labels without their last position."""
    if pad_token_id is None:
        raise ValueError(
            "config.pad_token_id has to be defined to make decoder inputs from labels (it fills their -100)."
        )
    if decoder_start_token_id is None:
        raise ValueError("config.decoder_start_token_id has to be defined to make decoder inputs from labels.")
    decoder_input_ids = labels.new_full(labels.shape, pad_token_id)
    decoder_input_ids[:, 1:] = labels[:, :-1]
    decoder_input_ids[:, 0] = decoder_start_token_id
    return decoder_input_ids.masked_fill(decoder_input_ids == -100, pad_token_id)


class TransformerForConditionalGeneration(TransformerPreTrainedModel, TransformerGenerationMixin):
    """The translation model: the pre-softmax projection shares the embedding matrix (Sec. 3.4); `generate()` decodes
    as the paper (Sec. 6.1, `TransformerGenerationMixin`)."""

    _tied_weights_keys = {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.model = TransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        set_paper_decoding(self.generation_config)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        smoothing_epsilon: float = 0.0,
        skip_logits: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput | tuple[torch.Tensor, ...]:
        r"""
        inputs_embeds, decoder_inputs_embeds: token embeddings as `get_input_embeddings()` gives them; the model
            scales them by sqrt(d_model) as it scales its own lookups (MarianMT takes them already scaled).
        labels: target ids, -100 where no loss is taken. Without `decoder_input_ids`, the decoder is fed the labels
            shifted right behind `decoder_start_token_id`.
        num_items_in_batch: the number of labelled tokens in the whole (accumulated, all-process) batch, passed by
            the Trainer. The loss is then a sum divided by it, so that gradient accumulation and several processes
            give the gradient of one big batch; without it, the loss is the mean over this batch's tokens.
        smoothing_epsilon: ε_ls of Sec. 5.4's label smoothing (the paper: 0.1): the loss is the cross-entropy
            against the target smoothed by ε_ls spread uniformly over the vocabulary, as transformers'
            `LabelSmoother` computes it, but in one fused kernel instead of several passes over the (B, T, V)
            log-probabilities. (Not called `label_smoothing`: the Trainer takes every forward argument whose name
            holds "label" for a label, and would then compute no evaluation loss without it.)
        skip_logits: compute the loss from the decoder output without materialising the (B, T, V) logits
            (`LinearCrossEntropy`: the output projection and the loss fused, on labelled positions only), and
            return `logits=None`. By default (`None`) this is done on CPU when training with labels and gradients
            on, where the Trainer reads only the loss, except under torch.compile or torch.func and when `lm_head` is
            not a plain bias-free `nn.Linear` without hooks; pass `False` to get the logits with the loss then (and
            for second derivatives: the fused loss has a first one only). Off the CPU
            (measured on a CUDA GPU) the default is the plain loss, the faster there; `True` takes the fused one, for
            its memory. With `return_dict=False` the default keeps the logits: the tuple is (loss, logits, ...), as
            MarianMT's (a tuple drops what is None, and the encoder's states would take the logits' place).
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if skip_logits is None:
            # Not under torch.compile, which fuses the plain loss itself and cannot trace the fused one's
            # data-dependent number of labelled positions in a full graph. Not on GPUs: on an H200 the plain
            # loss's CUDA kernels made the bf16 step of base 1.4x faster, of big 1.2x, at 1.6-2.3x the peak memory,
            # about Marian's (benchmarks/investigations/gpu_training_step.py, docs/results.md).
            skip_logits = (
                labels is not None
                and return_dict
                and self.training
                and torch.is_grad_enabled()
                and not is_torchdynamo_compiling()
                and not functorch_active()  # torch.func cannot run an autograd function without setup_context
                and self._lm_head_is_plain_linear()
                and self.lm_head.weight.device.type == "cpu"
            )
        elif skip_logits and labels is None:
            raise ValueError("skip_logits=True returns only the loss: pass labels.")
        elif skip_logits and not self._lm_head_is_plain_linear():
            raise ValueError(
                f"skip_logits=True fuses the loss with lm_head's weight, which would bypass this lm_head "
                f"({type(self.lm_head).__name__}: a subclass or wrapper, a bias or hooks); pass skip_logits=False."
            )
        if labels is not None and not 0 <= smoothing_epsilon <= 1:  # F.cross_entropy's check, for the fused loss too
            raise ValueError(f"smoothing_epsilon must be between 0 and 1, got {smoothing_epsilon}.")
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)

        outputs: Seq2SeqModelOutput = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state  # (B, T, D)
        logits = None if skip_logits else self.project_to_vocabulary(hidden_states)  # (B, T, V)

        loss = None
        if labels is not None:
            labels = labels.to(hidden_states.device)
            labelled = labels.ne(-100)  # (B, T)
            if skip_logits:
                loss = LinearCrossEntropy.apply(
                    hidden_states[labelled], self.lm_head.weight, labels[labelled], smoothing_epsilon
                )
            else:
                loss = F.cross_entropy(
                    logits.float().reshape(-1, logits.shape[-1]),
                    labels.reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                    label_smoothing=smoothing_epsilon,
                )
            denominator = num_items_in_batch if num_items_in_batch is not None else labelled.sum()
            loss = loss / (denominator.to(loss.device) if torch.is_tensor(denominator) else denominator)

        output = Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )
        return output if return_dict else output.to_tuple()

    def project_to_vocabulary(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The pre-softmax projection by the shared embedding matrix (Sec. 3.4): (..., D) -> (..., V) logits."""
        return linear(self.lm_head, hidden_states)

    def _lm_head_is_plain_linear(self) -> bool:
        """The fused loss multiplies by `lm_head.weight` itself: only right for a bias-free `nn.Linear` with no
        hooks, never for an adapter, a quantised layer or a hook that the projection's forward would run."""
        return is_plain_linear(self.lm_head) and self.lm_head.bias is None

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


__all__ = ["TransformerPreTrainedModel", "TransformerModel", "TransformerForConditionalGeneration"]
