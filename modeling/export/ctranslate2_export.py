"""CTranslate2: a `TransformerSpec` built from this model's own modules, its vocabulary, and the decoding settings of
the generation config that CTranslate2 can express (`translate_options.json`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedTokenizerBase

from ..configuration_transformer import TransformerConfig
from ..files import write_json
from ..generation_transformer import FAIRSEQ_MAX_LEN_A, FAIRSEQ_MAX_LEN_B
from ..modeling_transformer import TransformerForConditionalGeneration
from .common import (
    building_directory,
    check_model,
    paper_decoding_not_expressed,
    refuse,
    single_eos,
    within_positions,
    write_record,
)

CTRANSLATE2_OPTIONS_FILE = "translate_options.json"
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
# Settings of a generation config that change generate()'s translations and that the options leave out, with the
# value that changes nothing (suppress_tokens, also left out, is listed with its own reason).
DECODING_SETTINGS_NOT_PASSED_ON = {
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "bad_words_ids": [],
    "sequence_bias": {},
    "begin_suppress_tokens": [],
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
}
CTRANSLATE2_QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16")


def _ctranslate2_vocabulary(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> list[str]:
    """The tokenizer's tokens in id order, as many as the model's vocabulary (CTranslate2 maps tokens to ids by
    their position in this list). Rows beyond the tokenizer (an embedding matrix resized upwards) get placeholder
    tokens that no input contains."""
    vocab = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    unused = sorted(set(range(len(tokens))) - set(vocab.values()))  # a gap, or ids shared or out of range
    if unused:
        more = ", ..." if len(unused) > 10 else ""
        raise ValueError(
            f"cannot export to CTranslate2: the tokenizer's ids are not 0, 1, ..., {len(tokens) - 1}: no token has "
            f"id {', '.join(map(str, unused[:10]))}{more}."
        )
    if len(tokens) > vocab_size:
        refuse("vocab_size", vocab_size, "CTranslate2", f"the tokenizer has {len(tokens)} tokens, more than rows")
    return tokens + [f"<unused_{index}>" for index in range(len(tokens), vocab_size)]


def check_ctranslate2(model: TransformerForConditionalGeneration) -> TransformerForConditionalGeneration:
    """`check_model(model)`, refused, naming the field, where a CTranslate2 `TransformerSpec` cannot compute it
    exactly."""
    model = check_model(model)
    config: TransformerConfig = model.config
    if config.activation_function not in CTRANSLATE2_ACTIVATIONS:
        refuse("activation_function", config.activation_function, "CTranslate2", "it has no such activation")
    single_eos(config, "CTranslate2")
    if config.decoder_start_token_id is None:
        refuse("decoder_start_token_id", None, "CTranslate2", "the decoder needs a start token")
    return model


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


def ctranslate2_spec(model: TransformerForConditionalGeneration, tokenizer: PreTrainedTokenizerBase) -> Any:
    """A `ctranslate2.specs.TransformerSpec` (`Any`: ctranslate2 is imported here, lazily) holding this model:
    post-LayerNorm encoder and decoder without final LayerNorm, no embedding LayerNorm, the decoder starting from
    `decoder_start_token_id`'s embedding."""
    from ctranslate2.specs import common_spec, transformer_spec

    model = check_ctranslate2(model)
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
    eos = single_eos(config, "CTranslate2")
    # CTranslate2 needs an unknown token: without the tokenizer's, one no translation holds, so that
    # `disable_unk=True` forbids neither the end of sentence nor the start
    starts = {eos, config.decoder_start_token_id}
    spec.config.unk_token = tokenizer.unk_token or next(token for i, token in enumerate(tokens) if i not in starts)
    spec.config.eos_token = tokens[eos]
    spec.config.decoder_start_token = tokens[config.decoder_start_token_id]
    spec.config.bos_token = tokenizer.bos_token if tokenizer.bos_token is not None else spec.config.decoder_start_token
    spec.config.layer_norm_epsilon = float(config.layer_norm_eps)
    return spec


def _new_tokens(generation: GenerationConfig, bound: str) -> int | None:
    """`generation`'s bound ("max" or "min") on the new tokens of every sentence as generate() applies it:
    `{bound}_new_tokens`, else `{bound}_length` less the decoder start token, which transformers counts in an
    encoder-decoder's lengths; None where it sets neither. The maximum counts the end-of-sentence, the minimum the
    tokens before it (`min_new_tokens=5`: end-of-sentence from the 6th on), as CTranslate2's decoding lengths do."""
    new_tokens, length = getattr(generation, f"{bound}_new_tokens"), getattr(generation, f"{bound}_length")
    if new_tokens is not None:
        return new_tokens
    return length - 1 if length is not None else None


def ctranslate2_translate_options(model: TransformerForConditionalGeneration) -> tuple[dict[str, Any], list[str]]:
    """`Translator.translate_batch` keyword arguments for the model's generation config, and what of it they
    cannot express.

    `beam_size` and `length_penalty` (CTranslate2 applies it as score / length ** alpha, as transformers does) are
    the generation config's; CTranslate2 stops a sentence's search once `beam_size` hypotheses have finished, as
    `early_stopping=True` does. `max_decoding_length` counts the end-of-sentence token, as `max_new_tokens` does:
    it is the new tokens generate() allows (`_new_tokens`: `max_new_tokens`, else `max_length` less the decoder
    start token) when the config caps them, else the positional table's length under the paper's per-sentence
    limit (`max_length_offset`: the longest source CTranslate2 takes may run that far), else 256 (CTranslate2's
    default; listed, as generate() then stops at transformers' default of 20 new tokens), within the positional
    table.
    `min_decoding_length` is `min_new_tokens` (else `min_length` less the decoder start token): 0 allows an empty
    translation, as `generate()` does by default (CTranslate2's default, 1, does not; fairseq's decoding sets 1);
    CTranslate2 removes the blocked end-of-sentence before its softmax, generate() after it (listed).
    `max_input_length` is the positional table's length (listed: CTranslate2 cuts longer sources there).

    fairseq's limit (`max_length_a`, `max_length_b`: int(a · W + b) tokens, then a forced end-of-sentence that keeps
    its log-probability) becomes `max_decoding_length` = int(a · max_input_length + b), capped as generate() caps it:
    exact while no hypothesis reaches it (CTranslate2 stops there without an end-of-sentence and its score), and
    with a = 0 the same limit for every batch. The top hypothesis does not depend on `beam_finalization`.
    """
    model.undo_library_default_fill()  # as generate() does: a plain Seq2SeqTrainer's max_length=20 caps nothing
    generation = model.generation_config
    positions = model.config.max_position_embeddings
    cap = _new_tokens(generation, "max")
    # Uncapped, the paper's limit (source + offset) lets a source of up to max_input_length tokens run on to the
    # table: CTranslate2's 256 cut the translations that generate() lets run past it (sources over 206 tokens).
    offset = getattr(generation, "max_length_offset", None)
    uncapped = positions if offset is not None else 256
    limit = cap if cap is not None else uncapped
    a, b = getattr(generation, "max_length_a", None), getattr(generation, "max_length_b", None)
    fairseq_limit = a is not None or b is not None
    if fairseq_limit:
        # the defaults generate() gives the one not set
        a, b = FAIRSEQ_MAX_LEN_A if a is None else a, FAIRSEQ_MAX_LEN_B if b is None else b
        limit = min(int(a * positions + b), positions - 1, *([cap] if cap is not None else []))
    options: dict[str, Any] = {
        "beam_size": int(generation.num_beams or 1),
        "length_penalty": float(generation.length_penalty if generation.length_penalty is not None else 1.0),
        "max_input_length": positions,
        "max_decoding_length": min(int(limit), positions),
        "min_decoding_length": max(_new_tokens(generation, "min") or 0, 0),
    }
    not_expressed = paper_decoding_not_expressed(model, "CTranslate2")
    not_expressed.append(
        f"max_input_length={positions}: CTranslate2 cuts a longer source to its first {positions} tokens (the "
        "positional table's rows), where generate() encodes it whole; the tokenizer exported with it warns of one "
        f"(model_max_length at most {positions})"
    )
    if cap is None and offset is None and not fairseq_limit:
        not_expressed.append(
            f"no max_length or max_new_tokens: CTranslate2 stops every sentence at max_decoding_length="
            f"{options['max_decoding_length']} tokens (its default, within the positional table), where generate() "
            "stops at transformers' default of 20 new tokens"
        )
    if cap is not None and not fairseq_limit and cap > options["max_decoding_length"]:
        not_expressed.append(
            f"a limit of {cap} new tokens (max_length or max_new_tokens): CTranslate2 stops every sentence at "
            f"max_decoding_length={options['max_decoding_length']} tokens (it has no position beyond the positional "
            f"table), where generate() lets a translation run on to {cap}"
        )
    if fairseq_limit:
        forced = getattr(generation, "forced_eos_keeps_log_prob", False)
        not_expressed.append(
            f"max_length_a={a}, max_length_b={b}: CTranslate2 stops a hypothesis at max_decoding_length tokens "
            "without an end-of-sentence"
            + (", where generate() forces one that keeps its log-probability" if forced else "")
            + (f", and its limit does not follow each batch's source width (a = {a})" if a else "")
            + ": the same translations while no sentence reaches the limit"
        )
    if options["min_decoding_length"]:
        not_expressed.append(
            f"min_new_tokens={options['min_decoding_length']}: CTranslate2 removes the end-of-sentence before its "
            "softmax, renormalising each beam's distribution, where generate() masks it after the log-softmax: the "
            "same translations while the blocked end-of-sentence is improbable"
        )
    if generation.suppress_tokens:
        not_expressed.append(
            f"suppress_tokens={list(generation.suppress_tokens)}: not passed on (generate() masks them after the "
            "log-softmax)"
        )
    for name, no_effect in DECODING_SETTINGS_NOT_PASSED_ON.items():
        value = getattr(generation, name, None)
        if value is not None and value != no_effect:
            not_expressed.append(f"{name}={value!r}: not passed on (CTranslate2 decodes as if it were unset)")
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


def detokenize(tokens):  # without special tokens, as `modeling.translation.translate` decodes
    return tokenizer.decode(tokenizer.convert_tokens_to_ids(tokens), skip_special_tokens=True)


print([detokenize(r.hypotheses[0]) for r in results])
```

A translation is decoded as `translate` decodes it: the special tokens the model emits (its `<unk>`, a special token
added to the tokenizer, the placeholder of an embedding row beyond the tokenizer) are left out of the text.

A file of one sentence per line: CTranslate2 reads it in chunks, sorts each by length into batches of at most
`max_batch_size` tokens, and writes one line per line, in order (a line empty or of spaces stays empty; the
others are stripped, as `modeling.translation.translate` strips them; a line of invisible characters only, which
`translate` leaves empty, is translated). It writes each translation as `target_detokenize_fn` gives it: a line
break in one ("\\r", U+2028, ...: a model trained on web text emits them) becomes a space there and the translation is
stripped, as `translate` makes it, or the file would hold more lines than the source, every later one beside another
sentence.

```python
def one_line(tokens):
    return " ".join(detokenize(tokens).splitlines()).strip()


translator.translate_file(
    "news.en",
    "news.de",
    max_batch_size=4096,
    batch_type="tokens",
    source_tokenize_fn=lambda line: tokenizer.convert_ids_to_tokens(tokenizer(line.strip())["input_ids"]),
    target_detokenize_fn=one_line,
    **options,
)
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

    if quantization is not None and quantization not in CTRANSLATE2_QUANTIZATIONS + ("float32",):
        raise ValueError(
            f"unknown quantization {quantization!r}; expected float32 (the default) or one of "
            f"{CTRANSLATE2_QUANTIZATIONS}."
        )
    if tokenizer is None:  # `export` passes the None that MarianMT and ONNX take; this failed in the converter
        raise ValueError(
            "cannot export to CTranslate2 without a tokenizer: its vocabulary (shared_vocabulary.json) is the "
            "tokenizer's tokens in id order; pass the model's tokenizer."
        )
    model = check_ctranslate2(model)
    options, not_expressed = ctranslate2_translate_options(model)

    class ModelConverter(Converter):
        """CTranslate2's converter machinery (validation, quantisation, serialisation) on the spec above."""

        def _load(self):
            return ctranslate2_spec(model, tokenizer)

    output_dir = Path(output_dir)
    with building_directory(output_dir) as directory:
        ModelConverter().convert(str(directory), quantization=quantization, force=True)
        within_positions(tokenizer, model.config.max_position_embeddings).save_pretrained(directory)
        write_json(directory / CTRANSLATE2_OPTIONS_FILE, options)
        write_record(
            directory, "ctranslate2", model, quantization=quantization or "float32", not_expressed=not_expressed
        )
        readme = CTRANSLATE2_README.format(
            source=getattr(model.config, "_name_or_path", "") or "an in-memory model",
            name=output_dir.name,
            options_file=CTRANSLATE2_OPTIONS_FILE,
            options=json.dumps(options),
            not_expressed="".join(f"\nNot expressed: {line}.\n" for line in not_expressed),
        )
        (directory / "README.md").write_text(readme, encoding="utf-8")
    return output_dir
