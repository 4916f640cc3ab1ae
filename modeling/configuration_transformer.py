"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

This file travels with every checkpoint as remote code: it imports nothing from the rest of the project.
Field names follow Marian/BART so that Hugging Face tools (caches, `get_text_config`, pipelines) size
themselves from it without special cases.

Every way in (the installed package, `from_pretrained(..., trust_remote_code=True)`) imports this file before the
model's, so the version check below guards all five remote-code files.
"""

import math
from typing import Any

import transformers
from packaging.version import Version

MINIMUM_TRANSFORMERS = "5.24"
# Checked before importing anything that differs between releases: 4.x has no `PreTrainedConfig` and an older
# huggingface_hub, and releases before 5.24 name the generation cache `past_key_values` where this code passes
# `cache` (5.17 imports the model, then fails in its first forward pass).
if Version(transformers.__version__) < Version(MINIMUM_TRANSFORMERS):
    raise ImportError(
        f"This model's code needs transformers>={MINIMUM_TRANSFORMERS}, found {transformers.__version__}: "
        f"pip install -U 'transformers>={MINIMUM_TRANSFORMERS}'"
    )

from huggingface_hub.dataclasses import strict  # noqa: E402 (after the version check)
from transformers import PreTrainedConfig  # noqa: E402
from transformers.activations import ACT2FN  # noqa: E402

POSITIONAL_ENCODING_LAYOUTS = ("interleaved", "concatenated")
POSITIONAL_ENCODING_FREQUENCIES = ("paper", "tensor2tensor")


@strict(accept_kwargs=True)
class TransformerConfig(PreTrainedConfig):
    r"""
    Configuration of [`TransformerForConditionalGeneration`]. The defaults are the paper's base model
    (Table 3, row "base"); [`TransformerConfig.big`] gives the big model.

    Args:
        vocab_size: size of the one vocabulary shared by source and target (Sec. 3.4).
        d_model: width of every sublayer output, embeddings included (Sec. 3.1).
        encoder_layers / decoder_layers: N, the number of identical layers in each stack (Sec. 3.1).
        encoder_attention_heads / decoder_attention_heads: h, parallel attention heads (Sec. 3.2.2).
        encoder_ffn_dim / decoder_ffn_dim: d_ff, inner width of the feed-forward networks (Sec. 3.3).
        dropout: P_drop, applied to each sublayer output and to the sum of embeddings and positions (Sec. 5.4).
        attention_dropout: dropout on attention weights (not in the paper; 0 reproduces it).
        activation_dropout: dropout after the ReLU of the feed-forward network (not in the paper; 0 reproduces it).
        activation_function: the feed-forward non-linearity; the paper uses ReLU (Eq. 2).
        attention_bias: whether the Q/K/V/output projections have biases. The paper's projections are plain
            matrices W^Q, W^K, W^V, W^O (Sec. 3.2.2); Marian and fairseq add biases, so conversions set this.
        max_position_embeddings: rows of the precomputed sinusoid table; longer inputs are still encoded,
            from the same formula, at a small cost.
        positional_encoding_layout: `"interleaved"` is the paper's formula (sin on even, cos on odd dimensions,
            Sec. 3.5); `"concatenated"` puts all sines first, then all cosines, as tensor2tensor, fairseq and
            Marian do. The two differ only by a permutation of hidden dimensions.
        positional_encoding_frequencies: `"paper"` gives sinusoid i the angular frequency 10000^(-2i/d_model), a
            wavelength of 2π · 10000^(2i/d_model) (Sec. 3.5: "a geometric progression from 2π to 10000 · 2π");
            `"tensor2tensor"` gives it exp(-ln(10000) · i / (d_model/2 - 1)) instead, so that the last frequency is
            exactly 1/10000, computed in float32 as fairseq computes it (its published WMT models use it).
        positional_encoding_offset: position p (0 for the first token) is encoded as position p + offset. fairseq
            numbers positions from `padding_idx + 1`, i.e. 2 for its dictionaries; 0 is the paper's.
        scale_embedding: multiply embeddings by sqrt(d_model) (Sec. 3.4).
        tie_word_embeddings: share one matrix, `model.shared`, between encoder input, decoder input and the
            pre-softmax projection (Sec. 3.4). `False` (not the paper's) gives each of the three a matrix of its own
            and no `model.shared`: `get_input_embeddings()` is the encoder's (what `inputs_embeds` stand for), the
            decoder's is `model.decoder.embed_tokens`, the projection `lm_head`; `resize_token_embeddings` resizes
            all three.
        init_std: standard deviation of the embedding initialisation; `None` means d_model ** -0.5, so that the
            scaled embedding has unit variance (as fairseq).
        layer_norm_eps: epsilon of every LayerNorm.
    """

    model_type = "vaswani_transformer"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {
        "num_attention_heads": "encoder_attention_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    activation_function: str = "relu"
    attention_bias: bool = False
    max_position_embeddings: int = 1024
    positional_encoding_layout: str = "interleaved"
    positional_encoding_frequencies: str = "paper"
    positional_encoding_offset: int = 0
    scale_embedding: bool = True
    tie_word_embeddings: bool = True
    init_std: float | None = None
    layer_norm_eps: float = 1e-5
    use_cache: bool = True
    is_encoder_decoder: bool = True
    # Token ids of the shared BPE built by `modeling.tokenization`: <pad>=0, <unk>=1, </s>=2. The decoder starts
    # from </s>, as fairseq does; the paper does not name a start symbol.
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 2

    def __post_init__(self, **kwargs):
        # After the parent's, which sets the attribute-map aliases (`num_attention_heads=...`) among the kwargs.
        super().__post_init__(**kwargs)
        self.check_values()

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> "TransformerConfig":
        """`PreTrainedConfig.from_dict` (the config, or with `return_unused_kwargs` the config and the kwargs left),
        checked once its keyword overrides are in: it sets those (`from_pretrained(path, d_model=...)`) one by one
        after `__post_init__`, which never sees them."""
        loaded = super().from_dict(config_dict, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).check_values()
        return loaded

    def validate_architecture(self) -> None:
        """Part of the strict dataclass's validation, which `save_pretrained` runs: a value set by hand after
        construction is refused before it is written."""
        super().validate_architecture()
        self.check_values()

    def check_values(self) -> None:
        """A plain ValueError naming the first value the model cannot be built from. (Their types are checked by the
        strict dataclass: an int, a float.) Not on each assignment: overrides come one by one, and a valid change
        of two fields (d_model and the heads) passes through an invalid state."""
        if self.d_model < 2 or self.d_model % 2 != 0:
            raise ValueError(
                f"d_model must be a positive even number (sinusoids come in sin/cos pairs), got {self.d_model}."
            )
        for name in ("vocab_size", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings"):
            # max_position_embeddings also bounds the exports' and fairseq decoding's sentence lengths.
            if (size := getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {size}.")
        for name in ("encoder_layers", "decoder_layers"):
            if (layers := getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1 (N of Table 3), got {layers}.")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            # 1 zeroes all it applies to, and training goes on: a model blind to its input, or to the source.
            if not 0 <= (rate := getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a probability in [0, 1) (1 drops everything), got {rate}.")
        # 0 divides by zero on a constant row; NaN and infinity pass a comparison and poison every output.
        if not 0 < self.layer_norm_eps < math.inf:
            raise ValueError(f"layer_norm_eps must be a positive number, got {self.layer_norm_eps}.")
        if self.init_std is not None and not 0 <= self.init_std < math.inf:
            raise ValueError(f"init_std must be a non-negative number, got {self.init_std}.")
        if self.activation_function not in ACT2FN:
            raise ValueError(
                f"Unknown activation_function {self.activation_function!r}; expected one of {sorted(ACT2FN)}."
            )
        for side in ("encoder", "decoder"):
            heads = getattr(self, f"{side}_attention_heads")
            if heads < 1 or self.d_model % heads != 0:
                # Each head works on d_model / h dimensions (Sec. 3.2.2).
                raise ValueError(f"d_model ({self.d_model}) must be divisible by {side}_attention_heads ({heads}).")
        if self.positional_encoding_layout not in POSITIONAL_ENCODING_LAYOUTS:
            raise ValueError(
                f"Unknown positional_encoding_layout {self.positional_encoding_layout!r}; "
                f"expected one of {POSITIONAL_ENCODING_LAYOUTS}."
            )
        if self.positional_encoding_frequencies not in POSITIONAL_ENCODING_FREQUENCIES:
            raise ValueError(
                f"Unknown positional_encoding_frequencies {self.positional_encoding_frequencies!r}; "
                f"expected one of {POSITIONAL_ENCODING_FREQUENCIES}."
            )
        offset = self.positional_encoding_offset
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"positional_encoding_offset must be a non-negative integer, got {offset!r}.")

    @classmethod
    def base(cls, **overrides: Any) -> "TransformerConfig":
        """The paper's base model: N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (Table 3)."""
        return cls(**overrides)

    @classmethod
    def big(cls, **overrides: Any) -> "TransformerConfig":
        """The paper's big model: N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (Table 3)."""
        settings: dict[str, Any] = {
            "d_model": 1024,
            "encoder_ffn_dim": 4096,
            "decoder_ffn_dim": 4096,
            "encoder_attention_heads": 16,
            "decoder_attention_heads": 16,
            "dropout": 0.3,
        }
        return cls(**{**settings, **overrides})


__all__ = ["TransformerConfig"]
