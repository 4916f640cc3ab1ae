"""Decoding settings shared by every generation contender, and the CTranslate2 runner.

This module imports neither torch nor transformers, so that a CTranslate2 contender measured alone in a
subprocess (`memory_probe.py`) carries only the runtime it needs; and CTranslate2 only when a translator is loaded,
so that the GPU check runs on a machine without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctranslate2


@dataclass(frozen=True)
class DecodingSettings:
    """Beam search as both libraries can express it: beam size, a cap on new tokens (end-of-sentence included),
    optionally a minimum (`min_new_tokens` = `max_new_tokens` fixes the output length) and the length penalty in its
    common form, score / length ** alpha."""

    num_beams: int = 4
    max_new_tokens: int = 64
    length_penalty: float = 0.6
    min_new_tokens: int = 0

    def transformers_kwargs(self, paper_fields: bool) -> dict:
        """`generate()` arguments; `paper_fields` switches this model's paper decoding (GNMT penalty, source + 50
        limit) to the library's, for a like-for-like comparison with MarianMT."""
        kwargs = {
            "num_beams": self.num_beams,
            "max_new_tokens": self.max_new_tokens,
            "length_penalty": self.length_penalty,
            "early_stopping": True,
            "do_sample": False,
        }
        if self.min_new_tokens:
            kwargs["min_new_tokens"] = self.min_new_tokens
        if paper_fields:
            kwargs |= {"length_penalty_type": "transformers", "max_length_offset": None}
        return kwargs

    def ctranslate2_kwargs(self) -> dict:
        return {
            "beam_size": self.num_beams,
            "max_decoding_length": self.max_new_tokens,
            "min_decoding_length": self.min_new_tokens,
            "length_penalty": self.length_penalty,
        }


def load_translator(model_dir: Path, compute_type: str, threads: int) -> ctranslate2.Translator:
    """A CPU translator with one batch at a time on `threads` threads (as torch gets)."""
    import ctranslate2

    return ctranslate2.Translator(
        str(model_dir), device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=threads
    )


def ctranslate2_translate(
    translator: ctranslate2.Translator, token_batches: list[list[list[str]]], settings: DecodingSettings
) -> list[list[str]]:
    """Best hypothesis (tokens, without </s>) of every sentence, batch by batch as given."""
    outputs = []
    for batch in token_batches:
        for result in translator.translate_batch(batch, **settings.ctranslate2_kwargs()):
            outputs.append(result.hypotheses[0])
    return outputs
