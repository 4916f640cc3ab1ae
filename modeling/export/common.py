"""What every exporter shares: a directory written all at once, its `export.json` record, refusals in one line,
and the paper's decoding fields that a runtime without them cannot apply."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..configuration_transformer import TransformerConfig
from ..files import replacing_directory, write_json
from ..modeling_transformer import TransformerForConditionalGeneration, int8_layer_names

RECORD_FILE = "export.json"


@contextmanager
def building_directory(output_dir: str | Path) -> Iterator[Path]:
    """Yield `NAME.partial` beside `output_dir` to fill; on success it takes `output_dir`'s place, on failure it is
    removed and `output_dir` stays as it was (`modeling.files.replacing_directory`). Only a previous export (or an
    empty directory) is ever replaced."""
    with replacing_directory(output_dir, RECORD_FILE, "an export") as partial:
        yield partial


EXPORT_RUNTIMES = {  # what runs each format's directory
    "ctranslate2": "ctranslate2.Translator (its README.md shows how)",
    "marian": "MarianMTModel.from_pretrained",
    "onnx": "onnxruntime",
}


def refuse_an_export(directory: str | Path) -> None:
    """Raise a one-line ValueError if `directory` is an export (it holds `export.json`): tools that take a model
    saved with save_pretrained say so and name the model it came from, rather than fail on its files."""
    record_path = Path(directory) / RECORD_FILE
    if not record_path.is_file():
        return
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    export_format, source = record.get("format"), record.get("source")
    runtime = EXPORT_RUNTIMES.get(export_format, "its runtime")
    raise ValueError(
        f"{str(directory)!r} is an export for {export_format or 'another runtime'} ({RECORD_FILE}), not a model "
        f"saved with save_pretrained: run it with {runtime}, or pass the model it was exported from"
        + (f" ({source})." if source else ".")
    )


def write_record(
    directory: Path, export_format: str, model: TransformerForConditionalGeneration, **details: Any
) -> None:
    """`export.json`: what was exported, from which model, with what settings and what the target cannot express."""
    write_json(
        directory / RECORD_FILE,
        {
            "format": export_format,
            "model_type": model.config.model_type,
            "source": getattr(model.config, "_name_or_path", "") or None,
            **details,
        },
    )


def refuse(field: str, value: Any, target: str, why: str) -> None:
    """Raise the one-line error of a config field that `target` cannot compute exactly."""
    raise ValueError(f"cannot export to {target} exactly: {field}={value!r} ({why}).")


def check_tokenizer_fits(model: TransformerForConditionalGeneration, tokenizer: Any, target: str) -> None:
    """Refuse a tokenizer with more tokens than the model has embedding rows: the runtime's lookup of an id beyond
    them fails (or, where tokens are mapped by position, reads another token's row)."""
    if tokenizer is not None and len(tokenizer) > model.config.vocab_size:
        refuse(
            "vocab_size", model.config.vocab_size, target, f"the tokenizer has {len(tokenizer)} tokens, more than rows"
        )


def check_model(model: Any) -> TransformerForConditionalGeneration:
    """`model`, if it is this project's translation model (the exporters read its modules). The same model loaded
    as remote code (`trust_remote_code=True`: its classes come from the checkpoint's files, not this package) is
    rebuilt with this package's classes, its weights and generation config copied. The library defaults a plain
    `Seq2SeqTrainer` wrote into the generation config are unset first, as generate() and save_pretrained unset them
    (`undo_library_default_fill`): exported, its max_length=20 capped every translation of the runtime."""
    int8_layers = int8_layer_names(model)
    if int8_layers:
        raise ValueError(
            f"cannot export a model quantised by quantize_int8 ({len(int8_layers)} layers hold packed int8 weights, "
            f"{int8_layers[0]} among them): export the float model (CTranslate2 int8: quantization='int8')."
        )
    if hasattr(model, "undo_library_default_fill"):  # remote code older than the method lacks it
        model.undo_library_default_fill()
    if isinstance(model, TransformerForConditionalGeneration):
        return model
    config = getattr(model, "config", None)
    if type(model).__name__ != TransformerForConditionalGeneration.__name__ or (
        getattr(config, "model_type", None) != TransformerConfig.model_type
    ):
        raise TypeError(
            f"expected this project's TransformerForConditionalGeneration, got {type(model).__module__}."
            f"{type(model).__name__}."
        )
    return _with_installed_classes(model)


def _with_installed_classes(model: Any) -> TransformerForConditionalGeneration:
    parameter = next(model.parameters())
    twin = TransformerForConditionalGeneration(TransformerConfig.from_dict(model.config.to_dict()))
    twin.to(device=parameter.device, dtype=parameter.dtype)
    weights = model.state_dict()
    if twin.model.shared is None:  # untied code from before `shared` was left out of untied models still holds it
        weights.pop("model.shared.weight", None)
    try:
        twin.load_state_dict(weights)
    except RuntimeError as error:
        first = str(error).splitlines()[1].strip() if len(str(error).splitlines()) > 1 else str(error)
        raise TypeError(
            f"{type(model).__module__}.{type(model).__name__} (remote code) does not hold this package's modules "
            f"({first}): load the checkpoint with `import modeling` instead of trust_remote_code."
        ) from None
    twin.generation_config = copy.deepcopy(model.generation_config)
    return twin.train(model.training)


def within_positions(tokenizer: Any, positions: int) -> Any:
    """`tokenizer`, or a copy of it whose `model_max_length` is `positions` where it was longer, for a runtime that
    takes no longer source (MarianMTModel fails on one with an IndexError that names no limit, CTranslate2 cuts
    it): transformers' tokenizer then warns of one ("longer than the specified maximum sequence length for this
    model"), and `truncation=True` cuts there."""
    if tokenizer.model_max_length <= positions:
        return tokenizer
    within = copy.copy(tokenizer)  # the caller's tokenizer keeps its own
    within.model_max_length = positions
    return within


def single_eos(config: TransformerConfig, target: str) -> int:
    """The one end-of-sentence token id that `target` takes, refused in one line if there are none or several."""
    eos = config.eos_token_id
    if isinstance(eos, (list, tuple)):
        if len(eos) != 1:
            refuse("eos_token_id", eos, target, "it takes one end-of-sentence token")
        eos = eos[0]
    if eos is None:
        refuse("eos_token_id", eos, target, "it needs an end-of-sentence token")
    return int(eos)


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
