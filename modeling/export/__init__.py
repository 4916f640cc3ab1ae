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

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import RECORD_FILE, building_directory, paper_decoding_not_expressed
from .ctranslate2_export import (
    CTRANSLATE2_OPTIONS_FILE,
    CTRANSLATE2_QUANTIZATIONS,
    check_ctranslate2,
    ctranslate2_spec,
    ctranslate2_translate_options,
    to_ctranslate2,
)
from .marian_export import check_marian, to_marian
from .onnx_export import ONNX_OPSET, to_onnx

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..modeling_transformer import TransformerForConditionalGeneration

FORMATS = ("ctranslate2", "marian", "onnx")


def export(
    model: TransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase | None,
    output_dir: str | Path,
    to: str,
    **options: Any,
) -> Path:
    """Dispatch to `to_ctranslate2`, `to_marian` or `to_onnx` by name."""
    if to == "ctranslate2":
        return to_ctranslate2(model, tokenizer, output_dir, **options)
    if to == "marian":
        return to_marian(model, tokenizer, output_dir, **options)
    if to == "onnx":
        return to_onnx(model, output_dir, tokenizer=tokenizer, **options)
    raise ValueError(f"unknown export format {to!r}; expected one of {FORMATS}.")


__all__ = [
    "CTRANSLATE2_OPTIONS_FILE",
    "CTRANSLATE2_QUANTIZATIONS",
    "FORMATS",
    "ONNX_OPSET",
    "RECORD_FILE",
    "building_directory",
    "check_ctranslate2",
    "check_marian",
    "ctranslate2_spec",
    "ctranslate2_translate_options",
    "export",
    "paper_decoding_not_expressed",
    "to_ctranslate2",
    "to_marian",
    "to_onnx",
]
