"""Evaluating a model on a split: translate it, score it (`modeling.scoring`), record how.

`evaluate_split` glues translation and scoring for `scripts/evaluate.py`; the metrics it returns carry the
decoding settings that produced them, so that every number can be reproduced. With a hypotheses file the
translation goes through `translate_file`, and so resumes after a kill; hypotheses written and not yet scored are
scored as they are by the next run. `load_scored_model` loads a model with the record of which weights are scored
(a model card refuses scores of weights its directory no longer holds), and
`evaluation_record` is what `scripts/evaluate.py` writes: that record, the split scored and the metrics.
"""

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from datasets import Dataset
from huggingface_hub import try_to_load_from_cache
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .checkpoints import weight_files, weights_record
from .files import file_sha256, file_states, iter_lines, write_json, write_text
from .generation_transformer import MODEL_DECODING_FIELDS
from .hub_client import looks_like_local_path
from .scoring import corpus_scores
from .translation import (
    as_lines,
    load_model_and_tokenizer,
    pinned_hub_revision,
    removed_while_loaded,
    translate,
    translate_file,
    translation_identity,
)

logger = logging.getLogger(__name__)

# Recorded with every evaluation, so that its numbers can be reproduced: the transformers generation config fields
# that the paper's and fairseq's decoding set (`set_paper_decoding`, `set_fairseq_decoding`) and a length cap
# (`max_new_tokens`, which neither sets), then all of this model's own (the GNMT length penalty and per-sentence
# length limits, fairseq's decoding rules).
DECODING_SETTINGS = (
    "num_beams",
    "length_penalty",
    "early_stopping",
    "max_new_tokens",
    "min_new_tokens",
    "suppress_tokens",
    *MODEL_DECODING_FIELDS,
)


def load_scored_model(
    name_or_path: str, *, revision: str | None = None, device: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """`load_model_and_tokenizer`, and what an evaluation record says of the model: `model`, `model_commit` (a Hub
    id's: the commit it was loaded at, pinned before loading) and `model_weights` (its weight files, sizes and
    sha256). A directory's weights are hashed before loading, not after the translating (an average replacing them
    meanwhile is not what was scored), and refused if they changed (`file_states`) while they were hashed and
    loaded: which were loaded, nothing says."""
    local = Path(name_or_path).is_dir()
    if not os.path.exists(name_or_path) and not looks_like_local_path(name_or_path):  # a Hub id
        # Loaded at its commit, which the record names: the cache's branch may move on meanwhile.
        revision = pinned_hub_revision(name_or_path, revision)
    try:
        states = _weight_file_states(name_or_path) if local else None  # before hashing: what is hashed is what loads
        model_weights = weights_record(name_or_path) if local else None
    except FileNotFoundError:
        if not local or Path(name_or_path).is_dir():
            raise
        raise removed_while_loaded(name_or_path) from None
    model, tokenizer = load_model_and_tokenizer(name_or_path, revision=revision, device=device)
    if local and not Path(name_or_path).is_dir():  # its weights' states, none left, were taken for changed ones
        raise removed_while_loaded(name_or_path)
    if local and _weight_file_states(name_or_path) != states:
        raise ValueError(
            f"{name_or_path}'s weights changed while they were loaded (averaged or converted again meanwhile?): "
            "evaluate it once they are written"
        )
    model_commit = None
    if model_weights is None:  # a Hub id: the snapshot of the commit just loaded
        snapshot = Path(try_to_load_from_cache(name_or_path, "config.json", revision=revision)).parent
        model_weights, model_commit = weights_record(snapshot), snapshot.name
    scored = {"model": name_or_path, "model_commit": model_commit, "model_weights": model_weights}
    return model, tokenizer, scored


def _weight_file_states(directory: str) -> tuple:
    files = weight_files(directory)
    return tuple(map(str, files)), file_states(files)


def evaluation_record(
    scored: dict[str, Any],
    metrics: dict[str, Any],
    *,
    dataset: str | None,
    language_pair: str | None,
    split: str,
    limit: int | None,
    sentences_in_split: int,
    int8: bool = False,
    dataset_commit: str | None = None,
) -> dict[str, Any]:
    """The evaluation JSON `scripts/evaluate.py` writes and a model card reads (`model_card.collect_card_inputs`):
    the model scored (`load_scored_model`), the split (`limit`: its first sentences only, of `sentences_in_split`;
    `dataset_commit`: the commit of the Hub dataset it was read at) and `evaluate_split`'s metrics."""
    where = {"dataset": dataset, "language_pair": language_pair, "split": split}
    if dataset_commit is not None:
        where["dataset_commit"] = dataset_commit
    return {**scored, **where, "limit": limit, "sentences_in_split": sentences_in_split, "int8": int8, **metrics}


def evaluate_split(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    split: Dataset,
    *,
    source_lang: str,
    target_lang: str,
    max_tokens: int = 4096,
    num_beams: int | None = None,
    workers: int = 1,
    progress: bool = False,
    hypotheses_file: str | os.PathLike | None = None,
    chunk_lines: int = 10_000,
    **generate_kwargs: Any,
) -> tuple[dict[str, Any], list[str]]:
    """Translate one split (rows of `{"translation": {src: ..., tgt: ...}}`) and score it against references.

    Returns the metrics (the scores plus the decoding settings that produced them, so that the numbers can be
    reproduced) and the hypotheses in the split's order; `workers` as in `translate`. With `hypotheses_file` they
    are also written there, by `translate_file` (`chunk_lines` at a time) from the sources written to a hidden
    `.NAME.source` beside it for the call: a killed evaluation resumes after its last chunk translated, and one
    killed while it scored scores the hypotheses written without translating them again (`_UnscoredHypotheses`).
    """
    pairs = list(split["translation"])
    sources = [pair[source_lang] for pair in pairs]
    references = [pair[target_lang] for pair in pairs]
    warn_of_unreachable_references(tokenizer, references)
    settings = {"max_tokens": max_tokens, "num_beams": num_beams, "workers": workers, "progress": progress}
    settings |= generate_kwargs
    if hypotheses_file is None:
        hypotheses = translate(model, tokenizer, sources, **settings)
    else:
        unscored = _UnscoredHypotheses(Path(hypotheses_file), model, tokenizer, sources, settings)
        if not unscored.written_earlier():
            _translate_into(unscored.path, model, tokenizer, sources, chunk_lines, settings)
            unscored.record()
        hypotheses = list(iter_lines(unscored.path))
    warn_of_tokenised_references(hypotheses, references)
    overrides = {**generate_kwargs, **({"num_beams": num_beams} if num_beams is not None else {})}
    decoding = {name: overrides.get(name, getattr(model.generation_config, name, None)) for name in DECODING_SETTINGS}
    metrics = {
        "source_lang": source_lang,
        "target_lang": target_lang,
        "max_tokens": max_tokens,
        **decoding,
        **corpus_scores(hypotheses, references, target_lang),
    }
    if hypotheses_file is not None:
        unscored.scored()
    return metrics, hypotheses


def _translate_into(
    hypotheses_file: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    chunk_lines: int,
    settings: dict[str, Any],
) -> None:
    """`translate_file` from the sources written to a hidden `.NAME.source` beside `hypotheses_file` for the call."""
    source_file = write_text(hypotheses_file.with_name(f".{hypotheses_file.name}.source"), as_lines(sources))
    try:
        translate_file(model, tokenizer, source_file, hypotheses_file, chunk_lines=chunk_lines, **settings)
    finally:  # written again from the split by every run, resumed or not; another run's may be gone already
        source_file.unlink(missing_ok=True)


class _UnscoredHypotheses:
    """Hypotheses translated into `path` and not yet scored, known by a record beside them (`.NAME.unscored.json`:
    the translation's identity as `translate_file` knows it, sha256 of the sources and of the hypotheses file),
    kept from the end of the translating to the end of the scoring: an evaluation killed while it scored (a large
    test set takes minutes) translated everything again, as `translate_file` keeps no record of a translation it
    finished. Gone once scored: a later evaluation translates anew (with code changed since, perhaps)."""

    def __init__(
        self,
        path: Path,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        sources: list[str],
        settings: dict[str, Any],
    ):
        self.path, self.record_path = path, path.with_name(f".{path.name}.unscored.json")
        self.model, self.tokenizer, self.sources, self.settings = model, tokenizer, sources, settings

    @cached_property
    def identity(self) -> dict[str, str]:
        """Taken only where a record is read or written: a model `translate_file` refuses is refused first."""
        decoding = {name: value for name, value in self.settings.items() if name not in ("workers", "progress")}
        return {
            **translation_identity(self.model, self.tokenizer, decoding),
            "source_sha256": hashlib.sha256(as_lines(self.sources).encode()).hexdigest(),
        }

    def written_earlier(self) -> bool:
        """Whether `path` holds the hypotheses of this translation, recorded by a run that did not score them
        (logged, and why not when there was a record)."""
        if not self.record_path.is_file():
            return False
        try:
            earlier = json.loads(self.record_path.read_text(encoding="utf-8"))
            if not isinstance(earlier, dict):
                raise ValueError(f"a JSON {type(earlier).__name__}, not an object")
        except (OSError, ValueError) as error:
            why = f"its record {self.record_path.name} is unreadable: {error!r}"
        else:
            differs = [key for key, value in self.identity.items() if earlier.get(key) != value]
            if differs:
                why = f"another {', '.join(differs)}"
            elif not self.path.is_file():
                why = f"{self.path.name} is gone"
            elif earlier.get("hypotheses_sha256") != file_sha256(self.path):
                why = f"{self.path.name} changed since"
            else:
                logger.info("Scoring the hypotheses an earlier run translated into %s, not yet scored", self.path)
                return True
        logger.warning("Not scoring the hypotheses in %s as they are (%s): translating again", self.path, why)
        return False

    def record(self) -> None:
        write_json(self.record_path, {**self.identity, "hypotheses_sha256": file_sha256(self.path)})

    def scored(self) -> None:
        self.record_path.unlink(missing_ok=True)


def warn_of_unreachable_references(tokenizer: PreTrainedTokenizerBase, references: list[str]) -> None:
    """Warn when references hold words that the tokenizer's normaliser changes (decomposed "a" + "¨" under NFKC, a
    ligature): the model's outputs never hold them, so BLEU counts them as errors the model could not avoid. Only
    words count: a no-break space that becomes a space separates the same words, and no score sees the difference.
    The score stays sacreBLEU's on the references as given."""
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    if normalizer is None:
        return
    changed = [
        index
        for index, reference in enumerate(references)
        if normalizer.normalize_str(reference).split() != reference.split()
    ]
    if changed:
        first = references[changed[0]]
        logger.warning(
            "%d of %d references change under the tokenizer's normalisation (the first: line %d, %r becomes %r), "
            "which the model's outputs always have: BLEU counts those characters as errors. Normalise the references "
            "the same way (e.g. unicodedata.normalize('NFKC', line)) if comparing with a score on normalised text.",
            len(changed),
            len(references),
            changed[0] + 1,
            first,
            normalizer.normalize_str(first),
        )


# What Moses' tokenizer.perl writes and detokenised text never holds: its escapes of special characters, and the
# marks of its aggressive hyphen splitting (`-a`) and of WMT's number splitting ("1 @,@ 000").
_MOSES_TOKENISED = re.compile(r"&(?:amp|lt|gt|apos|quot|#91|#93|#124);| @[-,.]@ ")


def warn_of_tokenised_references(hypotheses: list[str], references: list[str]) -> None:
    """Warn when references hold what only Moses-tokenised text holds (`_MOSES_TOKENISED`) and no hypothesis does:
    tokenised references (a test set as fairseq's preparation scripts leave it) scored against the model's
    detokenised outputs, every score lower by what the tokenisation changed (perfect translations of four
    sentences: sacreBLEU 66, not 100), and sacreBLEU warns of tokenised hypotheses only. A model trained on such
    text outputs it too, and is scored alike."""
    if any(_MOSES_TOKENISED.search(hypothesis) for hypothesis in hypotheses):
        return
    tokenised = [index for index, reference in enumerate(references) if _MOSES_TOKENISED.search(reference)]
    if tokenised:
        logger.warning(
            "%d of %d references hold the Moses tokeniser's escapes or hyphen marks (the first: line %d, %r), which "
            "no hypothesis holds: the references are tokenised, the outputs not, and every score counts the "
            "difference as errors. Score detokenised references (sacremoses' MosesDetokenizer, detokenizer.perl).",
            len(tokenised),
            len(references),
            tokenised[0] + 1,
            references[tokenised[0]],
        )


def warn_of_replaced_scores(
    metrics_path: str | os.PathLike, scored: dict[str, Any], evaluated: Mapping[str, Any] | None = None
) -> None:
    """Warn, before any translating, where `metrics_path` holds the scores of other weights than those `scored`
    (`load_scored_model`): an evaluation of another model into the same directory, or of the same directory since
    trained on or averaged again, replaced them without a word. So does another evaluation of the same weights,
    one of the `evaluated` fields of whose record (the test set, the direction, the sentences scored, the beam)
    differs: a quick check with `--limit`, or another test set of the same split name, replaced the full one's
    scores, which the card then showed no more. An unreadable file is replaced as it is."""
    try:
        earlier = json.loads(Path(metrics_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(earlier, dict):
        return
    if earlier.get("model_weights") != scored["model_weights"]:
        logger.warning(
            "%s holds the scores of other weights (those of %s then), which this evaluation replaces: "
            "another output directory keeps both",
            metrics_path,
            earlier.get("model", "a model it does not name"),
        )
        return
    differs = [  # a field an older record lacks says nothing
        f"{name} {earlier[name]!r}, not {value!r}"
        for name, value in (evaluated or {}).items()
        if name in earlier and earlier[name] != value
    ]
    if differs:
        logger.warning(
            "%s holds the scores of another evaluation of these weights (%s), which this evaluation replaces: "
            "another output directory keeps both",
            metrics_path,
            "; ".join(differs),
        )


def metrics_filename(split: str) -> str:
    """Name of the metrics JSON of one split; the model card collects every `eval_results_*.json` it finds."""
    return f"eval_results_{split}.json"
