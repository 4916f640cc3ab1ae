"""Exporting a trained model to deployment runtimes: CTranslate2, MarianMT and ONNX.

Each exporter writes one directory and never leaves half of one behind: it builds `NAME.partial` beside it, and
only once everything is written does it rename that to `NAME`, replacing a previous export there. A directory
that is not a previous export (no `export.json` in it) is never replaced. A config the target cannot represent
exactly is refused before anything is written, in one line naming the field.

- `to_ctranslate2`: a CTranslate2 model built from this model's own modules (weights, the positional-encoding
  module's table, zero biases where the paper's projections have none), with the tokenizer, the vocabulary as
  CTranslate2 reads it (`shared_vocabulary.json`) and `translate_options.json`: the decoding settings of the
  model's generation config that CTranslate2 can express.
- `to_marian`: an exact `MarianMTModel` (`modeling.convert.to_marian`) saved with its tokenizer.
- `to_onnx`: `encoder.onnx` and `decoder.onnx` (without cache; see `to_onnx`) for onnxruntime.

What CTranslate2 can and cannot express of the paper's decoding (Sec. 6.1): beam size and a length penalty in the
form score / length ** alpha (transformers' form, `length_penalty_type="transformers"`) carry over exactly; the
GNMT form ((5 + |Y|) / 6) ** alpha (`length_penalty_type="gnmt"`, the default) and the per-sentence limit of
source length + 50 (`max_length_offset`) have no equivalent: CTranslate2 takes one `max_decoding_length` for
every sentence. `translate_options.json` then holds the nearest settings, and `export.json` lists what differs.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from .configuration_transformer import TransformerConfig
from .modeling_transformer import TransformerForConditionalGeneration

RECORD_FILE = "export.json"
CTRANSLATE2_OPTIONS_FILE = "translate_options.json"
FORMATS = ("ctranslate2", "marian", "onnx")
# transformers' activation names that CTranslate2 computes with the same function (its own converter's table).
CTRANSLATE2_ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "gelu_python": "GELU",
    "gelu_new": "GELUTanh",
    "gelu_fast": "GELUTanh",
    "gelu_pytorch_tanh": "GELUTanh",
    "quick_gelu": "GELUSigmoid",
    "silu": "SWISH",
    "swish": "SWISH",
}
CTRANSLATE2_QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16")
ONNX_OPSET = 18


# --------------------------------------------------------------------------------------------------------------
# Writing a directory all at once
# --------------------------------------------------------------------------------------------------------------


def _check_replaceable(output_dir: Path) -> None:
    """Only a previous export (or an empty directory) may be replaced: never a user's other files."""
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise FileExistsError(f"{output_dir} exists and is not a directory.")
    if any(output_dir.iterdir()) and not (output_dir / RECORD_FILE).is_file():
        raise FileExistsError(
            f"{output_dir} exists and is not an export (no {RECORD_FILE}): remove it or choose another directory."
        )


@contextmanager
def building_directory(output_dir: str | Path) -> Iterator[Path]:
    """Yield `NAME.partial` beside `output_dir` to fill; on success rename it to `output_dir` (replacing a previous
    export there), on failure remove it and leave `output_dir` as it was."""
    output_dir = Path(output_dir)
    _check_replaceable(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = output_dir.with_name(output_dir.name + ".partial")
    if partial.exists():  # left by an interrupted export
        shutil.rmtree(partial)
    partial.mkdir()
    try:
        yield partial
        _check_replaceable(output_dir)  # again: something may have appeared there meanwhile
        if not output_dir.exists():
            os.replace(partial, output_dir)
            return
        # Two renames: the old export goes aside first, so that `output_dir` is at every moment the old or the new
        # export, complete, or (between the two renames) absent; if the second fails, the old one comes back.
        aside = Path(tempfile.mkdtemp(prefix=output_dir.name + ".old-", dir=output_dir.parent))
        os.replace(output_dir, aside / output_dir.name)
        try:
            os.replace(partial, output_dir)
        except BaseException:
            os.replace(aside / output_dir.name, output_dir)
            raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already after success


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _record(directory: Path, export_format: str, model: TransformerForConditionalGeneration, **details: Any) -> None:
    """`export.json`: what was exported, from which model, with what settings and what the target cannot express."""
    _write_json(
        directory / RECORD_FILE,
        {
            "format": export_format,
            "model_type": model.config.model_type,
            "source": getattr(model.config, "_name_or_path", "") or None,
            **details,
        },
    )


def _refuse(field: str, value: Any, target: str, why: str) -> None:
    raise ValueError(f"cannot export to {target} exactly: {field}={value!r} ({why}).")


def _check_model(model: Any) -> TransformerForConditionalGeneration:
    if not isinstance(model, TransformerForConditionalGeneration):
        raise TypeError(f"expected a TransformerForConditionalGeneration, got {type(model).__name__}.")
    return model


def _single_eos(config: TransformerConfig, target: str) -> int:
    eos = config.eos_token_id
    if isinstance(eos, (list, tuple)):
        if len(eos) != 1:
            _refuse("eos_token_id", eos, target, "it takes one end-of-sentence token")
        eos = eos[0]
    if eos is None:
        _refuse("eos_token_id", eos, target, "it needs an end-of-sentence token")
    return int(eos)


# --------------------------------------------------------------------------------------------------------------
# CTranslate2
# --------------------------------------------------------------------------------------------------------------


def _ctranslate2_vocabulary(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> list[str]:
    """The tokenizer's tokens in id order, as many as the model's vocabulary (CTranslate2 maps tokens to ids by
    their position in this list). Rows beyond the tokenizer (an embedding matrix resized upwards) get placeholder
    tokens that no input contains."""
    vocab = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    if sorted(vocab.values()) != list(range(len(tokens))):
        raise ValueError("cannot export to CTranslate2: the tokenizer's ids are not 0, 1, ..., n - 1.")
    if len(tokens) > vocab_size:
        _refuse("vocab_size", vocab_size, "CTranslate2", f"the tokenizer has {len(tokens)} tokens, more than rows")
    return tokens + [f"<unused_{index}>" for index in range(len(tokens), vocab_size)]


def check_ctranslate2(model: TransformerForConditionalGeneration) -> None:
    """Refuse, naming the field, what a CTranslate2 `TransformerSpec` cannot compute exactly."""
    config: TransformerConfig = _check_model(model).config
    if config.activation_function not in CTRANSLATE2_ACTIVATIONS:
        _refuse("activation_function", config.activation_function, "CTranslate2", "it has no such activation")
    _single_eos(config, "CTranslate2")
    if config.decoder_start_token_id is None:
        _refuse("decoder_start_token_id", None, "CTranslate2", "the decoder needs a start token")


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 CPU copy: CTranslate2's int8 and int16 quantisation scales the arrays it is given in place
    (`ModelSpec._quantize`: `value *= scale` on a NumPy view of the tensor), which must never reach the model's
    own parameters."""
    return tensor.detach().to("cpu", torch.float32, copy=True)


def _linear(spec, module: nn.Linear) -> None:
    """Weight and bias; a projection without bias (the paper's) gets zeros, which compute the same."""
    spec.weight = _copy(module.weight)
    bias = module.bias if module.bias is not None else torch.zeros(module.out_features)
    spec.bias = _copy(bias)


def _layer_norm(spec, module: nn.LayerNorm) -> None:
    spec.gamma = _copy(module.weight)
    spec.beta = _copy(module.bias)


def _attention(spec, attention: nn.Module, self_attention: bool) -> None:
    """CTranslate2 fuses Q, K and V (self-attention) or K and V (cross-attention) into one projection."""
    from ctranslate2.converters.utils import fuse_linear
    from ctranslate2.specs import common_spec

    projections = [common_spec.LinearSpec() for _ in range(3)]
    for projection, module in zip(projections, (attention.q_proj, attention.k_proj, attention.v_proj), strict=True):
        _linear(projection, module)
    if self_attention:
        fuse_linear(spec.linear[0], projections)
    else:
        fuse_linear(spec.linear[0], projections[:1])
        fuse_linear(spec.linear[1], projections[1:])
    _linear(spec.linear[-1], attention.out_proj)


def _stack(spec, stack: nn.Module, num_positions: int) -> None:
    """Embeddings, their scale, and the positions the model itself adds: its positional-encoding module's output
    for positions 0, ..., num_positions - 1, whatever formula, layout or offset that module implements."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _copy(stack.embed_tokens.weight)
    spec.scale_embeddings = float(stack.embed_scale)
    spec.position_encodings.encodings = _copy(stack.embed_positions(0, num_positions))


def ctranslate2_spec(model: TransformerForConditionalGeneration, tokenizer: PreTrainedTokenizerBase):
    """A `ctranslate2.specs.TransformerSpec` holding this model: post-LayerNorm encoder and decoder without final
    LayerNorm, no embedding LayerNorm, the decoder starting from `decoder_start_token_id`'s embedding."""
    from ctranslate2.specs import common_spec, transformer_spec

    check_ctranslate2(model)
    config: TransformerConfig = model.config
    activation = getattr(common_spec.Activation, CTRANSLATE2_ACTIVATIONS[config.activation_function])
    encoder_spec = transformer_spec.TransformerEncoderSpec(
        config.encoder_layers, config.encoder_attention_heads, pre_norm=False, activation=activation
    )
    decoder_spec = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers, config.decoder_attention_heads, pre_norm=False, activation=activation
    )
    encoder, decoder = model.model.encoder, model.model.decoder
    num_positions = config.max_position_embeddings
    with torch.no_grad():
        _stack(encoder_spec, encoder, num_positions)
        for layer_spec, layer in zip(encoder_spec.layer, encoder.layers, strict=True):
            _attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
            _layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
            _linear(layer_spec.ffn.linear_0, layer.ffn.fc1)
            _linear(layer_spec.ffn.linear_1, layer.ffn.fc2)
            _layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
        _stack(decoder_spec, decoder, num_positions)
        for layer_spec, layer in zip(decoder_spec.layer, decoder.layers, strict=True):
            _attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
            _layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
            _attention(layer_spec.attention, layer.encoder_attn, self_attention=False)
            _layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
            _linear(layer_spec.ffn.linear_0, layer.ffn.fc1)
            _linear(layer_spec.ffn.linear_1, layer.ffn.fc2)
            _layer_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)
        decoder_spec.projection.weight = _copy(model.lm_head.weight)
        if model.lm_head.bias is not None:
            decoder_spec.projection.bias = _copy(model.lm_head.bias)
    decoder_spec.start_from_zero_embedding = False

    spec = transformer_spec.TransformerSpec(encoder_spec, decoder_spec)
    tokens = _ctranslate2_vocabulary(tokenizer, config.vocab_size)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.unk_token = tokenizer.unk_token if tokenizer.unk_token is not None else tokens[0]
    spec.config.eos_token = tokens[_single_eos(config, "CTranslate2")]
    spec.config.decoder_start_token = tokens[config.decoder_start_token_id]
    spec.config.bos_token = tokenizer.bos_token if tokenizer.bos_token is not None else spec.config.decoder_start_token
    spec.config.layer_norm_epsilon = float(config.layer_norm_eps)
    return spec


def paper_decoding_not_expressed(model: TransformerForConditionalGeneration, runtime: str) -> list[str]:
    """The paper's decoding fields of the generation config that a runtime without them (CTranslate2,
    transformers' own beam search) cannot apply: the GNMT length penalty and the per-sentence limit."""
    generation = model.generation_config
    alpha = generation.length_penalty if generation.length_penalty is not None else 1.0
    not_expressed = []
    if getattr(generation, "length_penalty_type", None) == "gnmt":
        not_expressed.append(
            f"length_penalty_type='gnmt': {runtime} ranks finished hypotheses by score / length ** {alpha}, "
            f"not by score / ((5 + length) / 6) ** {alpha}"
        )
    offset = getattr(generation, "max_length_offset", None)
    if offset is not None:
        not_expressed.append(
            f"max_length_offset={offset}: {runtime} has one length limit for every sentence, "
            f"not source length + {offset}"
        )
    return not_expressed


def ctranslate2_translate_options(model: TransformerForConditionalGeneration) -> tuple[dict[str, Any], list[str]]:
    """`Translator.translate_batch` keyword arguments for the model's generation config, and what of it they
    cannot express.

    `beam_size` and `length_penalty` (CTranslate2 applies it as score / length ** alpha, as transformers does) are
    the generation config's; CTranslate2 stops a sentence's search once `beam_size` hypotheses have finished, as
    `early_stopping=True` does. `max_decoding_length` counts the end-of-sentence token, as `max_new_tokens` does:
    it is `max_new_tokens` when set, else 256 (CTranslate2's default), within the positional table.
    `min_decoding_length` is `min_new_tokens`: 0 allows an empty translation, as `generate()` does by default
    (CTranslate2's default, 1, does not; fairseq's decoding sets 1). `max_input_length` is the positional table's
    length.

    fairseq's limit (`max_length_a`, `max_length_b`: int(a · W + b) tokens, then a forced end-of-sentence that keeps
    its log-probability) becomes `max_decoding_length` = int(a · max_input_length + b), capped as generate() caps it:
    exact while no hypothesis reaches it (CTranslate2 stops there without an end-of-sentence and its score), and
    with a = 0 the same limit for every batch. The top hypothesis does not depend on `beam_finalization`.
    """
    generation = model.generation_config
    positions = model.config.max_position_embeddings
    limit = generation.max_new_tokens if generation.max_new_tokens is not None else 256
    a, b = getattr(generation, "max_length_a", None), getattr(generation, "max_length_b", None)
    fairseq_limit = a is not None or b is not None
    if fairseq_limit:
        a, b = a or 0, 200 if b is None else b  # the defaults generate() gives the one not set
        limit = min(int(a * positions + b), positions - 1)
    options: dict[str, Any] = {
        "beam_size": int(generation.num_beams or 1),
        "length_penalty": float(generation.length_penalty if generation.length_penalty is not None else 1.0),
        "max_input_length": positions,
        "max_decoding_length": min(int(limit), positions),
        "min_decoding_length": int(generation.min_new_tokens or 0),
    }
    not_expressed = paper_decoding_not_expressed(model, "CTranslate2")
    if fairseq_limit:
        forced = getattr(generation, "forced_eos_keeps_log_prob", False)
        not_expressed.append(
            f"max_length_a={a}, max_length_b={b}: CTranslate2 stops a hypothesis at max_decoding_length tokens "
            "without an end-of-sentence"
            + (", where generate() forces one that keeps its log-probability" if forced else "")
            + (f", and its limit does not follow each batch's source width (a = {a})" if a else "")
            + ": the same translations while no sentence reaches the limit"
        )
    if generation.suppress_tokens:
        not_expressed.append(
            f"suppress_tokens={list(generation.suppress_tokens)}: not passed on (generate() masks them after the "
            "log-softmax)"
        )
    if generation.do_sample:
        not_expressed.append("do_sample=True: these options decode with beam search")
    if generation.early_stopping is not True and options["beam_size"] > 1:
        not_expressed.append(
            f"early_stopping={generation.early_stopping!r}: CTranslate2 stops a sentence's search once "
            f"beam_size hypotheses have finished, as early_stopping=True does"
        )
    return options, not_expressed


CTRANSLATE2_README = """# CTranslate2 export

Exported by `modeling.export.to_ctranslate2` from {source}. The tokenizer files beside `model.bin` are the
model's own: CTranslate2 takes tokens, not text, and the source side ends in `</s>` as the tokenizer writes it.

```python
import json
import ctranslate2
from transformers import AutoTokenizer

# trust_remote_code: the tokenizer of a converted fairseq model is code that travels with it
tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)
translator = ctranslate2.Translator("{name}", device="cpu", compute_type="default")  # or "int8"
options = json.load(open("{name}/{options_file}"))
sources = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(["A man is riding a bicycle."])["input_ids"]]
results = translator.translate_batch(sources, **options)
print([tokenizer.decode(tokenizer.convert_tokens_to_ids(r.hypotheses[0])) for r in results])
```

`{options_file}`: {options}.
{not_expressed}
"""


def to_ctranslate2(
    model: TransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | Path,
    *,
    quantization: str | None = None,
) -> Path:
    """Write a CTranslate2 model of `model` to `output_dir`, with the tokenizer and the decoding settings.

    The spec is built from this model's modules (`ctranslate2_spec`), not through a MarianMT twin: the positional
    table is the model's own positional-encoding module's output, so any formula or offset it implements is
    exported as computed. `quantization` (`int8`, `int16`, `float16`, ...) converts the weights once; without it
    they stay float32 and `ctranslate2.Translator(compute_type=...)` can still quantise at load time.

    Decoding: `translate_options.json` holds `translate_batch` keyword arguments for the generation config's
    beam size, length penalty (applied as score / length ** alpha) and limits. The paper's GNMT length penalty
    and per-sentence limit (source length + 50) cannot be expressed in CTranslate2; `export.json` lists them
    under `not_expressed` when the generation config uses them.
    """
    from ctranslate2.converters.converter import Converter

    model = _check_model(model)
    if quantization is not None and quantization not in CTRANSLATE2_QUANTIZATIONS + ("float32",):
        raise ValueError(f"unknown quantization {quantization!r}; expected one of {CTRANSLATE2_QUANTIZATIONS}.")
    check_ctranslate2(model)
    options, not_expressed = ctranslate2_translate_options(model)

    class ModelConverter(Converter):
        """CTranslate2's converter machinery (validation, quantisation, serialisation) on the spec above."""

        def _load(self):
            return ctranslate2_spec(model, tokenizer)

    output_dir = Path(output_dir)
    with building_directory(output_dir) as directory:
        ModelConverter().convert(str(directory), quantization=quantization, force=True)
        tokenizer.save_pretrained(directory)
        _write_json(directory / CTRANSLATE2_OPTIONS_FILE, options)
        _record(directory, "ctranslate2", model, quantization=quantization or "float32", not_expressed=not_expressed)
        readme = CTRANSLATE2_README.format(
            source=getattr(model.config, "_name_or_path", "") or "an in-memory model",
            name=output_dir.name,
            options_file=CTRANSLATE2_OPTIONS_FILE,
            options=json.dumps(options),
            not_expressed="".join(f"\nNot expressed: {line}.\n" for line in not_expressed),
        )
        (directory / "README.md").write_text(readme, encoding="utf-8")
    return output_dir


# --------------------------------------------------------------------------------------------------------------
# MarianMT
# --------------------------------------------------------------------------------------------------------------


def check_marian(model: TransformerForConditionalGeneration) -> None:
    """Refuse, naming the field, what MarianMTModel cannot compute exactly (the positional table is compared
    after conversion, in `to_marian`)."""
    config: TransformerConfig = _check_model(model).config
    if not config.tie_word_embeddings:
        _refuse("tie_word_embeddings", False, "MarianMT", "it shares one embedding matrix three ways")
    if config.layer_norm_eps != 1e-5:
        _refuse("layer_norm_eps", config.layer_norm_eps, "MarianMT", "its LayerNorm epsilon is 1e-5")
    for name, paper in (("positional_encoding_frequencies", "paper"), ("positional_encoding_offset", 0)):
        if getattr(config, name) != paper:
            _refuse(name, getattr(config, name), "MarianMT", "it adds the paper's sinusoids from position 0")
    _single_eos(config, "MarianMT")


def _check_marian_positions(model: TransformerForConditionalGeneration, marian) -> None:
    """Marian adds its own sinusoids (the paper's formula from position 0, concatenated): this model's positional
    module must add the same ones, up to the permutation of an interleaved layout."""
    from .convert import interleaved_to_concatenated_permutation

    config: TransformerConfig = model.config
    for ours, theirs in (
        (model.model.encoder.embed_positions, marian.model.encoder.embed_positions),
        (model.model.decoder.embed_positions, marian.model.decoder.embed_positions),
    ):
        table = ours(0, config.max_position_embeddings).detach().float().cpu()
        if config.positional_encoding_layout == "interleaved":
            table = table[:, interleaved_to_concatenated_permutation(config.d_model)]
        if not torch.allclose(table, theirs.weight.detach().float().cpu(), rtol=0, atol=1e-6):
            defaults = TransformerConfig()
            fields = [
                f"{key}={value!r}"
                for key, value in config.to_dict().items()
                if "position" in key and key != "max_position_embeddings" and getattr(defaults, key, value) != value
            ]
            raise ValueError(
                "cannot export to MarianMT exactly: the positional encodings "
                f"({', '.join(fields) or 'positional_encoding_layout=' + repr(config.positional_encoding_layout)}) "
                "differ from Marian's sinusoids, the paper's formula from position 0."
            )


def to_marian(
    model: TransformerForConditionalGeneration, tokenizer: PreTrainedTokenizerBase | None, output_dir: str | Path
) -> Path:
    """Save the exact `MarianMTModel` twin of `model` (`modeling.convert.to_marian`: same logits, same beam search
    with transformers' length penalty) with `tokenizer` to `output_dir`. It loads with
    `MarianMTModel.from_pretrained` and `AutoTokenizer.from_pretrained`, without remote code."""
    from .convert import to_marian as convert_to_marian

    check_marian(model)
    marian = convert_to_marian(model)
    _check_marian_positions(model, marian)
    with building_directory(output_dir) as directory:
        marian.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)
        _record(directory, "marian", model, not_expressed=paper_decoding_not_expressed(model, "MarianMTModel"))
    return Path(output_dir)


# --------------------------------------------------------------------------------------------------------------
# ONNX
# --------------------------------------------------------------------------------------------------------------


class OnnxEncoder(nn.Module):
    """encoder.onnx: (input_ids, attention_mask) → encoder_hidden_states."""

    def __init__(self, model: TransformerForConditionalGeneration):
        super().__init__()
        self.encoder = model.model.encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class OnnxDecoder(nn.Module):
    """decoder.onnx: (decoder_input_ids, encoder_hidden_states, encoder_attention_mask) → logits of every
    position, without cache."""

    def __init__(self, model: TransformerForConditionalGeneration):
        super().__init__()
        self.decoder = model.model.decoder
        self.lm_head = model.lm_head

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        hidden_states = self.decoder(
            input_ids=decoder_input_ids,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            use_cache=False,
        ).last_hidden_state
        return self.lm_head(hidden_states)


def _example_inputs(config: TransformerConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A padded batch of 2 sources (lengths 7 and 4) and 2 decoder prefixes of length 5: shapes for tracing."""
    input_ids = torch.full((2, 7), 3, dtype=torch.long)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 4:] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, config.pad_token_id or 0)
    decoder_input_ids = torch.full((2, 5), config.decoder_start_token_id, dtype=torch.long)
    return input_ids, attention_mask, decoder_input_ids


def to_onnx(
    model: TransformerForConditionalGeneration,
    output_dir: str | Path,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    opset_version: int = ONNX_OPSET,
) -> Path:
    """Write `encoder.onnx` and `decoder.onnx` of `model` (float32, dynamic batch and lengths, eager attention
    traced by `torch.onnx.export(dynamo=True)`), with the config, generation config and tokenizer.

    encoder.onnx: `input_ids` (B, S) int64, `attention_mask` (B, S) int64 → `encoder_hidden_states` (B, S, D).
    decoder.onnx: `decoder_input_ids` (B, T) int64, `encoder_hidden_states` (B, S, D), `encoder_attention_mask`
    (B, S) int64 → `logits` (B, T, V), for every decoder position. S and T go up to `max_position_embeddings`
    (`export.json` says how many): the graphs read the model's positional table, which has that many rows.

    No decoder-with-cache graph: it would take and return 4 tensors per decoder layer and need a second graph for
    the first step (as optimum builds), while a runtime that wants fast beam search is better served by
    `to_ctranslate2`, which has the cache, the beam search and int8 in C++. Without cache, step t recomputes the
    t previous positions; at sentence lengths (outputs of 10 to 60 tokens) that is the price of one simple graph.
    """
    import onnx  # noqa: F401 (the exporter needs it; fail here with its name rather than deep inside torch)
    import onnxscript  # noqa: F401

    model = _check_model(model)
    config: TransformerConfig = model.config
    input_ids, attention_mask, decoder_input_ids = (tensor.to(model.device) for tensor in _example_inputs(config))
    was_training = model.training
    implementation = config._attn_implementation
    model.eval()
    model.set_attn_implementation("eager")
    try:
        with building_directory(output_dir) as directory, torch.no_grad():
            encoder = OnnxEncoder(model).eval()
            encoder_hidden_states = encoder(input_ids, attention_mask)
            # Lengths up to the positional table: the graphs slice it (the model itself computes positions beyond).
            positions = config.max_position_embeddings
            batch = torch.export.Dim("batch")
            source, target = torch.export.Dim("source", max=positions), torch.export.Dim("target", max=positions)
            _export_graph(
                encoder,
                (input_ids, attention_mask),
                directory / "encoder.onnx",
                ["input_ids", "attention_mask"],
                ["encoder_hidden_states"],
                {"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source}},
                opset_version,
            )
            _export_graph(
                OnnxDecoder(model).eval(),
                (decoder_input_ids, encoder_hidden_states, attention_mask),
                directory / "decoder.onnx",
                ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"],
                ["logits"],
                {
                    "decoder_input_ids": {0: batch, 1: target},
                    "encoder_hidden_states": {0: batch, 1: source},
                    "encoder_attention_mask": {0: batch, 1: source},
                },
                opset_version,
            )
            config.to_json_file(directory / "config.json")  # without the remote code: the graphs replace it
            model.generation_config.save_pretrained(directory)
            if tokenizer is not None:
                tokenizer.save_pretrained(directory)
            _record(
                directory,
                "onnx",
                model,
                opset_version=opset_version,
                graphs={
                    "encoder.onnx": "input_ids, attention_mask -> encoder_hidden_states",
                    "decoder.onnx": "decoder_input_ids, encoder_hidden_states, encoder_attention_mask -> logits",
                },
                max_positions=config.max_position_embeddings,
            )
    finally:
        model.set_attn_implementation(implementation)
        model.train(was_training)
    return Path(output_dir)


def _export_graph(module, args, path: Path, input_names, output_names, dynamic_shapes, opset_version) -> None:
    with warnings.catch_warnings():
        # The exporter's notes on the shared batch/source dimensions and pytree deprecations concern its internals.
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.onnx.export(
            module,
            args,
            dynamo=True,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
            opset_version=opset_version,
            external_data=False,
            verbose=False,
        )
    program.save(str(path))


def export(model, tokenizer, output_dir: str | Path, to: str, **options: Any) -> Path:
    """Dispatch to `to_ctranslate2`, `to_marian` or `to_onnx` by name."""
    if to == "ctranslate2":
        return to_ctranslate2(model, tokenizer, output_dir, **options)
    if to == "marian":
        return to_marian(model, tokenizer, output_dir, **options)
    if to == "onnx":
        return to_onnx(model, output_dir, tokenizer=tokenizer, **options)
    raise ValueError(f"unknown export format {to!r}; expected one of {FORMATS}.")


__all__ = [
    "FORMATS",
    "building_directory",
    "check_ctranslate2",
    "check_marian",
    "ctranslate2_spec",
    "ctranslate2_translate_options",
    "export",
    "to_ctranslate2",
    "to_marian",
    "to_onnx",
]
