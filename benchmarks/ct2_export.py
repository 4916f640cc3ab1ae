"""Convert the MarianMT twin to CTranslate2 with the installed converter, adapted to this project's vocabulary.

`ctranslate2.converters.TransformersConverter` picks its `MarianMTLoader` for a `MarianConfig`, which assumes the
opus-mt conventions: `<pad>` is the last vocabulary entry (so it drops the last row of every vocabulary matrix)
and the decoder starts from a zero embedding (HF Marian starts from `<pad>`, whose row is zero). This project's
shared BPE has `<pad>`=0 and starts the decoder from `</s>`=2, whose embedding is not zero: that loader would cut
a real token and change every translation. `ExactMarianLoader` is the same loader without those two conventions
(the BART path it derives from, with Marian's post-LayerNorm and no embedding LayerNorm); the converter machinery
(`Converter.convert`: validation, optimisation, serialisation) is CTranslate2's own. Quantisation is chosen at
load time (`compute_type`), so one float32 conversion serves float32 and int8.
"""

from __future__ import annotations

from pathlib import Path

import torch
from ctranslate2.converters.converter import Converter
from ctranslate2.converters.transformers import BartLoader
from transformers import AutoTokenizer, MarianMTModel, PreTrainedTokenizerBase


class ExactMarianLoader(BartLoader):
    """CTranslate2's Marian loader, keeping the full vocabulary and the model's own decoder start token."""

    @property
    def architecture_name(self) -> str:
        return "MarianMTModel"

    def get_model_spec(self, model: MarianMTModel):
        model.config.normalize_before = False  # post-LayerNorm, as MarianMTLoader sets
        model.config.normalize_embedding = False
        return super().get_model_spec(model)

    def set_config(self, config, model: MarianMTModel, tokenizer: PreTrainedTokenizerBase) -> None:
        config.eos_token = tokenizer.eos_token
        config.unk_token = tokenizer.unk_token
        config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)


class MarianTwinConverter(Converter):
    """Converts an in-memory MarianMTModel and its tokenizer (no Hub look-up, nothing downloaded)."""

    def __init__(self, model: MarianMTModel, tokenizer: PreTrainedTokenizerBase):
        self.model = model
        self.tokenizer = tokenizer

    def _load(self):
        with torch.no_grad():
            return ExactMarianLoader()(self.model, self.tokenizer)


def export_ctranslate2(marian_dir: Path, output_dir: Path) -> Path:
    """Convert the saved Marian twin (model and tokenizer in `marian_dir`) to float32 CTranslate2, once."""
    if not (output_dir / "model.bin").is_file():
        model = MarianMTModel.from_pretrained(marian_dir).eval()
        MarianTwinConverter(model, AutoTokenizer.from_pretrained(marian_dir)).convert(str(output_dir), force=True)
    return output_dir
