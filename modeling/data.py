"""Parallel data: load, clean and tokenise (batching by token budget is `modeling.batching`).

Every loader ends in the same `datasets.DatasetDict` whose splits hold rows in the WMT schema,
`{"translation": {source_lang: str, target_lang: str}}`, whether the text came from the Hub
(`wmt/wmt14` `de-en`: train / validation = newstest2013 / test = newstest2014) or from local files.

Split names are kept as found (Multi30k has `val` and `test_2016_flickr`); `resolve_split` maps the
usual names "validation" and "test" onto them.
"""

from __future__ import annotations

import errno
import functools
import glob
import inspect
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc
import tokenizers
import transformers
from datasets.naming import camelcase_to_snakecase
from datasets.packaged_modules.cache.cache import Cache
from transformers import PreTrainedTokenizerBase

from .files import (
    DiskFullError,
    disk_full_error,
    exception_chain,
    file_sha256,
    file_states,
    iter_lines,
    require_directory,
)
from .hub_client import cached_commit, cached_snapshot, current_commit, use_hub_timeouts
from .tokenization import visible_words

logger = logging.getLogger(__name__)

# Preferred real split names for each usual name, best first (Multi30k, WMT newstest, common spellings).
SPLIT_ALIASES: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "validation": ("validation", "valid", "val", "dev", "newstest2013"),
    "test": ("test", "test_2016_flickr", "newstest2014"),
}


class SplitNotFoundError(KeyError):
    """A split asked for that a dataset does not have (nor an alias of it); `name` is the one asked for."""

    def __init__(self, name: str, available: list[str]):
        super().__init__(f"no split {name!r} (or alias {list(SPLIT_ALIASES.get(name, ()))}) among {available}")
        self.name = name


def resolve_split(splits: Iterable[str], name: str) -> str:
    """Return the real name of split `name` among `splits` (a DatasetDict or any names).

    An existing name wins; otherwise "validation" maps to val/valid/dev/newstest2013 and "test" to
    test_2016_flickr/newstest2014 (first present in `SPLIT_ALIASES` order).
    """
    available = list(splits)
    if name in available:
        return name
    for candidate in SPLIT_ALIASES.get(name, ()):
        if candidate in available:
            return candidate
    raise SplitNotFoundError(name, available)


# --- loading -------------------------------------------------------------------------------------------


def load_parallel_dataset(
    *,
    source_lang: str,
    target_lang: str,
    dataset: str | None = None,
    language_pair: str | None = None,
    data_dir: str | os.PathLike | None = None,
    data_files: Mapping[str, str | os.PathLike | Mapping[str, str | os.PathLike]] | None = None,
    splits: Sequence[str] | None = None,
    cache_dir: str | None = None,
    revision: str | None = None,
) -> datasets.DatasetDict:
    """Load a parallel corpus from the Hub (`dataset`, at `revision`: a branch, tag or commit, default main) or
    from local files (`data_dir` / `data_files`). `pinned_dataset_commit` says which commit a Hub dataset is read at.

    Local files, discovered in `data_dir` by split and language, plain or compressed (`.gz`, `.xz`, `.bz2`):
      - line-aligned text, one sentence per line: `train.en` + `train.de`, `val.en.gz` + `val.de.gz`;
      - TSV with two columns: `train.en-de.tsv` (column order from the name) or `train.tsv`
        (source, then target);
      - JSONL in the WMT schema: `train.jsonl`, one `{"translation": {"en": ..., "de": ...}}` per line.
    `data_files` names the files explicitly instead: `{split: tsv_or_jsonl_path}` or
    `{split: {lang: text_path}}`, relative to `data_dir` when given.
    `splits` keeps only those splits (aliases such as "validation" are resolved).
    """
    if source_lang == target_lang:
        raise ValueError(f"source and target language are both {source_lang!r}")
    if (dataset is None) == (data_dir is None and data_files is None):
        raise ValueError("give either dataset= (a Hub dataset) or data_dir= / data_files= (local files)")
    if revision is not None and dataset is None:
        raise ValueError(f"revision={revision!r} names a version of a Hub dataset: local files have none")
    if dataset is not None:
        use_hub_timeouts()
        with _naming_an_unwritable_cache(cache_dir):
            if splits is None:
                raw = datasets.load_dataset(dataset, language_pair, cache_dir=cache_dir, revision=revision)
            else:
                raw = _load_hub_splits(dataset, language_pair, splits, cache_dir, revision)
        try:
            return normalize_translation_dataset(raw, source_lang, target_lang)
        except ValueError as error:
            raise ValueError(f"{dataset}: {error}") from None

    if data_files is None:
        files = discover_parallel_files(data_dir, source_lang, target_lang, splits)
    else:
        files = _explicit_files(data_files, data_dir, source_lang, target_lang)
        if splits is not None:
            files = {name: files[name] for name in (resolve_split(files, split) for split in splits)}
    with _naming_an_unwritable_cache(cache_dir):
        return datasets.DatasetDict(
            {split: _local_split(spec, split, source_lang, target_lang, cache_dir) for split, spec in files.items()}
        )


@contextmanager
def _naming_an_unwritable_cache(cache_dir: str | None) -> Iterator[None]:
    """datasets writes every corpus it reads, a local one too, into its cache (and a lock beside a cached one): a
    cache it cannot write (HF_HOME on a shared file system, read-only on compute nodes) is named with the way out,
    instead of "[Errno 30] Read-only file system: '.../datasets'"; one that is full, as `DiskFullError`
    (`_naming_a_full_disk`)."""
    cache = Path(cache_dir or datasets.config.HF_DATASETS_CACHE)
    try:
        with _naming_a_full_disk(cache):
            yield
    except OSError as error:
        written = Path(error.filename) if error.filename else None
        if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or written is None:
            raise
        if not (written == cache or cache in written.parents or written in cache.parents):
            raise
        way_out = (
            "give a writable cache directory"
            if cache_dir
            else "set HF_DATASETS_CACHE to a writable directory (e.g. export HF_DATASETS_CACHE=$TMPDIR/datasets)"
        )
        named = OSError(f"cannot write the datasets cache {cache} ({error.strerror}): {way_out}")
        named.errno = error.errno
        raise named from error


@contextmanager
def _naming_a_full_disk(cache: Path) -> Iterator[None]:
    """A full disk while datasets writes its cache raised as `DiskFullError` naming `cache`: datasets said "[Errno
    28] No space left on device" (a map) and, writing a local corpus, "An error occurred while generating the
    dataset", with a traceback, naming neither the full disk nor where it writes."""
    try:
        yield
    except Exception as error:
        full = _full_disk(error, cache)
        if full is None:
            raise
        raise full from error


def _full_disk(error: BaseException, cache: Path) -> DiskFullError | None:
    """`DiskFullError` for `cache` where `error` comes of an OSError of a full disk: errno ENOSPC or EDQUOT (a
    quota), or (pyarrow's write errors carry none) no errno on a nearly full disk (`disk_full_error`); None for any
    other error."""
    for seen in exception_chain(error):
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT, None):
            return disk_full_error(seen, cache)
    return None


def _cache_directory(part: datasets.Dataset) -> Path:
    """Where datasets writes what it computes from `part`: beside its Arrow file, else in its default cache."""
    if part.cache_files:
        return Path(part.cache_files[0]["filename"]).parent
    return Path(datasets.config.HF_DATASETS_CACHE)


def pinned_dataset_commit(
    dataset: str, language_pair: str | None = None, revision: str | None = None, cache_dir: str | None = None
) -> str | None:
    """The commit of the Hub dataset `dataset` that `revision` (None: main) names, which every split of one load, and
    the record of what a run or an evaluation read, come from: a split read after a push to the dataset would
    otherwise come from another commit than the one before it. Asked of the Hub; where it cannot be asked (offline,
    unreachable), the commit the revision has in the Hub cache (`hf download --repo-type dataset`), else, for main,
    the latest commit of `language_pair` the datasets cache holds. None for a local folder; `revision` as given where
    nothing says (a repo the Hub does not have: the load names it)."""
    if os.path.isdir(dataset):
        return None
    commit = current_commit(dataset, revision, repo_type="dataset")
    if commit is None:  # the Hub cannot be asked: datasets falls back to its cache, and so does this
        commit = cached_commit(dataset, revision, repo_type="dataset")
    if commit is None and revision is None:
        _, copies = _arrow_copies(dataset, language_pair, cache_dir)
        commit = max(copies, key=lambda commit: copies[commit][1], default=None)
    return commit or revision


def _load_hub_splits(
    dataset: str, language_pair: str | None, splits: Sequence[str], cache_dir: str | None, revision: str | None
) -> datasets.DatasetDict:
    """Only the splits asked for: evaluating on WMT14's test set must not download and convert its 4.5M training
    pairs, which `load_dataset(split=...)` does for a dataset of data files (datasets#6529). Those files are read
    split by split, with the configuration's own options (a TSV's separator, ...), all at one commit; a dataset with
    a loading script, as a whole."""
    commit = pinned_dataset_commit(dataset, language_pair, revision, cache_dir)
    try:
        builder = datasets.load_dataset_builder(dataset, language_pair, cache_dir=cache_dir, revision=commit)
    except (ValueError, ConnectionError):
        if os.path.isdir(dataset):
            raise
        # Offline or with the Hub unreachable, datasets finds neither the splits read one by one below (it looks in
        # its cache for the configuration under its name alone, where they are under the name and a hash of their
        # files: datasets#6837) nor a copy `hf download` put in the Hub cache.
        cached = _splits_the_caches_hold(dataset, language_pair, splits, cache_dir, commit)
        if cached is None:
            raise
        return cached
    # The Hub cannot be asked, and datasets found its own copy of a load of every split: its latest, at any commit.
    if isinstance(builder, Cache):
        cached = _splits_the_caches_hold(dataset, language_pair, splits, cache_dir, commit)
        if cached is not None:
            return cached
    files = builder.config.data_files
    at = {"cache_dir": cache_dir, "revision": commit}
    if not type(builder).__module__.startswith("datasets.packaged_modules.") or not files:
        available = datasets.get_dataset_split_names(dataset, language_pair, revision=commit)
        names = [resolve_split(available, split) for split in splits]
        return datasets.DatasetDict(
            {name: datasets.load_dataset(dataset, language_pair, split=name, **at) for name in names}
        )
    names = [resolve_split(files, split) for split in splits]
    return datasets.DatasetDict(
        {
            name: datasets.load_dataset(dataset, language_pair, data_files={name: files[name]}, split=name, **at)
            for name in names
        }
    )


def _splits_the_caches_hold(
    dataset: str, language_pair: str | None, splits: Sequence[str], cache_dir: str | None, commit: str | None
) -> datasets.DatasetDict | None:
    """The splits at `commit`, for a Hub that cannot be asked (a compute node without internet): as an earlier load
    left them in the datasets cache, else from the dataset's files in the Hub cache (`hf download`). None where
    neither cache holds this configuration; a ValueError naming what they hold where they lack a split."""
    config_name, copies = _arrow_copies(dataset, language_pair, cache_dir)
    held = copies.get(commit, ({}, 0.0))[0] if commit is not None else {}
    try:
        names = [resolve_split(held, split) for split in splits]
    except SplitNotFoundError as missing:
        snapshot = cached_snapshot(dataset, commit, repo_type="dataset")
        if snapshot is not None:
            try:
                loaded = _load_hub_splits(str(snapshot), language_pair, splits, cache_dir, None)
            except (FileNotFoundError, ValueError, SplitNotFoundError):  # files left out (`--include`), or the
                pass  # README alone, which datasets downloads
            else:
                logger.warning(
                    "%s (%s): read from the Hub cache, %s (the Hub cannot be asked)", dataset, config_name, snapshot
                )
                return loaded
        if not copies and snapshot is None:
            return None
        cached = "; ".join(f"at {at}: {sorted(copy)}" for at, (copy, _) in copies.items()) or "nothing"
        raise ValueError(
            f"{dataset} ({config_name}): the Hub cannot be asked, and neither the datasets cache "
            f"{_arrow_root(dataset, cache_dir)} (holding {cached}) nor the Hub cache holds the split {missing.name!r} "
            f"at {commit}: read it where the Hub answers, or `hf download {dataset} --repo-type dataset` there"
        ) from None
    name = dataset.rpartition("/")[2]
    parts = {}
    for split in names:
        config_id, version, _ = held[split].parts[-3:]
        logger.warning(
            "%s (%s): split %r from the datasets cache, %s (the Hub cannot be asked)",
            dataset,
            config_name,
            split,
            held[split],
        )
        builder = Cache(
            cache_dir=cache_dir,
            repo_id=dataset,
            dataset_name=name,
            config_name=config_id,
            version=version,
            hash=commit,
        )
        parts[split] = builder.as_dataset(split=split)
    return datasets.DatasetDict(parts)


def _arrow_root(dataset: str, cache_dir: str | None) -> Path:
    """Where datasets caches what it read of the Hub dataset `dataset`."""
    namespace, _, name = dataset.rpartition("/")
    root = Path(cache_dir or datasets.config.HF_DATASETS_CACHE).expanduser()
    return root / "___".join(filter(None, (namespace, camelcase_to_snakecase(name))))


def _arrow_copies(
    dataset: str, language_pair: str | None, cache_dir: str | None
) -> tuple[str, dict[str, tuple[dict[str, Path], float]]]:
    """The configuration `language_pair` names, and by commit the splits of it that the datasets cache holds of the
    Hub dataset `dataset` (each split's latest copy: its directory) and when the latest of them was written. With no
    `language_pair`, the configuration datasets takes: "default", else the only one cached (a dataset of one named
    configuration, which datasets reads online without its name)."""
    pattern = f"{glob.escape(language_pair or '')}*/*/*/dataset_info.json"
    written = {info_file: info_file.stat().st_mtime for info_file in _arrow_root(dataset, cache_dir).glob(pattern)}
    by_configuration: dict[str, dict[str, tuple[dict[str, Path], float]]] = {}
    for info_file in sorted(written, key=written.get):  # oldest first: a later copy of a split replaces it
        commit = info_file.parent.name
        if commit.endswith(".incomplete"):  # a read killed before datasets renamed it
            continue
        try:
            info = json.loads(info_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:  # cut short (a disk lost with it), or not datasets'
            logger.warning("Not reading the cached copy %s: %s", info_file.parent, error)
            continue
        if not isinstance(info, dict) or not isinstance(info.get("config_name"), str):  # not datasets'
            continue
        copies = by_configuration.setdefault(info["config_name"], {})
        held = copies.get(commit, ({}, 0.0))[0] | dict.fromkeys(info.get("splits") or {}, info_file.parent)
        copies[commit] = (held, written[info_file])
    config_name = language_pair or "default"
    if language_pair is None and len(by_configuration) == 1:
        config_name = next(iter(by_configuration))
    return config_name, by_configuration.get(config_name, {})


def normalize_translation_dataset(
    ds: datasets.DatasetDict, source_lang: str, target_lang: str
) -> datasets.DatasetDict:
    """Reduce every split to a single `translation` column holding exactly the two languages.

    Accepts the WMT schema (`translation` dict, possibly with more languages) or one column per language.
    """
    if not ds:
        raise ValueError("the dataset has no splits")
    out = {}
    for split, part in ds.items():
        if "translation" in part.column_names:
            feature = part.features["translation"]
            languages = feature.languages if isinstance(feature, datasets.Translation) else list(feature)
            missing = [lang for lang in (source_lang, target_lang) if lang not in languages]
            if missing:
                raise ValueError(f"split {split!r} has languages {languages}, not {missing}")
            if set(languages) == {source_lang, target_lang}:
                out[split] = part.select_columns(["translation"])
                continue
        elif not {source_lang, target_lang} <= set(part.column_names):
            raise ValueError(
                f"split {split!r} needs a 'translation' column or columns {source_lang!r} and "
                f"{target_lang!r}; it has {part.column_names}"
            )
        out[split] = part.map(
            _to_translation,
            batched=True,
            fn_kwargs={"languages": (source_lang, target_lang)},
            remove_columns=part.column_names,
            features=_translation_features(source_lang, target_lang),
            desc=f"normalise {split}",
        )
    for split, part in out.items():
        _check_no_missing_sentence(part, split, (source_lang, target_lang))
    return datasets.DatasetDict(out)


def _check_no_missing_sentence(part: datasets.Dataset, split: str, languages: tuple[str, str]) -> None:
    """Refuse null sentences (rows with one side missing, which Hub datasets may hold): they would crash cleaning or
    tokenisation with a message naming neither the split nor the row, as local JSONL refuses them."""
    pairs = part.with_format("arrow")["translation"]
    for language in languages:
        missing = pc.struct_field(pairs, language).is_null()  # a null pair counts as null on both sides
        count = pc.sum(missing).as_py()
        if count:
            raise ValueError(
                f"split {split!r}, row {pc.index(missing, True).as_py()}: the {language!r} sentence is null "
                f"(in {count} of {len(part)} rows); drop such rows (Dataset.filter) and give the rest as JSONL "
                "(Dataset.to_json) with --data_dir"
            )


def _to_translation(batch: dict[str, list], languages: tuple[str, str]) -> dict[str, list]:
    if "translation" in batch:  # a null pair stays null, for `_check_no_missing_sentence` to name
        pairs = batch["translation"]
        return {"translation": [None if pair is None else {lang: pair[lang] for lang in languages} for pair in pairs]}
    return {
        "translation": [
            dict(zip(languages, texts, strict=True))
            for texts in zip(*(batch[lang] for lang in languages), strict=True)
        ]
    }


def _translation_features(source_lang: str, target_lang: str) -> datasets.Features:
    return datasets.Features({"translation": datasets.Translation(languages=sorted([source_lang, target_lang]))})


@dataclass(frozen=True)
class ParallelFiles:
    """One split on disk: `text` (one file per language), `tsv` (two columns) or `jsonl` (WMT rows)."""

    kind: str
    paths: tuple[str, ...]  # text: (source, target); tsv / jsonl: (file,)
    columns: tuple[str, str] | None = None  # tsv: the language of each column


_COMPRESSED = r"(?:\.(?:gz|xz|bz2))?"  # what `iter_lines` decompresses
_TEXT_RE = re.compile(rf"^(?P<split>[^.]+)\.(?P<lang>[^.]+?){_COMPRESSED}$")
_TSV_RE = re.compile(rf"^(?P<split>[^.]+)(?:\.(?P<l1>[^.-]+)-(?P<l2>[^.-]+))?\.tsv{_COMPRESSED}$")
_JSONL_RE = re.compile(rf"^(?P<split>[^.]+)\.jsonl{_COMPRESSED}$")


def discover_parallel_files(
    data_dir: str | os.PathLike, source_lang: str, target_lang: str, splits: Sequence[str] | None = None
) -> dict[str, ParallelFiles]:
    """Find the splits of `source_lang`-`target_lang` in `data_dir` (formats: see `load_parallel_dataset`).

    All splits found, or only `splits` (aliases resolved); only those are checked, so an incomplete
    split you do not ask for (say a test set without German) is no obstacle.
    """
    if source_lang == target_lang:  # else "not enough values to unpack" where a split's other file is looked for
        raise ValueError(f"source and target language are both {source_lang!r}")
    data_dir = require_directory(data_dir, "data directory")
    names = sorted(p.name for p in data_dir.iterdir() if p.is_file())
    pair = {source_lang, target_lang}
    found: dict[str, list[ParallelFiles]] = {}
    text: dict[str, dict[str, str]] = {}  # split -> language -> path, for every language present
    for name in names:
        path = str(data_dir / name)
        if match := _JSONL_RE.match(name):
            found.setdefault(match["split"], []).append(ParallelFiles("jsonl", (path,)))
        elif match := _TSV_RE.match(name):
            columns = (match["l1"], match["l2"]) if match["l1"] else (source_lang, target_lang)
            if set(columns) == pair:
                found.setdefault(match["split"], []).append(ParallelFiles("tsv", (path,), columns))
        elif match := _TEXT_RE.match(name):
            by_lang = text.setdefault(match["split"], {})
            if match["lang"] in by_lang:
                raise ValueError(f"two files for one split and language: {by_lang[match['lang']]} and {path}")
            by_lang[match["lang"]] = path

    candidates = sorted(set(found) | {split for split, by_lang in text.items() if by_lang.keys() & pair})
    if not candidates:
        raise ValueError(
            f"no parallel files for {source_lang}-{target_lang} in {data_dir}: expected e.g. "
            f"train.{source_lang}[.gz] + train.{target_lang}[.gz], train.tsv or train.jsonl; found {names}"
        )
    wanted = candidates if splits is None else [resolve_split(candidates, split) for split in splits]
    for language in (source_lang, target_lang):
        if not any(language in text.get(split, {}) or split in found for split in wanted):
            present = sorted({lang for by_lang in text.values() for lang in by_lang})
            raise ValueError(f"no files for language {language!r} in {data_dir} (languages found: {present})")
    for split in wanted:
        by_lang = text.get(split, {})
        present = by_lang.keys() & pair
        if len(present) == 1:
            [lang], [other] = present, pair - present
            raise ValueError(f"{by_lang[lang]} has no parallel file: expected {split}.{other}[.gz|.xz|.bz2]")
        if len(present) == 2:
            found.setdefault(split, []).append(ParallelFiles("text", (by_lang[source_lang], by_lang[target_lang])))
        if len(found[split]) > 1:
            raise ValueError(f"split {split!r} is ambiguous, several files hold it: {[f.paths for f in found[split]]}")
    return {split: found[split][0] for split in wanted}


def _explicit_files(
    data_files: Mapping[str, Any], data_dir: str | os.PathLike | None, source_lang: str, target_lang: str
) -> dict[str, ParallelFiles]:
    root = Path(data_dir) if data_dir is not None else Path()
    files = {}
    for split, spec in data_files.items():
        if isinstance(spec, Mapping):
            missing = [lang for lang in (source_lang, target_lang) if lang not in spec]
            if missing:
                raise ValueError(f"data_files[{split!r}] has no file for {missing}; it has {list(spec)}")
            files[split] = ParallelFiles("text", (str(root / spec[source_lang]), str(root / spec[target_lang])))
        else:
            path = str(root / spec)
            kind = "jsonl" if ".jsonl" in Path(path).name else "tsv" if ".tsv" in Path(path).name else None
            if kind is None:
                raise ValueError(f"data_files[{split!r}] = {path}: expected a .tsv or .jsonl file, or {{lang: path}}")
            files[split] = ParallelFiles(kind, (path,), (source_lang, target_lang) if kind == "tsv" else None)
    for spec in files.values():
        for path in spec.paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"parallel data file {path} does not exist")
    return files


def _local_split(
    spec: ParallelFiles, split: str, source_lang: str, target_lang: str, cache_dir: str | None
) -> datasets.Dataset:
    # before the contents are hashed into the cache key; a tuple, which datasets does not shard over workers
    states = file_states(spec.paths)
    try:
        return datasets.Dataset.from_generator(
            _generate_rows,
            features=_translation_features(source_lang, target_lang),
            gen_kwargs={"spec": spec, "languages": (source_lang, target_lang), "states": states},
            cache_dir=cache_dir,
            split=datasets.NamedSplit(split),
            fingerprint=_content_fingerprint(spec, (source_lang, target_lang)),
        )
    except datasets.exceptions.DatasetGenerationError as err:
        if isinstance(err.__cause__, ValueError):  # our own, clear message: don't bury it under datasets'
            raise err.__cause__ from None
        raise
    except ValueError as err:
        if "corresponds to no data" not in str(err):
            raise
        # Empty files: `datasets` cannot build an empty split from a generator. An empty split, which those who
        # use it refuse naming its files (`require_rows`), rather than datasets' 'Instruction "val" ...'.
        empty = {"translation": []}
        return datasets.Dataset.from_dict(
            empty, features=_translation_features(source_lang, target_lang), split=datasets.NamedSplit(split)
        )


def _content_fingerprint(spec: ParallelFiles, languages: tuple[str, str]) -> str:
    """The cache key of a split read from files: their contents (sha256), not their paths or times, so that a corpus
    copied elsewhere (a job staging its data on a node's scratch disk) is read once, and a file edited in place is
    read again however its size and time came out (the key was path, size and mtime)."""
    contents = tuple((Path(path).name, file_sha256(path)) for path in spec.paths)
    return datasets.fingerprint.Hasher.hash((spec.kind, spec.columns, languages, contents, _code_version()))


def _generate_rows(spec: ParallelFiles, languages: tuple[str, str], states: tuple) -> Iterator[dict]:
    """Rows of one split in the WMT schema. A file that changed since `states` were taken (before its contents
    were hashed into the cache key) is refused at the end: the cache would hold one corpus's rows under another's
    key, for every later run on that corpus."""
    source_lang, target_lang = languages
    if spec.kind == "text":
        pairs = _read_text_pair(*spec.paths)
    elif spec.kind == "tsv":
        pairs = _read_tsv(spec.paths[0], spec.columns, languages)
    else:
        pairs = _read_jsonl(spec.paths[0], languages)
    for source, target in pairs:
        yield {"translation": {source_lang: source, target_lang: target}}
    now = file_states(spec.paths)
    changed = [path for path, before, after in zip(spec.paths, states, now, strict=True) if before != after]
    if changed:
        raise ValueError(
            f"{changed[0]} changed while it was read (rewritten by another job?): run again once it is written"
        )


def _read_text_pair(source_path: str, target_path: str) -> Iterator[tuple[str, str]]:
    count = 0
    missing = object()
    sources, targets = iter_lines(source_path), iter_lines(target_path)
    for source, target in zip_longest(sources, targets, fillvalue=missing):
        if source is missing or target is missing:
            rest = sum(1 for _ in (targets if source is missing else sources))
            n_source, n_target = (count, count + 1 + rest) if source is missing else (count + 1 + rest, count)
            raise ValueError(
                f"parallel files are not line-aligned: {source_path} has {n_source} lines "
                f"but {target_path} has {n_target}"
            )
        count += 1
        yield source, target


def _read_tsv(path: str, columns: tuple[str, str], languages: tuple[str, str]) -> Iterator[tuple[str, str]]:
    swap = columns != languages
    for line_number, line in enumerate(iter_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}:{line_number}: expected 2 tab-separated columns, found {len(fields)}")
        if line_number == 1 and _is_header(fields, columns, path):
            continue
        yield (fields[1], fields[0]) if swap else (fields[0], fields[1])


def _is_header(fields: list[str], columns: tuple[str, str], path: str) -> bool:
    """Whether a TSV's first line names its columns (pandas' `to_csv(sep="\\t", index=False)` writes one) rather
    than holds a sentence pair: read as one, it was a training pair, or a reference no translation matches. One naming
    the languages the other way round than `columns` is refused: every pair would be read backwards."""
    named = tuple(field.strip().lower() for field in fields)
    if named in (("source", "target"), ("src", "tgt"), tuple(lang.lower() for lang in columns)):
        return True
    if named == tuple(lang.lower() for lang in reversed(columns)):
        raise ValueError(
            f"{path}:1: its header names the columns {fields[0]!r}, {fields[1]!r}, but they would be read as "
            f"{columns[0]!r}, {columns[1]!r}: swap the columns, or name the file "
            f"{Path(path).name.partition('.')[0]}.{named[0]}-{named[1]}.tsv in the data directory"
        )
    return False


def _read_jsonl(path: str, languages: tuple[str, str]) -> Iterator[tuple[str, str]]:
    for line_number, line in enumerate(iter_lines(path), start=1):
        try:
            pair = json.loads(line)["translation"]
            sentences = pair[languages[0]], pair[languages[1]]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(
                f'{path}:{line_number}: expected {{"translation": {{"{languages[0]}": ..., '
                f'"{languages[1]}": ...}}}}, got {line[:200]!r} ({type(err).__name__}: {err})'
            ) from err
        for language, sentence in zip(languages, sentences, strict=True):
            if not isinstance(sentence, str):  # null or a list would crash cleaning, or datasets naming no file
                raise ValueError(
                    f"{path}:{line_number}: the {language!r} sentence must be a string, "
                    f"got {json.dumps(sentence, ensure_ascii=False)[:200]}"
                )
        yield sentences


def split_source(
    split: str,
    *,
    source_lang: str,
    target_lang: str,
    dataset: str | None = None,
    language_pair: str | None = None,
    data_dir: str | os.PathLike | None = None,
) -> str:
    """Where split `split` comes from, in words: its local files, or the Hub dataset, configuration and split."""
    if data_dir is not None:
        try:
            files = discover_parallel_files(data_dir, source_lang, target_lang, [split])
            return " + ".join(path for spec in files.values() for path in spec.paths)
        except (OSError, ValueError, KeyError):
            return f"{data_dir} (split {split!r})"
    return f"{dataset}" + (f" ({language_pair})" if language_pair else "") + f", split {split!r}"


def require_rows(part: datasets.Dataset, split: str, source: str) -> datasets.Dataset:
    """`part`, unless it is empty: then a ValueError naming the split and where it comes from."""
    if len(part) == 0:
        raise ValueError(f"split {split!r} is empty: {source} hold(s) no sentence pairs")
    return part


# --- cleaning ------------------------------------------------------------------------------------------

# Rejection codes, in the order the rules are applied; a pair is counted under the first rule it breaks.
# _UNMEASURED: kept, a side being written without spaces between words, where the ratio rule cannot apply.
_KEEP, _EMPTY, _TOO_LONG, _RATIO, _UNMEASURED = range(5)
# Scripts written without spaces between words: Thai, Lao, Tibetan, Myanmar, Khmer, Hiragana and Katakana, CJK
# ideographs (extension A, unified, compatibility, the supplementary planes), halfwidth Katakana.
_UNSEGMENTED_SCRIPT = re.compile(
    "[\u0e00-\u0fff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\uff66-\uff9f\U00020000-\U0003134f]"
)


def clean_parallel_dataset(
    ds: datasets.DatasetDict,
    source_lang: str,
    target_lang: str,
    *,
    max_length: int | None = 250,
    max_ratio: float | None = 1.5,
    splits: Sequence[str] = ("train",),
    num_proc: int | None = None,
) -> tuple[datasets.DatasetDict, dict[str, dict[str, int]]]:
    """Drop unusable training pairs as Moses `clean-corpus-n.perl` does; return the data and the counts.

    Rules, applied in order, lengths in whitespace-separated words (`visible_words`):
      1. `empty`: either side is empty or blank (whitespace and characters that show nothing, `is_blank`);
      2. `too_long`: either side has more than `max_length` words;
      3. `ratio`: the longer side has more than `max_ratio` times the words of the shorter; not applied to a pair
         with a side in a script written without spaces between words (Chinese, Japanese, Thai, ...), whose
         sentences are one "word" or a few however long: it removed nearly every English-Chinese pair.
    Defaults are fairseq's `prepare-wmt14en2de.sh` (`clean-corpus-n.perl -ratio 1.5 ... 1 250`), which
    counts BPE tokens; we count words because cleaning runs before the BPE is trained. `None` disables a
    rule. Only `splits` (default: the training split) are touched: test sentences are never dropped.
    Counts per cleaned split: `{"total", "empty", "too_long", "ratio", "kept"}`.
    `max_length` and `max_ratio` are at least 1: below, every non-empty pair would be removed.
    """
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be at least 1 (word), got {max_length}")
    if max_ratio is not None and max_ratio < 1:  # the longer side over the shorter: 1 at least
        raise ValueError(f"max_ratio must be at least 1 (equal lengths), got {max_ratio}")
    out, counts = dict(ds), {}
    for name in splits:
        split = resolve_split(ds, name)
        with _naming_a_full_disk(_cache_directory(ds[split])):
            codes_ds = ds[split].map(
                _rejection_codes,
                batched=True,
                input_columns="translation",
                remove_columns=ds[split].column_names,
                fn_kwargs={
                    "languages": (source_lang, target_lang),
                    "max_length": max_length,
                    "max_ratio": max_ratio,
                },
                num_proc=num_proc,
                desc=f"clean {split}",
                new_fingerprint=_cleaning_fingerprint(ds[split], (source_lang, target_lang), max_length, max_ratio),
            )
        # datasets maps an empty split to one without columns, "reject" included
        codes = codes_ds.with_format("arrow")["reject"].to_numpy() if len(codes_ds) else np.zeros(0, dtype=np.int64)
        by_rule = np.bincount(codes, minlength=5)
        kept = by_rule[_KEEP] + by_rule[_UNMEASURED]
        counts[split] = {
            "total": len(codes),
            "empty": int(by_rule[_EMPTY]),
            "too_long": int(by_rule[_TOO_LONG]),
            "ratio": int(by_rule[_RATIO]),
            "kept": int(kept),
        }
        logger.info(
            "cleaned %s: kept %d of %d pairs; removed %d empty, %d longer than %s words, %d with length ratio > %s%s",
            split,
            kept,
            len(codes),
            by_rule[_EMPTY],
            by_rule[_TOO_LONG],
            max_length,
            by_rule[_RATIO],
            max_ratio,
            f" ({by_rule[_UNMEASURED]} past it kept: a side is written without spaces between words)"
            if by_rule[_UNMEASURED]
            else "",
        )
        if len(codes) and not kept:
            raise ValueError(
                f"cleaning removed every one of the {len(codes)} pairs of split {split!r}: "
                f"{by_rule[_EMPTY]} with an empty side, {by_rule[_TOO_LONG]} longer than {max_length} words, "
                f"{by_rule[_RATIO]} with a length ratio above {max_ratio}; check the data (are the two files the "
                "same language pair, line for line?) or turn cleaning off (DataArguments.clean, --no_clean)"
            )
        out[split] = ds[split].select(np.flatnonzero((codes == _KEEP) | (codes == _UNMEASURED)))
    return datasets.DatasetDict(out), counts


def _cleaning_fingerprint(
    part: datasets.Dataset, languages: tuple[str, str], max_length: int | None, max_ratio: float | None
) -> str:
    """The cache key of a split's rejection codes: the split, the rules' settings and this code. datasets' own key
    hashes `_rejection_codes` by its name alone, so a Hub dataset (whose key says nothing of this code) was cleaned
    from the cache by the rules of the release that first cleaned it."""
    return datasets.fingerprint.Hasher.hash((part._fingerprint, languages, max_length, max_ratio, _code_version()))


def _rejection_codes(
    pairs: list[dict[str, str]], languages: tuple[str, str], max_length: int | None, max_ratio: float | None
) -> dict[str, list[int]]:
    codes = []
    for pair in pairs:
        n_source, n_target = (len(visible_words(pair[lang])) for lang in languages)
        shorter, longer = sorted((n_source, n_target))
        if shorter == 0:
            codes.append(_EMPTY)
        elif max_length is not None and longer > max_length:
            codes.append(_TOO_LONG)
        elif max_ratio is not None and longer > max_ratio * shorter:
            # Searched only here: most pairs pass the rule, and WMT's 4.5M would each be scanned twice.
            unsegmented = any(_UNSEGMENTED_SCRIPT.search(pair[lang]) for lang in languages)
            codes.append(_UNMEASURED if unsegmented else _RATIO)
        else:
            codes.append(_KEEP)
    return {"reject": codes}


# --- tokenisation --------------------------------------------------------------------------------------


def tokenize_parallel_dataset(
    ds: datasets.DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    source_lang: str,
    target_lang: str,
    *,
    max_length: int | None = None,
    num_proc: int | None = None,
) -> datasets.DatasetDict:
    """Encode every split into `input_ids`, `attention_mask` and `labels` (both ending in `</s>`).

    The text column is dropped so that `DataCollatorForSeq2Seq` can pad the rest; keep the untokenised
    DatasetDict for references. Sequences longer than `max_length` tokens are truncated, keeping their
    final `</s>`, and counted in the log (and in a training run's `data_stats.json`); none are dropped, so test
    sets stay complete (over-long training pairs are better removed by `clean_parallel_dataset`). Results are
    cached by `datasets`.
    `max_length` is at least 2: one token and `</s>`. `num_proc` processes tokenise each split; by default
    (None) one per available core for a large split (WMT's: one process took 11 minutes for English-German),
    one for the others.
    """
    return tokenize_counting_truncations(
        ds, tokenizer, source_lang, target_lang, max_length=max_length, num_proc=num_proc
    )[0]


def tokenize_counting_truncations(
    ds: datasets.DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    source_lang: str,
    target_lang: str,
    *,
    max_length: int | None = None,
    num_proc: int | None = None,
) -> tuple[datasets.DatasetDict, dict[str, int]]:
    """`tokenize_parallel_dataset`, and each split's number of sequences truncated (a pair cut on both sides
    counts two), for the run's records: a log line alone is lost with the log."""
    if max_length is not None and max_length < 2:  # 0 would keep every sequence whole, below 0 cut out tokens
        raise ValueError(f"max_length must be at least 2 (one token and the end-of-sentence token), got {max_length}")
    out, truncations = {}, {}
    for split, part in ds.items():
        languages = (source_lang, target_lang)
        with _naming_a_full_disk(_cache_directory(part)):
            encoded = part.map(
                _encode,
                batched=True,
                input_columns="translation",
                remove_columns=part.column_names,
                features=TOKENISED_FEATURES,
                fn_kwargs={"tokenizer": tokenizer, "languages": languages, "max_length": max_length},
                num_proc=num_proc if num_proc is not None else tokenisation_workers(len(part)),
                new_fingerprint=_tokenization_fingerprint(part, tokenizer, languages, max_length),
                desc=f"tokenise {split}",
            )
        if not encoded.column_names:  # datasets maps an empty split to one without columns, "truncated" included
            encoded = datasets.Dataset.from_dict(dict.fromkeys(TOKENISED_FEATURES, []), features=TOKENISED_FEATURES)
        truncated = pc.sum(encoded.with_format("arrow")["truncated"]).as_py() or 0
        if truncated:
            logger.warning("%s: truncated %d sequences to max_length=%d tokens", split, truncated, max_length)
        out[split] = encoded.remove_columns("truncated")
        truncations[split] = truncated
    return datasets.DatasetDict(out), truncations


# The tokenised columns, as small as they hold (datasets would store labels in 64 bits: English-French WMT's
# tokenised copy took 19 GB).
TOKENISED_FEATURES = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "attention_mask": datasets.Sequence(datasets.Value("int8")),
        "labels": datasets.Sequence(datasets.Value("int32")),
        "truncated": datasets.Value("int8"),
    }
)
# Below this many pairs per process, starting processes costs more than it gains.
PAIRS_PER_TOKENISATION_WORKER = 50_000


def tokenisation_workers(pairs: int) -> int | None:
    """Processes to tokenise `pairs` pairs by default: one per available core, each with enough pairs to be worth
    starting; None (this process) for fewer than two."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = min(cores, pairs // PAIRS_PER_TOKENISATION_WORKER)
    return workers if workers > 1 else None


@functools.cache
def _code_version() -> str:
    """What the cache keys hold of the code that reads and encodes: this module's and files.py's source (datasets
    hashes a function by its name alone), and the libraries that tokenise."""
    modules = (__file__, inspect.getsourcefile(iter_lines))
    sources = [Path(module).read_text(encoding="utf-8") for module in modules]
    return datasets.fingerprint.Hasher.hash((sources, transformers.__version__, tokenizers.__version__))


def _tokenization_fingerprint(
    part: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, languages: tuple[str, str], max_length: int | None
) -> str | None:
    """The cache key of a split's tokenisation: what decides its content (the split, the tokenizer's rules,
    vocabulary and special tokens, the languages, max_length, this code), not where the tokenizer was loaded from.
    datasets' own key hashes the tokenizer object, path and loading options included, which differ between the
    process that trained the BPE, the other processes and a requeue: each tokenised WMT's corpus again (10 minutes
    and 2.3 GB of cache for English-German). None (datasets' own key) for a tokenizer without a Rust backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    content = (
        part._fingerprint,
        type(tokenizer).__name__,
        backend.to_str(),
        tokenizer.special_tokens_map,
        getattr(tokenizer, "split_special_tokens", False),
        languages,
        max_length,
        TOKENISED_FEATURES,
        _code_version(),
    )
    return datasets.fingerprint.Hasher.hash(content)


def _encode(
    pairs: list[dict[str, str]],
    tokenizer: PreTrainedTokenizerBase,
    languages: tuple[str, str],
    max_length: int | None,
) -> dict[str, list]:
    source_lang, target_lang = languages
    encoded = tokenizer([p[source_lang] for p in pairs], text_target=[p[target_lang] for p in pairs])
    input_ids, labels = encoded["input_ids"], encoded["labels"]
    truncated = [0] * len(pairs)
    if max_length is not None:
        for i, (source, target) in enumerate(zip(input_ids, labels, strict=True)):
            if len(source) > max_length or len(target) > max_length:
                truncated[i] = int(len(source) > max_length) + int(len(target) > max_length)
                input_ids[i], labels[i] = _truncate(source, max_length), _truncate(target, max_length)
    return {
        "input_ids": input_ids,
        "attention_mask": [[1] * len(ids) for ids in input_ids],
        "labels": labels,
        "truncated": truncated,
    }


def _truncate(ids: list[int], max_length: int) -> list[int]:
    return ids if len(ids) <= max_length else ids[: max_length - 1] + ids[-1:]  # keep the final </s>
