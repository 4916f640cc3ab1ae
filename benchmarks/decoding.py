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


def load_translator(
    model_dir: Path, compute_type: str, threads: int, batches_at_once: int = 1
) -> ctranslate2.Translator:
    """A CPU translator on `threads` threads (as torch gets): one batch at a time on all of them, or
    `batches_at_once` batches side by side on an equal share each (CTranslate2's inter_threads)."""
    import ctranslate2

    return ctranslate2.Translator(
        str(model_dir),
        device="cpu",
        compute_type=compute_type,
        inter_threads=batches_at_once,
        intra_threads=max(1, threads // batches_at_once),
    )


def ctranslate2_translate(
    translator: ctranslate2.Translator, token_batches: list[list[list[str]]], settings: DecodingSettings
) -> list[list[str]]:
    """Best hypothesis (tokens, without </s>) of every sentence, batch by batch as given: every batch is submitted
    at once, so that a translator with several `inter_threads` decodes that many side by side."""
    kwargs = settings.ctranslate2_kwargs()
    pending = [translator.translate_batch(batch, asynchronous=True, **kwargs) for batch in token_batches]
    return [result.result().hypotheses[0] for batch in pending for result in batch]
