"""Exact conversions: between this model and transformers' MarianMTModel, and from fairseq's Transformers.

`from_fairseq` (fairseq checkpoint + dictionaries + BPE codes -> this model and its tokenizer) and
`convert_fairseq` (the same, saved as a model directory) live in `modeling.fairseq`; they are re-exported here.

Marian is the same architecture family (post-LN, sinusoidal positions, one shared scaled embedding), so a
conversion that reproduces its logits is the proof that this implementation is the architecture it claims to
be, and the way to reuse Marian's ecosystem: trained opus-mt weights in, and CTranslate2's Marian converter
(a fast C++ runtime) out.

Marian stores the sinusoids "concatenated" (all sines, then all cosines). A model with the paper's
"interleaved" layout differs from it only by a permutation of the hidden dimensions, so it converts exactly by
permuting every weight that reads from or writes to the residual stream.
"""

import torch
from transformers import MarianConfig, MarianMTModel

from .configuration_transformer import TransformerConfig
from .fairseq import convert_fairseq, from_fairseq
from .modeling_transformer import TransformerForConditionalGeneration

# Names that differ between the two module trees; all others are identical.
_OUR_FFN = (".ffn.fc1.", ".ffn.fc2.")
_MARIAN_FFN = (".fc1.", ".fc2.")
# Marian keeps the sinusoids as (unsaved) weights and a logits bias that this model does not have.
_MARIAN_ONLY = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight", "final_logits_bias")


def interleaved_to_concatenated_permutation(d_model: int) -> torch.Tensor:
    """Index p such that concatenated[..., j] == interleaved[..., p[j]]: even dimensions (sines), then odd."""
    return torch.cat((torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)))


def _permute_hidden(state_dict: dict[str, torch.Tensor], permutation: torch.Tensor) -> dict[str, torch.Tensor]:
    """Reorder the residual stream's dimensions: h'[j] = h[permutation[j]].

    Weights reading the stream (attention Q/K/V, fc1, embeddings) permute their input columns; weights writing
    to it (attention output, fc2) and LayerNorm parameters permute their output rows. Attention heads and the
    feed-forward inner layer live in their own spaces and stay put.
    """
    reads = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "fc1.weight", "shared.weight", "embed_tokens.weight")
    writes = ("out_proj.weight", "out_proj.bias", "fc2.weight", "fc2.bias", "layer_norm.weight", "layer_norm.bias")
    permuted = {}
    for name, tensor in state_dict.items():
        if name.endswith(reads) or name == "lm_head.weight":
            tensor = tensor[:, permutation]
        elif name.endswith(writes):
            tensor = tensor[permutation]
        permuted[name] = tensor
    return permuted


def _rename(name: str, source: tuple[str, ...], target: tuple[str, ...]) -> str:
    for old, new in zip(source, target, strict=True):
        name = name.replace(old, new)
    return name


def _check_convertible_marian(config: MarianConfig, final_logits_bias: torch.Tensor) -> None:
    problems = []
    if not config.share_encoder_decoder_embeddings or not config.tie_word_embeddings:
        problems.append("its embeddings are not shared by encoder, decoder and output projection")
    if config.decoder_vocab_size not in (None, config.vocab_size):
        problems.append(
            f"its decoder_vocab_size ({config.decoder_vocab_size}) differs from its vocab_size ({config.vocab_size})"
        )
    if config.encoder_layerdrop or config.decoder_layerdrop:
        problems.append("it uses LayerDrop")
    if torch.count_nonzero(final_logits_bias):
        problems.append(
            "it has a non-zero final_logits_bias, which this model (like the paper) does not have; "
            "dropping it would change every translation"
        )
    if problems:
        raise ValueError("Cannot convert this MarianMTModel exactly: " + "; ".join(problems) + ".")


def from_marian(
    marian_model: MarianMTModel, positional_encoding_layout: str = "concatenated"
) -> TransformerForConditionalGeneration:
    """An equivalent `TransformerForConditionalGeneration` (same logits, same beam search outputs).

    `positional_encoding_layout="interleaved"` gives the paper's layout, with hidden dimensions permuted.
    """
    marian_config: MarianConfig = marian_model.config
    state_dict = marian_model.state_dict()
    _check_convertible_marian(marian_config, state_dict["final_logits_bias"])

    config = TransformerConfig(
        vocab_size=marian_config.vocab_size,
        d_model=marian_config.d_model,
        encoder_layers=marian_config.encoder_layers,
        decoder_layers=marian_config.decoder_layers,
        encoder_attention_heads=marian_config.encoder_attention_heads,
        decoder_attention_heads=marian_config.decoder_attention_heads,
        encoder_ffn_dim=marian_config.encoder_ffn_dim,
        decoder_ffn_dim=marian_config.decoder_ffn_dim,
        dropout=marian_config.dropout,
        attention_dropout=marian_config.attention_dropout,
        activation_dropout=marian_config.activation_dropout,
        activation_function=marian_config.activation_function,
        attention_bias=True,
        max_position_embeddings=marian_config.max_position_embeddings,
        positional_encoding_layout=positional_encoding_layout,
        scale_embedding=marian_config.scale_embedding,
        layer_norm_eps=1e-5,  # Marian's nn.LayerNorm default
        pad_token_id=marian_config.pad_token_id,
        bos_token_id=marian_config.bos_token_id,
        eos_token_id=marian_config.eos_token_id,
        decoder_start_token_id=marian_config.decoder_start_token_id,
    )
    ours = {
        _rename(name, _MARIAN_FFN, _OUR_FFN): tensor for name, tensor in state_dict.items() if name not in _MARIAN_ONLY
    }
    if positional_encoding_layout == "interleaved":
        ours = _permute_hidden(ours, torch.argsort(interleaved_to_concatenated_permutation(config.d_model)))

    model = TransformerForConditionalGeneration(config)
    model.load_state_dict(ours, strict=True)
    model.to(marian_model.dtype)
    _copy_generation_settings(marian_model, model)
    return model.train(marian_model.training)


def to_marian(model: TransformerForConditionalGeneration) -> MarianMTModel:
    """An equivalent `MarianMTModel`; exact for both positional layouts (the interleaved one is permuted). Given
    `inputs_embeds`, MarianMT takes them already scaled by sqrt(d_model), this model before."""
    config: TransformerConfig = model.config
    if not config.tie_word_embeddings:
        raise ValueError("MarianMTModel shares its embeddings; this model was configured with untied ones.")
    marian_config = MarianConfig(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.encoder_attention_heads,
        decoder_attention_heads=config.decoder_attention_heads,
        encoder_ffn_dim=config.encoder_ffn_dim,
        decoder_ffn_dim=config.decoder_ffn_dim,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        activation_function=config.activation_function,
        max_position_embeddings=config.max_position_embeddings,
        scale_embedding=config.scale_embedding,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        forced_eos_token_id=None,
        decoder_start_token_id=config.decoder_start_token_id,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    if config.layer_norm_eps != 1e-5:
        raise ValueError(f"MarianMTModel's LayerNorm epsilon is 1e-5; this model uses {config.layer_norm_eps}.")
    for name, paper in (("positional_encoding_frequencies", "paper"), ("positional_encoding_offset", 0)):
        if getattr(config, name) != paper:
            raise ValueError(
                f"MarianMTModel adds the paper's sinusoids from position 0; this model has {name}="
                f"{getattr(config, name)!r} (a converted fairseq model, say), which Marian cannot compute."
            )
    state_dict = dict(model.state_dict())
    if config.positional_encoding_layout == "interleaved":
        state_dict = _permute_hidden(state_dict, interleaved_to_concatenated_permutation(config.d_model))

    marian = MarianMTModel(marian_config)
    marian_state = marian.state_dict()
    converted = {_rename(name, _OUR_FFN, _MARIAN_FFN): tensor for name, tensor in state_dict.items()}
    for name in marian_state:
        if name in _MARIAN_ONLY:
            continue
        if name in converted:
            marian_state[name] = converted[name]
        elif name.endswith("_proj.bias") and not config.attention_bias:
            marian_state[name] = torch.zeros_like(marian_state[name])  # the paper's projections have no bias
        else:
            raise KeyError(f"No weight for MarianMTModel parameter {name}.")
    marian_state["final_logits_bias"] = torch.zeros_like(marian_state["final_logits_bias"])
    marian.load_state_dict(marian_state, strict=True)
    marian.to(model.dtype)
    _copy_generation_settings(model, marian)
    return marian.train(model.training)


def _copy_generation_settings(source, target) -> None:
    """Beam size, length penalty, caps and the rules both models' generate() apply alike (minimum lengths, banned
    or suppressed tokens, repetition rules: a Marian checkpoint's bad_words_ids, fairseq decoding's
    suppress_tokens) travel; the GNMT form and per-sentence limits are this model's own."""
    for name in (
        "num_beams",
        "length_penalty",
        "early_stopping",
        "max_length",
        "max_new_tokens",
        "min_length",
        "min_new_tokens",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "bad_words_ids",
        "suppress_tokens",
        "begin_suppress_tokens",
        "sequence_bias",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "repetition_penalty",
        "encoder_repetition_penalty",
    ):
        value = getattr(source.generation_config, name, None)
        if value is not None:
            setattr(target.generation_config, name, value)


__all__ = ["convert_fairseq", "from_fairseq", "from_marian", "to_marian", "interleaved_to_concatenated_permutation"]
