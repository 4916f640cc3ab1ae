"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

Read top to bottom, this file follows the paper: positional encodings (Sec. 3.5), multi-head attention
(Sec. 3.2), the post-LayerNorm encoder and decoder layers (Sec. 3.1, 3.3), the stacks with one shared,
scaled embedding matrix (Sec. 3.4), and the translation model with the paper's beam search (Sec. 6.1).

This file travels with every checkpoint as remote code: it imports only torch, transformers and the
configuration beside it.
"""

import copy
import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F
from transformers import (
    GenerationConfig,
    GenerationMixin,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    StoppingCriteriaList,
)
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import logits_process
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    ModelOutput,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, is_torchdynamo_compiling
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs
from transformers.utils.versions import require_version

from .configuration_transformer import TransformerConfig

# Releases before 5.24 import this file, but their masking and generation code names the cache `past_key_values`
# where this file passes `cache`: the first forward pass would fail deep inside. Say so at import instead.
require_version("transformers>=5.24", "this model's code follows transformers 5.24: pip install 'transformers>=5.24'")

LENGTH_PENALTY_TYPES = ("gnmt", "transformers")
PAPER_DECODING_FIELDS = ("length_penalty_type", "max_length_offset")


# --------------------------------------------------------------------------------------------------------------
# Positional encoding (Sec. 3.5)
# --------------------------------------------------------------------------------------------------------------


def sinusoidal_positional_encoding(positions: torch.Tensor, d_model: int, layout: str) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    `layout="interleaved"` places the pair (sin, cos) of frequency i at dimensions (2i, 2i+1), as the formula
    reads; `"concatenated"` places all sines first, then all cosines (tensor2tensor, fairseq, Marian).
    Computed in float64, then rounded to float32, so that both layouts match other implementations bit for bit.
    """
    frequency_exponents = torch.arange(0, d_model, 2, dtype=torch.float64) / d_model  # (D/2,)
    angles = positions.to(torch.float64)[:, None] / torch.pow(10000.0, frequency_exponents)[None, :]  # (T, D/2)
    if layout == "interleaved":
        table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (T, D)
    else:
        table = torch.cat((angles.sin(), angles.cos()), dim=-1)  # (T, D)
    return table.to(torch.float32)


class TransformerPositionalEncoding(nn.Module):
    """Fixed sinusoids, not learned and not saved: the table is a non-persistent buffer, refilled by
    `_init_weights` after `from_pretrained` builds the model on the meta device."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.d_model = config.d_model
        self.layout = config.positional_encoding_layout
        self.register_buffer("table", self.compute_table(config.max_position_embeddings), persistent=False)

    def compute_table(self, num_positions: int, start: int = 0) -> torch.Tensor:
        positions = torch.arange(start, start + num_positions)
        return sinusoidal_positional_encoding(positions, self.d_model, self.layout)

    def forward(self, start: int, length: int) -> torch.Tensor:
        """Encodings of positions start, ..., start + length - 1: (T, D)."""
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
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        is_cross_attention = key_value_states is not None
        query_states = self._split_heads(self.q_proj(hidden_states))  # (B, H, Tq, Dh)

        layer_cache = None
        if cache is not None:
            layer_cache = cache.cross_attention_cache if is_cross_attention else cache.self_attention_cache
        if is_cross_attention and cache is not None and cache.is_updated.get(self.layer_idx):
            # The encoder output does not change while decoding: reuse its projections.
            key_states = layer_cache.layers[self.layer_idx].keys
            value_states = layer_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross_attention else hidden_states
            key_states = self._split_heads(self.k_proj(source))  # (B, H, Tk, Dh)
            value_states = self._split_heads(self.v_proj(source))  # (B, H, Tk, Dh)
            if layer_cache is not None:
                key_states, value_states = layer_cache.update(key_states, value_states, self.layer_idx)
                if is_cross_attention:
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
        return self.out_proj(attn_output), attn_weights


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
        hidden_states = self.activation_fn(self.fc1(hidden_states))  # (B, T, d_ff)
        hidden_states = apply_dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)  # (B, T, D)


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
        cache: EncoderDecoderCache | None = None,
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


def _check_token_ids(input_ids: torch.Tensor, vocab_size: int, name: str) -> None:
    """An id outside the vocabulary would be a silent wrong lookup on CPU and a device assert on GPU."""
    if is_torchdynamo_compiling() or input_ids.numel() == 0:
        return
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name} holds token ids in [{low}, {high}], outside the vocabulary [0, {vocab_size}).")


def _check_mask_shape(mask: torch.Tensor | None, expected: tuple[int, ...], name: str) -> None:
    if mask is not None and not is_torchdynamo_compiling() and tuple(mask.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(expected)}.")


class TransformerEncoder(TransformerPreTrainedModel):
    """N identical layers over the scaled token embeddings plus positional encodings."""

    _can_record_outputs = {
        "hidden_states": TransformerEncoderLayer,
        "attentions": TransformerAttention,
    }

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.dropout = config.dropout
        # Sec. 3.4: "In the embedding layers, we multiply those weights by sqrt(d_model)."
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = TransformerPositionalEncoding(config)
        self.layers = nn.ModuleList([TransformerEncoderLayer(config) for _ in range(config.encoder_layers)])
        self.gradient_checkpointing = False
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
        _check_mask_shape(attention_mask, inputs_embeds.shape[:2], "attention_mask")

        # Sec. 3.5 and 5.4: dropout on the sum of the embeddings and the positional encodings.
        positions = self.embed_positions(0, inputs_embeds.shape[1]).to(inputs_embeds.dtype)  # (T, D)
        hidden_states = inputs_embeds * self.embed_scale + positions  # (B, T, D)
        hidden_states = apply_dropout(hidden_states, p=self.dropout, training=self.training)

        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)


class TransformerDecoder(TransformerPreTrainedModel):
    """N identical layers; the causal mask keeps position i from attending to later positions (Sec. 3.1)."""

    _can_record_outputs = {
        "hidden_states": TransformerDecoderLayer,
        "attentions": OutputRecorder(TransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(TransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.dropout = config.dropout
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = TransformerPositionalEncoding(config)
        self.layers = nn.ModuleList(
            [TransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)]
        )
        self.gradient_checkpointing = False
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
        batch_size, target_length = inputs_embeds.shape[:2]
        _check_mask_shape(
            encoder_attention_mask, encoder_hidden_states.shape[:2], "attention_mask (of the encoder input)"
        )

        positions = self.embed_positions(cache_length, target_length).to(inputs_embeds.dtype)  # (T, D)
        hidden_states = inputs_embeds * self.embed_scale + positions  # (B, T, D)
        hidden_states = apply_dropout(hidden_states, p=self.dropout, training=self.training)

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
    """Encoder and decoder over one embedding matrix shared by both languages (Sec. 3.4)."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = TransformerEncoder(config)
        self.decoder = TransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
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
            logits = (hidden @ weight.T).float()  # (C, V)
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
            grad_hidden_states[start : start + rows_per_chunk] = grad_logits @ weight  # (C, D)
            grad_weight_chunk = grad_logits.T @ hidden  # (V, D)
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


# --------------------------------------------------------------------------------------------------------------
# Decoding as in the paper (Sec. 6.1): beam 4, length penalty alpha = 0.6, max length = input length + 50
# --------------------------------------------------------------------------------------------------------------


class GNMTLengthPenalty(float):
    """alpha of the GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016), used by the paper.

    transformers' beam search ranks a finished hypothesis by `sum_logprobs / (length ** length_penalty)`, where
    `length` is a Python int. An int cannot raise itself to this float subclass, so Python calls `__rpow__`,
    which evaluates the GNMT penalty in place of `length ** alpha`; everything else treats it as alpha.
    """

    def __rpow__(self, length: int) -> float:
        return ((5 + length) / 6) ** float(self)


class PerSentenceMaxLengthLogitsProcessor(LogitsProcessor):
    """Forces end-of-sentence once a hypothesis holds `max_lengths[i]` tokens, so that each sentence stops at
    its own limit rather than the batch's longest (Sec. 6.1: "maximum output length to input length + 50")."""

    def __init__(self, max_lengths: torch.Tensor, eos_token_id: int):
        self.max_lengths = max_lengths  # (B,)
        self.eos_token_id = eos_token_id

    def for_sentences(self, sentences: torch.Tensor) -> "PerSentenceMaxLengthLogitsProcessor":
        """The same limits for a batch that keeps only `sentences` (indices into this one's)."""
        return PerSentenceMaxLengthLogitsProcessor(
            self.max_lengths[sentences.to(self.max_lengths.device)], self.eos_token_id
        )

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows_per_sentence = input_ids.shape[0] // self.max_lengths.shape[0]  # beams or returned sequences
        limits = self.max_lengths.to(input_ids.device).repeat_interleave(rows_per_sentence)  # (B * K,)
        # input_ids holds the decoder start token plus the tokens generated so far.
        at_limit = input_ids.shape[1] >= limits  # (B * K,)
        if not at_limit.any():  # most steps: spare three passes over the (B * K, V) scores
            return scores
        forced = torch.full_like(scores, -math.inf)
        forced[:, self.eos_token_id] = 0.0
        return torch.where(at_limit[:, None], forced, scores)


# Beam search steps see each row alone with these, so dropping other sentences from the batch changes nothing for
# the rows that stay. Anything else (sampling, processors with per-batch state) takes transformers' own loop.
ROW_WISE_LOGITS_PROCESSORS = (
    PerSentenceMaxLengthLogitsProcessor,
    logits_process.MinLengthLogitsProcessor,
    logits_process.MinNewTokensLengthLogitsProcessor,
    logits_process.TemperatureLogitsWarper,
    logits_process.RepetitionPenaltyLogitsProcessor,
    logits_process.NoRepeatNGramLogitsProcessor,
    logits_process.SequenceBiasLogitsProcessor,
    logits_process.ForcedBOSTokenLogitsProcessor,
    logits_process.ForcedEOSTokenLogitsProcessor,
    logits_process.InfNanRemoveLogitsProcessor,
    logits_process.LogitNormalization,
    logits_process.SuppressTokensAtBeginLogitsProcessor,
    logits_process.SuppressTokensLogitsProcessor,
)
ROW_WISE_STOPPING_CRITERIA = (MaxLengthCriteria, MaxTimeCriteria, EosTokenCriteria)


# What generate() hands the decoding loop per row of the batch (besides the cache); any other tensor takes
# transformers' own loop, since the batch could not be cut safely.
PER_ROW_GENERATION_KWARGS = ("attention_mask", "decoder_attention_mask", "encoder_outputs")


def select_rows(model_kwargs: dict, rows: torch.Tensor, self_attention_rows: torch.Tensor) -> dict:
    """`model_kwargs` for another batch made of the rows `rows` of this one (a row may be taken several times);
    the self-attention cache, which beam search also reorders, takes `self_attention_rows`."""

    def select(value):
        if isinstance(value, torch.Tensor):
            return value.index_select(0, rows)
        if isinstance(value, ModelOutput):
            return type(value)(**{name: select(field) for name, field in value.items()})
        if isinstance(value, tuple):
            return tuple(select(item) for item in value)
        return value

    selected = dict(model_kwargs)
    for name in PER_ROW_GENERATION_KWARGS:
        if name in selected:
            selected[name] = select(selected[name])
    cache = selected["cache"]
    cache.self_attention_cache.reorder_cache(self_attention_rows)
    cache.cross_attention_cache.reorder_cache(rows)
    return selected


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs for teacher forcing: the start token, then the labels without their last position."""
    decoder_input_ids = labels.new_full(labels.shape, pad_token_id)
    decoder_input_ids[:, 1:] = labels[:, :-1]
    decoder_input_ids[:, 0] = decoder_start_token_id
    return decoder_input_ids.masked_fill(decoder_input_ids == -100, pad_token_id)


class TransformerForConditionalGeneration(TransformerPreTrainedModel, GenerationMixin):
    """The translation model: the pre-softmax projection shares the embedding matrix (Sec. 3.4)."""

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
        # Sec. 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ... maximum output length
        # to input length + 50, but terminate early when possible".
        self.generation_config.num_beams = 4
        self.generation_config.length_penalty = 0.6
        self.generation_config.early_stopping = True
        self.generation_config.length_penalty_type = "gnmt"
        self.generation_config.max_length_offset = 50
        # These settings are the model's own, not copies of config.json: keep them when saved and loaded.
        self.generation_config._from_model_config = False

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

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
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        smoothing_epsilon: float = 0.0,
        skip_logits: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
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
            return `logits=None`. By default (`None`) this is done when training with labels and gradients on,
            where the Trainer reads only the loss, except under torch.compile and when `lm_head` is not a plain
            bias-free `nn.Linear` without hooks; pass `False` to get the logits with the loss then.
        """
        if skip_logits is None:
            # Not under torch.compile, which fuses the plain loss itself and cannot trace the fused one's
            # data-dependent number of labelled positions in a full graph.
            skip_logits = (
                labels is not None
                and self.training
                and torch.is_grad_enabled()
                and not is_torchdynamo_compiling()
                and self._lm_head_is_plain_linear()
            )
        elif skip_logits and labels is None:
            raise ValueError("skip_logits=True returns only the loss: pass labels.")
        elif skip_logits and not self._lm_head_is_plain_linear():
            raise ValueError(
                f"skip_logits=True fuses the loss with lm_head's weight, which would bypass this lm_head "
                f"({type(self.lm_head).__name__}: a subclass or wrapper, a bias or hooks); pass skip_logits=False."
            )
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
        logits = None if skip_logits else self.lm_head(hidden_states)  # (B, T, V)

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

        return Seq2SeqLMOutput(
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

    def _lm_head_is_plain_linear(self) -> bool:
        """The fused loss multiplies by `lm_head.weight` itself: only right for a bias-free `nn.Linear` with no
        hooks, never for an adapter, a quantised layer or a hook that the projection's forward would run."""
        head = self.lm_head
        return (
            type(head) is nn.Linear and head.bias is None and not head._forward_hooks and not head._forward_pre_hooks
        )

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        **kwargs,
    ):
        """`GenerationMixin.generate` with the paper's decoding (Sec. 6.1), as the generation config asks:

        - `max_length_offset` (default 50): each sentence's output holds at most its source length plus this many
          tokens, end-of-sentence included; `None` turns the limit off. A `max_length` or `max_new_tokens`
          given here or saved in the generation config still caps the whole batch.
        - `length_penalty_type`: `"gnmt"` (default) ranks finished beams by log P(Y) / ((5 + |Y|) / 6) ** alpha;
          `"transformers"` keeps the library's log P(Y) / |Y| ** alpha.
        Both may also be passed as keyword arguments, like any generation parameter.
        """
        base_config = generation_config if generation_config is not None else self.generation_config
        unknown_to_config = {
            name: kwargs.pop(name)
            for name in PAPER_DECODING_FIELDS
            if name in kwargs and not hasattr(base_config, name)
        }
        if unknown_to_config:  # a user's own GenerationConfig without our fields: carry them on a copy
            generation_config = copy.deepcopy(base_config)
            for name, value in unknown_to_config.items():
                setattr(generation_config, name, value)
            base_config = generation_config

        def setting(name: str, default):
            return kwargs.get(name, getattr(base_config, name, default))

        num_beams = setting("num_beams", 1)
        if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
            # transformers itself fails with a ZeroDivisionError (0) or a negative tensor size (-1)
            raise ValueError(f"num_beams must be a positive integer, got {num_beams!r}.")
        penalty_type = setting("length_penalty_type", "transformers")
        if penalty_type not in LENGTH_PENALTY_TYPES:
            raise ValueError(f"Unknown length_penalty_type {penalty_type!r}; expected one of {LENGTH_PENALTY_TYPES}.")
        offset = setting("max_length_offset", None)
        source_lengths = self._source_lengths(inputs, kwargs) if offset is not None else None
        if source_lengths is not None:
            eos_token_id = setting("eos_token_id", self.config.eos_token_id)
            eos_token_id = eos_token_id[0] if isinstance(eos_token_id, list) else eos_token_id
            logits_processor = LogitsProcessorList(logits_processor or [])
            max_lengths = source_lengths + offset
            logits_processor.append(PerSentenceMaxLengthLogitsProcessor(max_lengths, eos_token_id))
            if not self._length_cap_given(base_config, kwargs):
                kwargs["max_new_tokens"] = int(max_lengths.max())
        return super().generate(
            inputs, generation_config=generation_config, logits_processor=logits_processor, **kwargs
        )

    @staticmethod
    def _length_cap_given(generation_config: GenerationConfig, kwargs: dict) -> bool:
        """Whether the caller or the saved generation config set a length for the whole batch."""
        if kwargs.get("max_new_tokens") is not None or kwargs.get("max_length") is not None:
            return True
        return generation_config.max_new_tokens is not None or generation_config.max_length is not None

    def _source_lengths(self, inputs: torch.Tensor | None, kwargs: dict) -> torch.Tensor | None:
        """Real (non-padding) source lengths, (B,), from the attention mask or the input ids."""
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is not None:
            return attention_mask.sum(dim=-1)
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        if input_ids is not None:
            return input_ids.ne(self.config.pad_token_id).sum(dim=-1)
        encoder_outputs = kwargs.get("encoder_outputs")
        if encoder_outputs is not None:
            hidden = encoder_outputs[0]
            return torch.full((hidden.shape[0],), hidden.shape[1], device=hidden.device)
        return None

    def _reorder_cache(self, cache: EncoderDecoderCache, beam_idx: torch.LongTensor) -> EncoderDecoderCache:
        """Beam search keeps the surviving hypotheses: only their self-attention keys and values move. Beams only
        ever move within their own sentence, whose rows hold identical encoder keys and values, so reordering the
        cross-attention cache (half of the work transformers would do) changes nothing and is skipped."""
        cache.self_attention_cache.reorder_cache(beam_idx)
        return cache

    def _beam_search(
        self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False, **model_kwargs
    ):
        if getattr(generation_config, "length_penalty_type", "transformers") == "gnmt":
            generation_config = copy.copy(generation_config)
            generation_config.length_penalty = GNMTLengthPenalty(generation_config.length_penalty)
        can_drop_finished = not (
            synced_gpus
            or generation_config.do_sample
            or generation_config.return_dict_in_generate
            or not isinstance(model_kwargs.get("cache"), EncoderDecoderCache)
            or any(
                isinstance(value, (torch.Tensor, ModelOutput)) and name not in PER_ROW_GENERATION_KWARGS
                for name, value in model_kwargs.items()
            )
            or not all(isinstance(p, ROW_WISE_LOGITS_PROCESSORS) for p in logits_processor)
            or not all(isinstance(c, ROW_WISE_STOPPING_CRITERIA) for c in stopping_criteria)
        )
        if not can_drop_finished:
            return super()._beam_search(
                input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, **model_kwargs
            )
        return self._beam_search_dropping_finished(
            input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs
        )

    def _beam_search_dropping_finished(
        self,
        input_ids: torch.LongTensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        **model_kwargs,
    ) -> torch.LongTensor:
        """transformers' beam search, step for step (its own step functions), except that a sentence leaves the
        batch once its result is final, as CTranslate2 does: a batch then costs the sum of its sentences' lengths
        rather than its longest sentence's length times its size. The outputs are the library loop's.

        A sentence's result is final once transformers' loop would no longer change it: all its `num_beams`
        finished hypotheses are in with `early_stopping=True`, or no running beam can beat the worst of them.
        `input_ids` holds B sentences × K beams, (B·K, prompt length); the state below is (b, K, ...) for the b
        sentences still running, `sentences` holding their positions in the batch.
        """
        num_beams = generation_config.num_beams
        length_penalty, early_stopping = generation_config.length_penalty, generation_config.early_stopping
        max_length = generation_config.max_length
        pad_token_id, eos_token_id = generation_config._pad_token_tensor, generation_config._eos_token_tensor
        batch_size = input_ids.shape[0] // num_beams
        prompt_length = cur_len = input_ids.shape[1]
        device = input_ids.device

        # As transformers: keep 2K candidates per sentence so that K can run on when some end, and fill unused
        # positions the same way.
        candidates_per_sentence = max(2, 1 + (eos_token_id.shape[0] if eos_token_id is not None else 0)) * num_beams
        is_top_k_candidate = torch.arange(candidates_per_sentence, device=device) < num_beams
        fill_value = pad_token_id or eos_token_id[0] if eos_token_id is not None else -1

        running_sequences = torch.full(
            (batch_size, num_beams, max_length), fill_value, dtype=torch.long, device=device
        )
        running_sequences[:, :, :cur_len] = input_ids.view(batch_size, num_beams, -1)
        running_beam_scores = torch.zeros((batch_size, num_beams), device=device)  # (b, K)
        running_beam_scores[:, 1:] = -1e9  # every beam starts as the same prefix: expand only the first
        running_beam_indices = torch.full(
            (batch_size, num_beams, max_length - cur_len), -1, dtype=torch.int32, device=device
        )
        finished_sequences, finished_beam_indices = running_sequences.clone(), running_beam_indices.clone()
        finished_scores = torch.full((batch_size, num_beams), -1e9, device=device)
        is_finished = torch.zeros((batch_size, num_beams), dtype=torch.bool, device=device)
        can_improve = torch.ones((batch_size, 1), dtype=torch.bool, device=device)
        sentences = torch.arange(batch_size, device=device)
        results = (finished_sequences.clone(), finished_beam_indices.clone())  # every sentence's, once final

        # All K beams of a sentence start from the same prefix: the first step runs on one of them, and its caches
        # and logits are then copied to the others (at this step the cross-attention keys and values are computed).
        first_beams = torch.arange(batch_size, device=device) * num_beams  # (B,)
        model_kwargs = select_rows(model_kwargs, first_beams, first_beams)
        model_outputs = self._prefill(input_ids[first_beams], generation_config, model_kwargs)
        model_kwargs = self._update_model_kwargs_for_generation(model_outputs, model_kwargs, is_encoder_decoder=True)
        every_beam = torch.arange(batch_size, device=device).repeat_interleave(num_beams)  # (B·K,)
        model_kwargs = select_rows(model_kwargs, every_beam, every_beam)
        logits = model_outputs.logits[:, -1, :].to(dtype=torch.float32).index_select(0, every_beam)  # (B·K, V)
        del model_outputs
        while True:
            flat_sequences = running_sequences[:, :, :cur_len].flatten(0, 1)  # (b·K, cur_len)
            log_probs = logits_processor(flat_sequences, F.log_softmax(logits, dim=-1))
            running = len(sentences)
            log_probs = (log_probs.view(running, num_beams, -1) + running_beam_scores[:, :, None]).view(running, -1)

            candidate_scores, candidate_sequences, candidate_beam_indices = self._get_top_k_continuations(
                accumulated_log_probs=log_probs,
                running_sequences=running_sequences,
                running_beam_indices=running_beam_indices,
                cur_len=cur_len,
                decoder_prompt_len=prompt_length,
                do_sample=False,
                beams_to_keep=candidates_per_sentence,
                num_beams=num_beams,
                batch_size=running,
            )
            candidate_ends = stopping_criteria(candidate_sequences[:, :, : cur_len + 1].flatten(0, 1), None)
            candidate_ends = candidate_ends.view(running, candidates_per_sentence)
            running_sequences, running_beam_scores, running_beam_indices = self._get_running_beams_for_next_iteration(
                candidate_scores, candidate_sequences, candidate_beam_indices, candidate_ends, num_beams
            )
            finished_sequences, finished_scores, finished_beam_indices, is_finished = self._update_finished_beams(
                sequences=finished_sequences,
                topk_running_sequences=candidate_sequences,
                beam_scores=finished_scores,
                topk_log_probs=candidate_scores,
                beam_indices=finished_beam_indices,
                topk_running_beam_indices=candidate_beam_indices,
                is_early_stop_heuristic_unsatisfied=can_improve,
                is_sent_finished=is_finished,
                next_token_hits_stopping_criteria=candidate_ends,
                top_num_beam_mask=is_top_k_candidate,
                num_beams=num_beams,
                cur_len=cur_len,
                decoder_prompt_len=prompt_length,
                length_penalty=length_penalty,
                early_stopping=early_stopping,
            )
            beam_rows = running_beam_indices[:, :, cur_len - prompt_length].flatten().long()  # (b·K,) rows kept
            cur_len += 1
            can_improve = self._check_early_stop_heuristic(
                can_improve,
                running_beam_scores,
                finished_scores,
                is_finished,
                cur_len,
                max_length,
                prompt_length,
                early_stopping,
                length_penalty,
            )

            final = ~can_improve[:, 0] | (is_finished.all(dim=-1) & (early_stopping is True))  # (b,)
            if candidate_ends.all() or final.all():
                results[0][sentences], results[1][sentences] = finished_sequences, finished_beam_indices
                break
            if final.any():
                results[0][sentences[final]] = finished_sequences[final]
                results[1][sentences[final]] = finished_beam_indices[final]
                stay = (~final).nonzero().squeeze(-1)  # (b',)
                rows = (stay[:, None] * num_beams + torch.arange(num_beams, device=device)).flatten()  # (b'·K,)
                sentences = sentences[stay]
                running_sequences, running_beam_scores = running_sequences[stay], running_beam_scores[stay]
                running_beam_indices, finished_scores = running_beam_indices[stay], finished_scores[stay]
                finished_sequences, finished_beam_indices = finished_sequences[stay], finished_beam_indices[stay]
                is_finished, can_improve = is_finished[stay], can_improve[stay]
                # rows of the batch before the removal: the self-attention cache is reordered and cut in one go
                beam_rows = beam_rows.view(-1, num_beams)[stay].flatten()
                model_kwargs = select_rows(model_kwargs, rows, beam_rows)
                logits_processor = LogitsProcessorList(
                    p.for_sentences(stay) if isinstance(p, PerSentenceMaxLengthLogitsProcessor) else p
                    for p in logits_processor
                )
            else:
                model_kwargs["cache"] = self._reorder_cache(model_kwargs["cache"], beam_rows)

            flat_sequences = running_sequences[:, :, :cur_len].flatten(0, 1)
            model_inputs = self.prepare_inputs_for_generation(flat_sequences, next_sequence_length=1, **model_kwargs)
            model_outputs = self(**model_inputs, return_dict=True)
            model_kwargs = self._update_model_kwargs_for_generation(
                model_outputs, model_kwargs, is_encoder_decoder=True
            )
            logits = model_outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)  # (b·K, V)
            del model_outputs

        # As transformers: the best `num_return_sequences` of each sentence, cut to the longest of them.
        num_return = generation_config.num_return_sequences
        sequences = results[0][:, :num_return].flatten(0, 1)
        generated_length = (results[1][:, :num_return].flatten(0, 1) >= 0).sum(dim=1).max()
        return sequences[:, : prompt_length + generated_length]


__all__ = [
    "TransformerPreTrainedModel",
    "TransformerModel",
    "TransformerForConditionalGeneration",
    "GNMTLengthPenalty",
]
