"""fairseq's Transformer translation models in this model, exactly: weights, positions, decoding and text pipeline.

fairseq's `transformer` architectures with post-LayerNorm, sinusoidal positions and all embeddings shared
(`--share-all-embeddings`) are the paper's model: `transformer.wmt16.en-de` (Ott et al., 2018) is
`transformer_vaswani_wmt_en_de_big`. What differs from this model's defaults, each a config or generation-config
field (checked against fairseq 0.12's sources; `tests/fixtures/fairseq` holds what fairseq itself computed):

- sinusoid frequencies exp(-ln(10000) · i / (d/2 - 1)) in float32 (`positional_encoding_frequencies=
  "tensor2tensor"`), sines then cosines (`positional_encoding_layout="concatenated"`), the first token at position
  padding_idx + 1 = 2 (`positional_encoding_offset=2`);
- biases on every attention projection (`attention_bias=True`);
- the dictionary `<s>`=0 `<pad>`=1 `</s>`=2 `<unk>`=3 then the file's tokens; decoding starts from `</s>`;
- fairseq's beam search (`generation_transformer.set_fairseq_decoding`).

The checkpoint is read without fairseq (`torch.load(weights_only=True)`, argparse.Namespace allowed), and anything
this model cannot compute exactly is refused in one line naming the field: pre-LN, learned or missing positions,
LayerNorm on embeddings, untied or separate embeddings, adaptive softmax or input, another activation, ... and any
state-dict key outside the expected set.

The tokenizer is `tokenization_fairseq.FairseqTokenizer` (Moses + subword-nmt, as fairseq-interactive's
`--tokenizer moses --bpe subword_nmt`), built from the dictionary and the BPE codes (the data-bin's `bpecodes` unless
given); with `pretokenized=True` instead the text is taken as already tokenised and BPE-split.
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoints import (
    CONVERSION_FILE,  # the record a conversion writes beside the model; the card reads it
    MODEL_CARD_FILES,
)
from .configuration_transformer import TransformerConfig
from .files import check_replaceable, file_sha256, iter_lines, replacing_directory, write_error, write_json
from .generation_transformer import set_fairseq_decoding
from .modeling_transformer import TransformerForConditionalGeneration
from .tokenization_fairseq import FairseqTokenizer, converted_spelling

# fairseq's Dictionary: these four first, then the dictionary file's tokens in order.
SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
BOS, PAD, EOS, UNK = range(4)
# What Moses' aggressive dash splitting (`tokenizer.perl -a`) puts between a word's parts: in a dictionary only
# where the training text was tokenised with it.
SPLIT_DASH = "@-@"
# Decoding of the published commands (fairseq's README for these models: --beam 4 --lenpen 0.6, as Ott et al.
# evaluate; fairseq's defaults --max-len-a 0 --max-len-b 200).
PUBLISHED_DECODING = {"num_beams": 4, "length_penalty": 0.6, "max_length_a": 0, "max_length_b": 200}

# fairseq's base_architecture defaults of the fields read below where a checkpoint that predates them lacks them (the
# fields REQUIRED_VALUES checks take None as "off", as fairseq does).
ARCHITECTURE_DEFAULTS: dict[str, Any] = {
    "no_scale_embedding": False,
    "max_source_positions": 1024,
    "max_target_positions": 1024,
}
# field: (the value this model computes, what another value would be)
REQUIRED_VALUES: dict[str, tuple[Any, str]] = {
    "encoder_normalize_before": (False, "pre-LayerNorm encoder; this model is post-LayerNorm"),
    "decoder_normalize_before": (False, "pre-LayerNorm decoder; this model is post-LayerNorm"),
    "encoder_learned_pos": (False, "learned encoder positions; this model's are sinusoidal"),
    "decoder_learned_pos": (False, "learned decoder positions; this model's are sinusoidal"),
    "no_token_positional_embeddings": (False, "no positional embeddings"),
    "layernorm_embedding": (False, "LayerNorm on the embeddings"),
    "activation_fn": ("relu", "only ReLU (the paper's) is converted"),
    "adaptive_softmax_cutoff": (None, "adaptive softmax"),
    "adaptive_input": (False, "adaptive input embeddings"),
    "tie_adaptive_weights": (False, "adaptive softmax tied to adaptive input"),
    "cross_self_attention": (False, "cross+self attention"),
    "no_cross_attention": (False, "a decoder without encoder attention"),
    "quant_noise_pq": (0, "quantization noise"),
    # fairseq's task builds such a model with every Linear and Embedding replaced by its 8-bit counterpart, which
    # evaluates fully quantized (weights and activations): not what these float32 weights compute.
    "quant_noise_scalar": (0, "scalar quantization noise: fairseq evaluates the model quantized to 8 bits"),
    "encoder_layers_to_keep": (None, "pruned encoder layers"),
    "decoder_layers_to_keep": (None, "pruned decoder layers"),
    "base_layers": (0, "BASE layers"),
    "scale_attn": (False, "NormFormer's attention scaling"),
    "scale_fc": (False, "NormFormer's feed-forward scaling"),
    "scale_heads": (False, "NormFormer's head scaling"),
    "scale_resids": (False, "NormFormer's residual scaling"),
    "char_inputs": (False, "character inputs"),
    "encoder_xformers_att_config": (None, "xFormers attention"),
    "decoder_xformers_att_config": (None, "xFormers attention"),
    "merge_src_tgt_embed": (False, "merged source and target embeddings"),
    # LayerDrop (encoder_layerdrop, decoder_layerdrop) is not checked: fairseq keeps every layer at inference.
    "share_all_embeddings": (
        True,
        "encoder, decoder and output projection must share one embedding matrix (--share-all-embeddings), "
        "as this model's do",
    ),
}

_LAYER_KEY = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(.+)$")
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
_ENCODER_LAYER_PARTS = {
    **{f"self_attn.{p}.{w}": f"self_attn.{p}.{w}" for p in _PROJECTIONS for w in ("weight", "bias")},
    **{f"self_attn_layer_norm.{w}": f"self_attn_layer_norm.{w}" for w in ("weight", "bias")},
    **{f"fc{n}.{w}": f"ffn.fc{n}.{w}" for n in (1, 2) for w in ("weight", "bias")},
    **{f"final_layer_norm.{w}": f"final_layer_norm.{w}" for w in ("weight", "bias")},
}
_DECODER_LAYER_PARTS = {
    **_ENCODER_LAYER_PARTS,
    **{f"encoder_attn.{p}.{w}": f"encoder_attn.{p}.{w}" for p in _PROJECTIONS for w in ("weight", "bias")},
    **{f"encoder_attn_layer_norm.{w}": f"encoder_attn_layer_norm.{w}" for w in ("weight", "bias")},
}
_LAYER_PARTS = {"encoder": _ENCODER_LAYER_PARTS, "decoder": _DECODER_LAYER_PARTS}
# Keys fairseq itself ignores or rebuilds: stack versions, the sinusoid table's placeholder (old: the table).
_IGNORED_KEY = re.compile(r"^(encoder|decoder)\.(version|embed_positions\._float_tensor|embed_positions\.weights)$")


logger = logging.getLogger(__name__)


class FairseqConversionError(ValueError):
    """A fairseq checkpoint or dictionary this model cannot represent exactly (the message names the field), or a
    file that is no readable checkpoint (the message names the file)."""


def _refuse(field: str, value: Any, why: str) -> None:
    raise FairseqConversionError(f"cannot convert this fairseq model exactly: {field}={value!r} ({why}).")


# --------------------------------------------------------------------------------------------------------------
# Reading fairseq's files
# --------------------------------------------------------------------------------------------------------------


def load_fairseq_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint's top-level dict, read without fairseq: `torch.load(weights_only=True)`, allowing only
    `argparse.Namespace` (fairseq's model arguments) and numpy's arrays and scalars of numbers (the metrics that
    fairseq ≥ 0.10 keeps in `extra_state`, e.g. `--eval-bleu`'s counts) besides tensors and plain containers.

    A checkpoint in torch's zip format (torch.save's since torch 1.6) is memory-mapped: its tensors are read from
    the file when used, and the optimizer state a training checkpoint holds (`last_optimizer_state`: Adam's two
    moments, twice the model in float32) never is. One in the legacy format (fairseq's published models of 2018-19)
    cannot be mapped, and is read whole."""
    path = Path(path)
    if path.is_dir():  # fairseq's --save-dir, given for the file in it
        raise IsADirectoryError(
            f"fairseq checkpoint {path} is a directory: give a checkpoint file in it (model.pt, checkpoint_best.pt)."
        )
    if not path.is_file():
        models = str(path).split(":")
        # fairseq's ensemble syntax, which the published wmt19 commands use
        if len(models) > 1 and all(Path(model).is_file() for model in models):
            raise FairseqConversionError(
                f"fairseq checkpoint {path} is an ensemble of {len(models)} checkpoints (fairseq's --path A.pt:B.pt), "
                "which averages their predictions: no one model computes that; convert one of them."
            )
        raise FileNotFoundError(f"fairseq checkpoint {path} does not exist.")
    with torch.serialization.safe_globals([argparse.Namespace, *_numpy_data_globals()]):
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=_is_zip_format(path))
        except OSError:
            raise  # unreadable for the system's reasons (permissions, ...): its message already names the file
        except Exception as error:
            # torch.load has no error of its own for a file that is not a checkpoint: a truncated zip is a
            # RuntimeError, an empty file an EOFError, a text file an IndexError or an UnpicklingError, ...
            detail = _load_error_detail(error) if path.stat().st_size else "the file is empty"
            if isinstance(error, pickle.UnpicklingError) and _UNSAFE_PICKLE.search(detail):
                raise FairseqConversionError(
                    f"cannot read {path} safely (torch.load with weights_only=True): {detail}"
                ) from error
            raise FairseqConversionError(
                f"{path} is not a readable PyTorch checkpoint (truncated or not a checkpoint): {detail}"
            ) from error
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("model"), dict):
        raise FairseqConversionError(f"{path} is not a fairseq checkpoint: no 'model' state dict in it.")
    return checkpoint


def _is_zip_format(path: Path) -> bool:
    """Whether `path` begins as torch.save's zip format does (the test `torch.load` itself makes)."""
    with open(path, "rb") as handle:
        return handle.read(4) == b"PK\x03\x04"


def _numpy_data_globals() -> list[Any]:
    """What unpickling numpy arrays and scalars of numbers takes: no code of the file's choosing (an array of
    Python objects would still need globals that stay refused)."""
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    numbers = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    numbers += ("float16", "float32", "float64")
    # A pickle names the module of the numpy that wrote it: numpy.core before numpy 2 (fairseq's years), then
    # numpy._core.
    functions = [multiarray._reconstruct, multiarray.scalar]
    older = [(function, f"numpy.core.multiarray.{function.__name__}") for function in functions]
    return [*functions, *older, np.ndarray, np.dtype, *(type(np.dtype(name)) for name in numbers)]


# What the weights-only unpickler says of a pickle holding objects it does not allow (as opposed to data that is no
# pickle torch wrote: "Unsupported operand 35" for a text file).
_UNSAFE_PICKLE = re.compile(r"unsupported (global|class)|reduce for unrecognized", re.IGNORECASE)


def _load_error_detail(error: Exception) -> str:
    """The one line of a torch.load error that says what is wrong: torch wraps the weights-only unpickler's reason
    in paragraphs of advice ("WeightsUnpickler error: ..."), and follows its zip reader's with one."""
    text = str(error)
    reason = re.search(r"WeightsUnpickler error:\s*(\S.*)", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = reason.group(1).strip() if reason else lines[0] if lines else ""
    return line.split(". ")[0].rstrip(".") or type(error).__name__


def _namespace_or_dict(value: Any) -> dict[str, Any] | None:
    if isinstance(value, argparse.Namespace):
        return dict(vars(value))
    if isinstance(value, dict):
        return dict(value)
    return None


def fairseq_model_args(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The model's arguments: the old top-level `args` where set (fairseq <= 0.9), else `cfg["model"]` (fairseq >=
    0.10 saves `args=None`), flattened (`encoder.embed_dim` -> `encoder_embed_dim`), with the task's fields (`_task`,
    languages, positions)."""
    # fairseq's loader builds its cfg from `args` wherever they are set, whatever `cfg` the checkpoint holds
    model = _namespace_or_dict(checkpoint.get("args"))
    cfg = checkpoint.get("cfg") if model is None else None
    cfg = _namespace_or_dict(cfg) if cfg is not None else None
    if model is None and cfg:
        model = _namespace_or_dict(cfg.get("model"))
    if model is None:
        raise FairseqConversionError("the checkpoint has neither cfg['model'] nor args: no architecture to read.")
    flat: dict[str, Any] = {}
    for key, value in model.items():
        nested = _namespace_or_dict(value) if key in ("encoder", "decoder", "quant_noise") else None
        if nested is not None:
            flat.update({f"{key}_{name}": item for name, item in nested.items()})
        else:
            flat[key] = value
    task = _namespace_or_dict(cfg.get("task")) if cfg and cfg.get("task") is not None else None
    if task is not None:
        flat["_task"] = task.get("_name")
        # a legacy model's copy of the arguments keeps the languages None where fairseq-train inferred them from
        # the data-bin's file names, into the task's config only
        for key in ("source_lang", "target_lang", "max_source_positions", "max_target_positions"):
            if flat.get(key) is None:
                flat[key] = task.get(key)
    else:
        flat["_task"] = flat.get("task")
    flat["_arch"] = flat.get("arch") or flat.get("_name")
    bpe = _namespace_or_dict(cfg.get("bpe")) if cfg and cfg.get("bpe") is not None else None
    flat["_bpe"] = bpe.get("_name") if bpe is not None else flat.get("bpe")
    return flat


def read_fairseq_dictionary(path: str | Path) -> list[str]:
    """The symbols of a fairseq `dict.txt` (`fairseq.data.Dictionary.load`): the four special symbols, then one
    token per line (`token count`), in file order, id = line index + 4."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"fairseq dictionary {path} does not exist.")
    symbols = list(SPECIAL_SYMBOLS)
    seen = set(symbols)
    # iter_lines refuses an invalid UTF-8 line naming the file and the line
    for number, line in enumerate(iter_lines(path), start=1):
        line = line.rstrip()  # a blank line is refused below, as fairseq refuses it
        overwrite = line.endswith(" #fairseq:overwrite")
        if overwrite:
            line = line[: -len(" #fairseq:overwrite")]
        token, _, count = line.rpartition(" ")
        if not token or not _is_int(count):  # what fairseq's `int(count)` reads
            raise FairseqConversionError(f"{path}, line {number}: expected 'token count', got {line!r}.")
        if token in seen:
            # fairseq refuses a duplicate; with #fairseq:overwrite it gives the token a second id (encoding with the
            # new one, decoding both), which one tokenizer vocabulary cannot hold
            why = "a second id for a token" if overwrite else "duplicate token"
            raise FairseqConversionError(f"{path}, line {number}: {why} {token!r}, which cannot be converted.")
        seen.add(token)
        symbols.append(token)
    return symbols


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def tokenizer_vocabulary(symbols: list[str]) -> dict[str, int]:
    """FSMT's spelling of a fairseq BPE dictionary (transformers' FSMT converter does the same): a continued piece
    `x@@` is `x`, a word's last piece `x` is `x</w>`; the special symbols stay as they are."""
    vocabulary: dict[str, int] = {}
    for index, symbol in enumerate(symbols):
        token = symbol if index < len(SPECIAL_SYMBOLS) else converted_spelling(symbol)
        if token in vocabulary:
            raise FairseqConversionError(
                f"cannot convert this fairseq dictionary: {symbol!r} (id {index}) and id {vocabulary[token]} both "
                f"become the tokenizer token {token!r}."
            )
        vocabulary[token] = index
    return vocabulary


def read_bpe_merges(path: str | Path) -> list[str]:
    """The merges of subword-nmt codes, `left right` per line, in rank order. Only version 0.2 codes (the
    `#version: 0.2` header, `</w>` glued to a word's last symbol) are what FSMT's BPE applies; a repeated merge
    keeps its first rank, as subword-nmt does."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"BPE codes {path} is a directory: give the codes file in it (bpecodes, ...).")
    if not path.is_file():
        raise FileNotFoundError(f"BPE codes {path} do not exist.")
    lines = list(iter_lines(path))  # refuses an invalid UTF-8 line naming the file and the line
    first = lines[0].split(" ") if lines else []
    if len(first) == 3 and _is_int(first[2]):  # what fastBPE writes: no header, each merge with its count
        raise FairseqConversionError(
            f"cannot convert these BPE codes: {path} holds fastBPE codes ('left right count' lines, fairseq's --bpe "
            "fastbpe, as the wmt19 archives' bpecodes), and the converted tokenizer applies subword-nmt's."
        )
    if not lines or not lines[0].startswith("#version: 0.2"):
        raise FairseqConversionError(
            f"cannot convert these BPE codes exactly: {path} has no '#version: 0.2' header (subword-nmt's older "
            "format, which marks word ends differently, is not supported)."
        )
    merges, seen = [], set()
    for number, line in enumerate(lines[1:], start=2):
        line = line.strip("\r\n ")
        if not line:
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise FairseqConversionError(f"{path}, line {number}: expected 'left right', got {line!r}.")
        if line not in seen:
            seen.add(line)
            merges.append(line)
    return merges


# --------------------------------------------------------------------------------------------------------------
# The architecture and the weights
# --------------------------------------------------------------------------------------------------------------


def fairseq_config(args: dict[str, Any], state_dict: dict[str, torch.Tensor], vocab_size: int) -> TransformerConfig:
    """This model's config for a fairseq transformer; FairseqConversionError for anything else."""
    arch = args.get("_arch")
    if not (isinstance(arch, str) and arch.startswith("transformer")):
        _refuse("arch", arch, "not one of fairseq's transformer architectures")
    task = args.get("_task")
    if task not in (None, "translation"):
        _refuse("task", task, "only the translation task's models are converted")

    def setting(name: str, default: Any = None) -> Any:
        value = args.get(name)
        return ARCHITECTURE_DEFAULTS.get(name, default) if value is None else value

    for field, (required, why) in REQUIRED_VALUES.items():
        value = args.get(field)
        if required is True:
            matches = bool(value)
        elif required in (False, 0, None):  # None, 0 and False all mean "off" in fairseq's arguments
            matches = not value
        else:  # a field a checkpoint older than it does not have takes its default
            matches = value is None or value == required
        if not matches:
            _refuse(field, value, why)

    embeddings = state_dict.get("encoder.embed_tokens.weight")
    if embeddings is None:
        _refuse("encoder.embed_tokens.weight", None, "missing from the state dict")
    d_model = embeddings.shape[1]
    for side in ("encoder", "decoder"):
        if setting(f"{side}_embed_dim", d_model) != d_model:
            _refuse(f"{side}_embed_dim", setting(f"{side}_embed_dim"), f"the embeddings have {d_model} dimensions")
    for field in ("decoder_input_dim", "decoder_output_dim"):
        if setting(field, d_model) != d_model:
            _refuse(field, setting(field), f"differs from decoder_embed_dim={d_model} (projections in or out)")
    if embeddings.shape[0] != vocab_size:
        _refuse("encoder.embed_tokens.weight", tuple(embeddings.shape), f"the dictionary has {vocab_size} symbols")

    layers, ffn, heads = {}, {}, {}
    for side in ("encoder", "decoder"):
        indices = {int(m.group(2)) for key in state_dict if (m := _LAYER_KEY.match(key)) and m.group(1) == side}
        layers[side] = len(indices)
        if indices != set(range(layers[side])) or not indices:
            _refuse(f"{side}_layers", sorted(indices), "the state dict's layers are not 0, 1, ..., n - 1")
        if setting(f"{side}_layers", layers[side]) != layers[side]:
            _refuse(f"{side}_layers", setting(f"{side}_layers"), f"the state dict holds {layers[side]} layers")
        if f"{side}.layers.0.fc1.weight" not in state_dict:
            _refuse(f"{side}.layers.0.fc1.weight", None, "missing from the state dict")
        ffn[side] = state_dict[f"{side}.layers.0.fc1.weight"].shape[0]
        heads[side] = setting(f"{side}_attention_heads")
        if type(heads[side]) is not int or heads[side] < 1 or d_model % heads[side]:
            _refuse(f"{side}_attention_heads", heads[side], f"must be recorded and divide d_model={d_model}")
    if d_model % 2:
        _refuse("encoder_embed_dim", d_model, "an odd width (fairseq pads its sinusoids with a zero column)")

    no_scale = bool(setting("no_scale_embedding"))
    return TransformerConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        encoder_layers=layers["encoder"],
        decoder_layers=layers["decoder"],
        encoder_attention_heads=heads["encoder"],
        decoder_attention_heads=heads["decoder"],
        encoder_ffn_dim=ffn["encoder"],
        decoder_ffn_dim=ffn["decoder"],
        dropout=float(setting("dropout", 0.1)),
        attention_dropout=float(setting("attention_dropout", 0.0)),
        # fairseq called activation_dropout relu_dropout before 0.6
        activation_dropout=float(setting("activation_dropout", setting("relu_dropout", 0.0))),
        activation_function="relu",
        attention_bias=True,
        # The decoder's positions cap fairseq's length limit (max_target_positions - 1); sources longer than the
        # table are still encoded, from the same formula.
        max_position_embeddings=int(setting("max_target_positions")),
        positional_encoding_layout="concatenated",
        positional_encoding_frequencies="tensor2tensor",
        positional_encoding_offset=PAD + 1,
        scale_embedding=not no_scale,
        tie_word_embeddings=True,
        layer_norm_eps=1e-5,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=EOS,
    )


def _upgraded_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What fairseq's `upgrade_state_dict_named` does to old checkpoints: fused `in_proj_weight/bias` split in
    thirds into q, k, v; `layer_norms.0/1(/2)` renamed; the output projection taken from the tied embeddings."""
    upgraded: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        match = re.match(r"^(.+)\.in_proj_(weight|bias)$", key)
        if match:
            if tensor.dim() == 0 or tensor.shape[0] % 3:
                _refuse(key, tuple(tensor.shape), "fused q, k, v projections whose rows do not split in thirds")
            for name, part in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0), strict=True):
                upgraded[f"{match.group(1)}.{name}.{match.group(2)}"] = part
            continue
        match = re.match(r"^(encoder|decoder)(\.layers\.\d+)\.layer_norms\.(\d)\.(weight|bias)$", key)
        if match:
            side, layer, index, kind = match.groups()
            names = ("self_attn_layer_norm", "final_layer_norm")
            if side == "decoder":
                names = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")
            if int(index) >= len(names):
                _refuse(key, tuple(tensor.shape), "an unexpected state-dict key")
            upgraded[f"{side}{layer}.{names[int(index)]}.{kind}"] = tensor
            continue
        upgraded[key] = tensor
    return upgraded


def fairseq_state_dict(
    state_dict: dict[str, torch.Tensor], shapes: dict[str, torch.Size] | None = None
) -> dict[str, torch.Tensor]:
    """This model's state dict from fairseq's; refuses any key outside the expected set, embeddings that are
    not one matrix, and a layer's tensor of another shape than `shapes` (this model's, by its key) gives."""
    state_dict = _upgraded_state_dict(state_dict)
    shared = state_dict.get("encoder.embed_tokens.weight")
    if shared is None:
        _refuse("encoder.embed_tokens.weight", None, "missing from the state dict")
    for key in ("decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        tensor = state_dict.get(key)
        if tensor is None and key == "decoder.embed_tokens.weight":
            _refuse(key, None, "missing from the state dict")
        if tensor is not None and not torch.equal(tensor, shared):
            _refuse(key, "a matrix of its own", "this model shares one matrix with encoder.embed_tokens.weight")
    ours: dict[str, torch.Tensor] = {"model.shared.weight": shared}
    handled = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"}
    layers: set[tuple[str, str]] = set()  # (side, index) of every layer the checkpoint holds a part of
    for key, tensor in state_dict.items():
        if key in handled or _IGNORED_KEY.match(key):
            continue
        match = _LAYER_KEY.match(key)
        parts = _LAYER_PARTS[match.group(1)] if match else {}
        if not match or match.group(3) not in parts:
            why = "an untied output projection" if key == "decoder.embed_out" else "an unexpected state-dict key"
            if key.endswith("layer_norm.weight") and key.count(".") == 2:
                why = "a final LayerNorm after the stack (pre-LN)"
            _refuse(key, tuple(tensor.shape), why)
        side, index, part = match.groups()
        layers.add((side, index))
        name = f"model.{side}.layers.{index}.{parts[part]}"
        # a damaged checkpoint: fairseq's layers are alike, and the config took its sizes from layer 0
        expected = (shapes or {}).get(name, tensor.shape)
        if tensor.shape != expected:
            _refuse(key, tuple(tensor.shape), f"the config read from the checkpoint gives {tuple(expected)}")
        ours[name] = tensor
    # Refused here, a missing part is named as fairseq names it; `load_state_dict` would name this model's
    # key among many lines.
    for side, index in sorted(layers):  # the same key named on every run
        for part in _LAYER_PARTS[side]:
            if f"{side}.layers.{index}.{part}" not in state_dict:
                _refuse(f"{side}.layers.{index}.{part}", None, "missing from the state dict")
    ours["model.encoder.embed_tokens.weight"] = shared
    ours["model.decoder.embed_tokens.weight"] = shared
    ours["lm_head.weight"] = shared
    return ours


# --------------------------------------------------------------------------------------------------------------
# The conversion
# --------------------------------------------------------------------------------------------------------------


def fairseq_tokenizer(
    symbols: list[str],
    *,
    source_lang: str,
    target_lang: str,
    bpe_codes: str | Path | None = None,
    model_max_length: int | None = None,
) -> FairseqTokenizer:
    """The tokenizer of fairseq-interactive's `--tokenizer moses --bpe subword_nmt --bpe-codes CODES`, or, without
    codes, of fairseq's input without them (already tokenised and BPE-split; see `tokenization_fairseq`). Dashes
    are split as Moses' `-a` splits them only where `symbols` hold its `@-@`, as the training text did."""
    vocabulary = tokenizer_vocabulary(symbols)
    merges = read_bpe_merges(bpe_codes) if bpe_codes is not None else []
    with tempfile.TemporaryDirectory() as directory:  # the tokenizer reads its files once, when built
        files = {name: Path(directory) / name for name in ("vocab-src.json", "vocab-tgt.json", "merges.txt")}
        try:
            for name in ("vocab-src.json", "vocab-tgt.json"):
                files[name].write_text(json.dumps(vocabulary, ensure_ascii=False), encoding="utf-8")
            files["merges.txt"].write_text("".join(merge + "\n" for merge in merges), encoding="utf-8")
        except OSError as error:  # a full TMPDIR was "[Errno 28] No space left on device", naming no file
            raise (write_error(error, directory) or error) from error
        extra = {"model_max_length": model_max_length} if model_max_length else {}
        return FairseqTokenizer(
            langs=[source_lang, target_lang],
            src_vocab_file=str(files["vocab-src.json"]),
            tgt_vocab_file=str(files["vocab-tgt.json"]),
            merges_file=str(files["merges.txt"]),
            pretokenized=bpe_codes is None,
            aggressive_dash_splits=SPLIT_DASH in symbols,
            **extra,
        )


def from_fairseq(
    checkpoint: str | Path,
    data_bin: str | Path,
    *,
    source_lang: str,
    target_lang: str,
    bpe_codes: str | Path | None = None,
    pretokenized: bool = False,
) -> tuple[TransformerForConditionalGeneration, FairseqTokenizer]:
    """This model and its tokenizer for a fairseq transformer checkpoint (`model.pt`), the folder holding its
    dictionaries (`dict.{source_lang}.txt`, `dict.{target_lang}.txt`, as fairseq-preprocess writes them) and its
    subword-nmt codes: `bpe_codes`, or the folder's `bpecodes`; `pretokenized=True` instead takes text already
    Moses-tokenised and BPE-split, and gives tokenised outputs. Neither codes nor `pretokenized` is refused.

    The model gives fairseq's log-probabilities (float32) and, with its generation config (fairseq's decoding
    with the published commands' `--beam 4 --lenpen 0.6`), fairseq's translations; the tokenizer gives fairseq's
    token ids and detokenised output. FairseqConversionError (a ValueError) names what cannot be converted.
    """
    model, tokenizer, _ = _convert(checkpoint, data_bin, source_lang, target_lang, bpe_codes, pretokenized)
    return model, tokenizer


def _bpe_codes_to_use(data_bin: Path, bpe_codes: str | Path | None, pretokenized: bool) -> str | Path | None:
    """The subword-nmt codes the tokenizer applies: those given, else the data-bin's `bpecodes` (where a published
    archive keeps them), None only when asked for (`pretokenized`): a tokenizer without codes meets raw text with
    `<unk>` for every word not split already, and says nothing."""
    if pretokenized:
        if bpe_codes is not None:
            raise ValueError("Give BPE codes or pretokenized, not both: pretokenized takes text already BPE-split.")
        return None
    if bpe_codes is not None:
        return bpe_codes
    if (data_bin / "bpecodes").is_file():
        codes = data_bin / "bpecodes"
        logger.warning("Using the BPE codes %s (pretokenized=True: none, for text BPE-split already)", codes)
        return codes
    raise ValueError(
        f"{data_bin} holds no bpecodes: give the model's subword-nmt codes (--bpe-codes), or --pretokenized "
        "(pretokenized=True) for inputs already Moses-tokenised and BPE-split."
    )


def _convert(checkpoint, data_bin, source_lang: str, target_lang: str, bpe_codes, pretokenized: bool):
    data_bin = Path(data_bin)
    if source_lang == target_lang:
        raise FairseqConversionError(f"source and target language are both {source_lang!r}.")
    # before the codes are looked for in it: a mistyped folder "holds no bpecodes", and --pretokenized was advised
    if not data_bin.is_dir():
        raise NotADirectoryError(
            f"fairseq data-bin {data_bin} is not a directory: give the folder holding dict.{source_lang}.txt and "
            f"dict.{target_lang}.txt."
        )
    bpe_codes = _bpe_codes_to_use(data_bin, bpe_codes, pretokenized)
    symbols = read_fairseq_dictionary(data_bin / f"dict.{source_lang}.txt")
    if read_fairseq_dictionary(data_bin / f"dict.{target_lang}.txt") != symbols:
        _refuse(
            f"dict.{target_lang}.txt",
            f"differs from dict.{source_lang}.txt",
            "separate dictionaries; this model shares one vocabulary (fairseq-preprocess --joined-dictionary)",
        )
    if bpe_codes is not None:
        read_bpe_merges(bpe_codes)  # refused before the (large) checkpoint is read
    loaded = load_fairseq_checkpoint(checkpoint)
    args = fairseq_model_args(loaded)
    for name, given in (("source_lang", source_lang), ("target_lang", target_lang)):
        if args.get(name) not in (None, given):
            raise FairseqConversionError(f"the checkpoint was trained with {name}={args[name]!r}, not {given!r}.")
    # fastBPE's merges are applied as subword-nmt's; any other recorded --bpe split the model's text otherwise (a
    # sentencepiece dictionary's words would all be <unk> to these codes)
    if bpe_codes is not None and args.get("_bpe") not in (None, "subword_nmt", "fastbpe"):
        _refuse(
            "bpe",
            args["_bpe"],
            "the model's text was split so, and the converted tokenizer applies subword-nmt codes; --pretokenized "
            "takes text split already",
        )
    state_dict = {key: tensor for key, tensor in loaded["model"].items() if isinstance(tensor, torch.Tensor)}
    del loaded
    config = fairseq_config(args, state_dict, len(symbols))
    model = TransformerForConditionalGeneration(config)
    weights = fairseq_state_dict(state_dict, {key: tensor.shape for key, tensor in model.state_dict().items()})
    # fairseq computes in float32 whatever the stored precision (fp16-trained checkpoints store halves)
    model.load_state_dict({key: tensor.float() for key, tensor in weights.items()}, strict=True)
    model.eval()
    set_fairseq_decoding(model.generation_config, pad_token_id=PAD, **PUBLISHED_DECODING)
    tokenizer = fairseq_tokenizer(
        symbols,
        source_lang=source_lang,
        target_lang=target_lang,
        bpe_codes=bpe_codes,
        model_max_length=int(args.get("max_source_positions") or ARCHITECTURE_DEFAULTS["max_source_positions"]),
    )
    record = {
        "source": "fairseq",
        "checkpoint": Path(checkpoint).name,
        "checkpoint_sha256": file_sha256(checkpoint),
        "arch": args.get("_arch"),
        "source_lang": source_lang,
        "target_lang": target_lang,
        "bpe_codes": Path(bpe_codes).name if bpe_codes is not None else None,
        "text": _text_pipeline(tokenizer, bpe_codes),
        "decoding": {name: getattr(model.generation_config, name) for name in PUBLISHED_DECODING},
        "fairseq_command": (
            f"fairseq-interactive DATA_BIN --path {Path(checkpoint).name} --source-lang {source_lang} "
            f"--target-lang {target_lang} --beam {PUBLISHED_DECODING['num_beams']} "
            f"--lenpen {PUBLISHED_DECODING['length_penalty']}"
            + (f" {_fairseq_text_options(tokenizer)} --bpe-codes BPE_CODES" if bpe_codes is not None else "")
        ),
    }
    return model, tokenizer, record


def _fairseq_text_options(tokenizer: FairseqTokenizer) -> str:
    """fairseq-interactive's options for what the converted tokenizer does (it splits dashes unless told not to)."""
    dashes = "" if tokenizer.aggressive_dash_splits else " --moses-no-dash-splits"
    return f"--tokenizer moses{dashes} --bpe subword_nmt"


def _text_pipeline(tokenizer: FairseqTokenizer, bpe_codes: str | Path | None) -> str:
    """What the converted tokenizer does to text, as the card says it."""
    if bpe_codes is None:
        return "already Moses-tokenised and BPE-split (converted with pretokenized=True); outputs are tokenised text"
    pipeline = f"Moses + subword-nmt, as fairseq-interactive {_fairseq_text_options(tokenizer)}"
    if tokenizer.aggressive_dash_splits:
        return pipeline
    return f"{pipeline}: dashes kept in words (Moses without -a), as the dictionary has no {SPLIT_DASH}"


def convert_fairseq(
    checkpoint: str | Path,
    data_bin: str | Path,
    output_dir: str | Path,
    *,
    source_lang: str,
    target_lang: str,
    bpe_codes: str | Path | None = None,
    pretokenized: bool = False,
) -> Path:
    """`from_fairseq`, saved into `output_dir`: weights (float32), config, generation config, the remote code of the
    model and of the tokenizer (the directory loads with `trust_remote_code=True` where this project is not
    installed), the tokenizer and `fairseq_conversion.json` (where it came from; the model card reads it).

    The directory appears whole or not at all (built as `OUT.partial`, then renamed), and replaces only a previous
    conversion; nothing is written when the model is refused."""
    output_dir = Path(output_dir)
    what = "a converted fairseq model"
    check_replaceable(output_dir, CONVERSION_FILE, what)  # before the conversion's work
    model, tokenizer, record = _convert(checkpoint, data_bin, source_lang, target_lang, bpe_codes, pretokenized)
    with replacing_directory(output_dir, CONVERSION_FILE, what, regenerated=MODEL_CARD_FILES) as directory:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        write_json(directory / CONVERSION_FILE, record)
    return output_dir


__all__ = [
    "CONVERSION_FILE",
    "FairseqConversionError",
    "convert_fairseq",
    "fairseq_config",
    "fairseq_model_args",
    "fairseq_state_dict",
    "fairseq_tokenizer",
    "from_fairseq",
    "load_fairseq_checkpoint",
    "read_bpe_merges",
    "read_fairseq_dictionary",
    "tokenizer_vocabulary",
]
