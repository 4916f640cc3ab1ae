"""Tests for loading, cleaning, tokenising and token-budget batching (modeling/data.py).

All data is synthetic and written by the tests; the Multi30k test skips when ../shared is absent."""

import bz2
import errno
import gzip
import json
import logging
import lzma
import os
import re
import shutil
import socket
import time
from pathlib import Path
from unittest import mock

import datasets
import huggingface_hub.utils._http as hf_http
import pyarrow
import pyarrow.parquet
import pytest
import torch
from helpers import (
    HUB_TOKEN,
    MULTI30K,
    push_translation_dataset,
    stalled_endpoint,
    synthetic_pairs,
    word_for_word,
    write_corpus,
)
from huggingface_hub import HfApi, constants, snapshot_download
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, DataCollatorForSeq2Seq

from modeling import data as data_module
from modeling.batching import TokenBudgetBatchSampler, sequence_lengths
from modeling.data import (
    PAIRS_PER_TOKENISATION_WORKER,
    ParallelFiles,
    clean_parallel_dataset,
    discover_parallel_files,
    load_parallel_dataset,
    normalize_translation_dataset,
    pinned_dataset_commit,
    require_rows,
    resolve_split,
    split_source,
    tokenisation_workers,
    tokenize_counting_truncations,
    tokenize_parallel_dataset,
)
from modeling.files import DiskFullError
from modeling.tokenization import train_shared_bpe

EN = ["a man runs .", "two dogs play in the park .", "a woman in a red shirt .", "the boy eats ."]


DE = ["ein mann läuft .", "zwei hunde spielen im park .", "eine frau in einem roten hemd .", "der junge isst ."]


VAL_EN, VAL_DE = ["a dog ."], ["ein hund ."]


COMPRESSORS = {".gz": gzip.compress, ".xz": lzma.compress, ".bz2": bz2.compress}


def write_lines(path: Path, lines: list[str]) -> None:
    text = "".join(f"{line}\n" for line in lines).encode()
    path.write_bytes(COMPRESSORS.get(path.suffix, bytes)(text))


def pairs(ds: datasets.Dataset, source: str = "en", target: str = "de") -> list[tuple[str, str]]:
    return [(row[source], row[target]) for row in ds["translation"]]


def load(data_dir: Path, **kwargs) -> datasets.DatasetDict:
    kwargs.setdefault("cache_dir", str(data_dir / ".cache"))
    return load_parallel_dataset(source_lang="en", target_lang="de", data_dir=data_dir, **kwargs)


@pytest.mark.parametrize("suffix", ["", ".gz", ".xz", ".bz2"])  # xz, bzip2: once "no parallel files" in the dir
def test_line_aligned_text_files(tmp_path, suffix):
    write_lines(tmp_path / f"train.en{suffix}", EN)
    write_lines(tmp_path / f"train.de{suffix}", DE)
    write_lines(tmp_path / f"val.en{suffix}", VAL_EN)
    write_lines(tmp_path / f"val.de{suffix}", VAL_DE)
    write_lines(tmp_path / f"test_2016_flickr.en{suffix}", EN[:2])
    write_lines(tmp_path / f"test_2016_flickr.de{suffix}", DE[:2])
    write_lines(tmp_path / f"test_2016_flickr.fr{suffix}", ["une", "deux"])  # other languages are ignored
    ds = load(tmp_path)
    assert sorted(ds) == ["test_2016_flickr", "train", "val"]
    assert pairs(ds["train"]) == list(zip(EN, DE, strict=True))
    assert pairs(ds["val"]) == [("a dog .", "ein hund .")]
    assert ds["train"].features["translation"] == datasets.Translation(languages=["de", "en"])


def test_tsv_files_with_column_order_from_name(tmp_path):
    write_lines(tmp_path / "train.de-en.tsv.gz", [f"{d}\t{e}" for e, d in zip(EN, DE, strict=True)])
    write_lines(tmp_path / "valid.tsv", [f"{e}\t{d}" for e, d in zip(VAL_EN, VAL_DE, strict=True)])
    write_lines(tmp_path / "test.en-fr.tsv", ["a\tb"])  # another language pair: ignored
    ds = load(tmp_path)
    assert sorted(ds) == ["train", "valid"]
    assert pairs(ds["train"]) == list(zip(EN, DE, strict=True))
    assert pairs(ds["valid"]) == [("a dog .", "ein hund .")]


@pytest.mark.parametrize("header", ["en\tde", "EN\tDE", "source\ttarget", "src\ttgt"])
def test_a_tsv_header_row_is_not_a_sentence_pair(tmp_path, header):
    write_lines(tmp_path / "train.tsv", [header] + [f"{e}\t{d}" for e, d in zip(EN, DE, strict=True)])
    assert pairs(load(tmp_path)["train"]) == list(zip(EN, DE, strict=True))


def test_a_tsv_header_naming_the_columns_the_other_way_round_is_refused(tmp_path):
    write_lines(tmp_path / "train.tsv", ["de\ten"] + [f"{d}\t{e}" for e, d in zip(EN, DE, strict=True)])
    with pytest.raises(
        ValueError,
        match=r"train\.tsv:1: its header names the columns 'de', 'en', but .* name the file train\.de-en\.tsv",
    ):
        load(tmp_path)


def test_jsonl_files_in_wmt_schema(tmp_path):
    rows = [json.dumps({"translation": {"de": d, "en": e, "fr": "x"}}) for e, d in zip(EN, DE, strict=True)]
    write_lines(tmp_path / "train.jsonl.gz", rows)
    ds = load(tmp_path)
    assert pairs(ds["train"]) == list(zip(EN, DE, strict=True))


def test_explicit_data_files(tmp_path):
    write_lines(tmp_path / "corpus.english", EN)
    write_lines(tmp_path / "corpus.german", DE)
    write_lines(tmp_path / "dev.tsv", ["a dog .\tein hund ."])
    ds = load_parallel_dataset(
        source_lang="en",
        target_lang="de",
        data_dir=tmp_path,
        data_files={"train": {"en": "corpus.english", "de": "corpus.german"}, "validation": "dev.tsv"},
        cache_dir=str(tmp_path / ".cache"),
    )
    assert pairs(ds["train"]) == list(zip(EN, DE, strict=True))
    assert pairs(ds["validation"]) == [("a dog .", "ein hund .")]


def test_named_data_files_keep_only_the_splits_asked_for(tmp_path):
    """`splits` with `data_files` as with a data directory: only those splits (aliases resolved) are read."""
    write_lines(tmp_path / "corpus.tsv", [f"{e}\t{d}" for e, d in zip(EN, DE, strict=True)])
    write_lines(tmp_path / "dev.tsv", ["a dog .\tein hund ."])
    ds = load(tmp_path, data_files={"train": "corpus.tsv", "dev": "dev.tsv"}, splits=["validation"])
    assert list(ds) == ["dev"] and pairs(ds["dev"]) == [("a dog .", "ein hund .")]


def test_named_data_files_need_no_data_directory_but_exclude_a_hub_dataset(tmp_path):
    """`data_files` alone (paths as given) are local files; with `dataset=` too, one of the two would be ignored."""
    write_lines(tmp_path / "corpus.tsv", [f"{e}\t{d}" for e, d in zip(EN, DE, strict=True)])
    ds = load_parallel_dataset(
        source_lang="en",
        target_lang="de",
        data_files={"train": str(tmp_path / "corpus.tsv")},
        cache_dir=str(tmp_path / ".cache"),
    )
    assert pairs(ds["train"]) == list(zip(EN, DE, strict=True))
    with pytest.raises(ValueError, match="either dataset="):
        load_parallel_dataset(
            source_lang="en", target_lang="de", dataset="wmt/wmt14", data_files={"train": str(tmp_path / "corpus.tsv")}
        )


def test_split_aliases_and_selection(tmp_path):
    for split in ("train", "val", "test_2016_flickr"):
        write_lines(tmp_path / f"{split}.en", VAL_EN)
        write_lines(tmp_path / f"{split}.de", VAL_DE)
    ds = load(tmp_path, splits=["validation", "test"])
    assert sorted(ds) == ["test_2016_flickr", "val"]  # real names are kept
    assert resolve_split(ds, "validation") == "val"
    assert resolve_split(["train", "newstest2013", "newstest2014"], "test") == "newstest2014"
    assert resolve_split(["validation", "val"], "validation") == "validation"
    # Every usual spelling is found (fairseq's "valid", Multi30k's "val", "dev", WMT's newstest sets), the first
    # present in SPLIT_ALIASES order when several are.
    for alias in ("valid", "val", "dev", "newstest2013"):
        assert resolve_split(["train", alias], "validation") == alias
    assert resolve_split(["dev", "valid"], "validation") == "valid"
    assert resolve_split(["train", "test_2016_flickr"], "test") == "test_2016_flickr"
    with pytest.raises(KeyError, match="no split 'train'"):
        resolve_split(ds, "train")


def test_edited_file_is_not_served_from_a_stale_cache(tmp_path):
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", DE)
    assert len(load(tmp_path)["train"]) == 4
    write_lines(tmp_path / "train.en", EN[:3])
    write_lines(tmp_path / "train.de", DE[:3])
    assert len(load(tmp_path)["train"]) == 3


def test_the_cache_knows_a_corpus_by_its_content_not_its_place_or_time(tmp_path, datasets_cache):
    """Keyed on path, size and mtime, a corpus staged elsewhere was read (and cached) again, and an edit that kept
    the size and the time (cp -p, rsync -a, tar x) was served from the stale cache."""
    corpus = write_corpus(tmp_path / "corpus", 20, word_for_word)
    staged = shutil.copytree(corpus, tmp_path / "scratch" / "job-1")
    cache_dir = str(tmp_path / "cache")
    assert (
        load(corpus, cache_dir=cache_dir)["train"].cache_files
        == load(staged, cache_dir=cache_dir)["train"].cache_files
    )
    stamp = (corpus / "train.en").stat()
    lines = (corpus / "train.en").read_text().splitlines()
    (corpus / "train.en").write_text("\n".join([lines[0][::-1], *lines[1:]]) + "\n")  # the same size
    os.utime(corpus / "train.en", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert load(corpus, cache_dir=cache_dir)["train"][0]["translation"]["en"] == lines[0][::-1]


def test_a_corpus_rewritten_while_it_is_read_is_refused_and_leaves_no_cache_entry(
    tmp_path, datasets_cache, monkeypatch
):
    """A data-preparation job rewrote train.de after its contents were hashed into the cache key: the cache held
    the new rows under the old contents' key, and every later run on the old corpus trained on the new one."""
    corpus = write_corpus(tmp_path / "corpus", 20, word_for_word)
    original = shutil.copytree(corpus, tmp_path / "original")
    cache_dir = str(tmp_path / "cache")
    content_fingerprint = data_module._content_fingerprint

    def rewritten_once_hashed(spec, languages):
        key = content_fingerprint(spec, languages)
        if Path(spec.paths[1]).name == "train.de":
            lines = Path(spec.paths[1]).read_text().splitlines()
            Path(spec.paths[1]).write_text("\n".join(["NEU " + line for line in lines]) + "\n")
        return key

    monkeypatch.setattr(data_module, "_content_fingerprint", rewritten_once_hashed)
    with pytest.raises(ValueError, match=rf"^{corpus / 'train.de'} changed while it was read \(rewritten by another"):
        load(corpus, cache_dir=cache_dir)
    monkeypatch.undo()
    first = (original / "train.de").read_text().splitlines()[0]
    assert load(original, cache_dir=cache_dir)["train"][0]["translation"]["de"] == first, "the original's own rows"
    assert load(corpus, cache_dir=cache_dir)["train"][0]["translation"]["de"] == "NEU " + first


@pytest.mark.parametrize("longer", ["en", "de"])
def test_mismatched_line_counts_name_both_files_and_counts(tmp_path, longer):
    extra = ["one more .", "and another ."]  # counted to the end of the longer file
    write_lines(tmp_path / "train.en.gz", EN + extra if longer == "en" else EN)
    write_lines(tmp_path / "train.de", DE + extra if longer == "de" else DE)
    n_en, n_de = (6, 4) if longer == "en" else (4, 6)
    with pytest.raises(ValueError, match=rf"train\.en\.gz has {n_en} lines but .*train\.de has {n_de}"):
        load(tmp_path)


def test_missing_language_and_missing_side_are_named(tmp_path):
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.fr", EN)
    with pytest.raises(ValueError, match=r"no files for language 'de' .*languages found: \['en', 'fr'\]"):
        load(tmp_path)
    write_lines(tmp_path / "train.de", DE)
    write_lines(tmp_path / "val.en", VAL_EN)
    with pytest.raises(ValueError, match=r"val\.en has no parallel file: expected val\.de"):
        load(tmp_path)


def test_incomplete_split_only_matters_when_asked_for(tmp_path):
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", DE)
    write_lines(tmp_path / "test_2018_flickr.en", VAL_EN)  # no German side
    assert sorted(load(tmp_path, splits=["train"])) == ["train"]
    with pytest.raises(ValueError, match="test_2018_flickr.en has no parallel file"):
        load(tmp_path)


def test_a_datasets_cache_that_cannot_be_written_is_named_with_the_way_out(tmp_path, monkeypatch):
    """HF_HOME on a file system read-only to compute jobs: datasets writes even a local corpus, and a lock beside a
    cached one, into its cache, and said only "[Errno 30] Read-only file system: '.../datasets'"."""
    write_lines(tmp_path / "test.en", EN)
    write_lines(tmp_path / "test.de", DE)
    default_cache, given_cache = tmp_path / "hf_home" / "datasets", tmp_path / ".cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(default_cache))

    def read_only(*args, cache_dir=None, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(Path(cache_dir or default_cache) / "generator"))

    monkeypatch.setattr(datasets.Dataset, "from_generator", read_only)
    with pytest.raises(OSError) as error:
        load(tmp_path, cache_dir=None)
    assert str(error.value) == (
        f"cannot write the datasets cache {default_cache} (Read-only file system): set HF_DATASETS_CACHE to a "
        "writable directory (e.g. export HF_DATASETS_CACHE=$TMPDIR/datasets)"
    )
    assert error.value.errno == errno.EROFS
    with pytest.raises(OSError) as error:  # a cache the caller chose (train_tokenizer.py --cache-dir)
        load(tmp_path, cache_dir=str(given_cache))
    assert str(error.value) == (
        f"cannot write the datasets cache {given_cache} (Read-only file system): give a writable cache directory"
    )

    # The cache itself, or a parent datasets makes it in (HF_HOME not yet made, on a read-only file system).
    for written in (default_cache, default_cache.parent):

        def cannot_make(*args, written=written, **kwargs):
            raise OSError(errno.EACCES, "Permission denied", str(written))

        monkeypatch.setattr(datasets.Dataset, "from_generator", cannot_make)
        with pytest.raises(
            OSError, match=rf"^cannot write the datasets cache {re.escape(str(default_cache))} \(Permission"
        ):
            load(tmp_path, cache_dir=None)

    def not_found_in_the_cache(*args, cache_dir=None, **kwargs):  # not a permission: the error as it was
        raise OSError(errno.ENOENT, "No such file or directory", str(given_cache / "generator"))

    monkeypatch.setattr(datasets.Dataset, "from_generator", not_found_in_the_cache)
    with pytest.raises(FileNotFoundError, match=r"^\[Errno 2\] No such file or directory: "):
        load(tmp_path, cache_dir=str(given_cache))

    def unnamed(*args, **kwargs):  # no file named: the error as it was
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(datasets.Dataset, "from_generator", unnamed)
    with pytest.raises(PermissionError, match=r"^\[Errno 13\] Permission denied$"):
        load(tmp_path)

    def elsewhere(*args, **kwargs):  # not the cache: the error as it was
        raise OSError(errno.EACCES, "Permission denied", "/somewhere/else")

    monkeypatch.setattr(datasets.Dataset, "from_generator", elsewhere)
    with pytest.raises(PermissionError, match=r"Permission denied: '/somewhere/else'"):
        load(tmp_path)


def no_space_left(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def quota_exceeded(*args, **kwargs):
    raise OSError(errno.EDQUOT, "Disk quota exceeded")


@pytest.mark.parametrize(("failure", "message"), [(no_space_left, "No space left"), (quota_exceeded, "Disk quota")])
def test_a_full_disk_while_a_local_corpus_is_cached_names_the_cache(tmp_path, monkeypatch, failure, message):
    """datasets writes a local corpus into its cache: a full disk then ended train.py, train_tokenizer.py and
    evaluate.py with a traceback of "An error occurred while generating the dataset", naming neither the full disk
    nor the cache; a full quota, with its bare "[Errno 122] Disk quota exceeded"."""
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", DE)
    monkeypatch.setattr(datasets.arrow_writer.ArrowWriter, "write_examples_on_file", failure)
    cache = tmp_path / "cache"
    with pytest.raises(DiskFullError, match=rf"^{message} .* while writing {re.escape(str(cache))}"):
        load(tmp_path, cache_dir=str(cache))


@pytest.mark.parametrize("step", ["clean", "tokenise"])
def test_a_full_disk_while_cleaning_or_tokenising_names_the_cache(tmp_path, monkeypatch, datasets_cache, step):
    """Their maps write Arrow files beside the corpus's: datasets said only "[Errno 28] No space left on device"."""
    text = load_parallel_dataset(
        source_lang="en", target_lang="de", data_dir=write_corpus(tmp_path, 20, word_for_word)
    )
    cache = Path(text["train"].cache_files[0]["filename"]).parent
    monkeypatch.setattr(datasets.arrow_writer.ArrowWriter, "write_batch", no_space_left)
    with pytest.raises(DiskFullError, match=rf"^No space left on device while writing {re.escape(str(cache))} \("):
        if step == "clean":
            clean_parallel_dataset(text, "en", "de")
        else:
            tokenize_parallel_dataset(text, train_shared_bpe(EN + DE, vocab_size=120), "en", "de")


def test_missing_or_unreadable_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="no parallel files for en-de"):
        load(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^parallel data file .*absent\.tsv does not exist$"):
        load(tmp_path, data_files={"train": "absent.tsv"})
    (tmp_path / "train.en.gz").write_bytes(b"not gzip at all")
    write_lines(tmp_path / "train.de", DE)
    with pytest.raises(
        ValueError, match=r"train\.en\.gz is named \.gz but holds no gzip data \(it starts with b'not gzip'\)"
    ):
        load(tmp_path)


def test_malformed_tsv_and_jsonl_rows_are_located(tmp_path):
    write_lines(tmp_path / "train.tsv", ["a\tb", "only one column"])
    with pytest.raises(ValueError, match=r"train\.tsv:2: expected 2 tab-separated columns, found 1"):
        load(tmp_path)
    (tmp_path / "train.tsv").unlink()
    write_lines(tmp_path / "train.jsonl", [json.dumps({"translation": {"en": "a", "fr": "b"}})])
    with pytest.raises(
        ValueError, match=r'train\.jsonl:1: expected \{"translation": \{"en": \.\.\., "de": \.\.\.\}\}, .*KeyError'
    ):
        load(tmp_path)


@pytest.mark.parametrize("kind", ["text", "tsv", "jsonl"])
def test_a_byte_order_mark_opening_a_file_is_not_text(tmp_path, kind):
    """Each reader gets `iter_lines`'s lines: a BOM would start the first English sentence, or break its JSON."""
    bom = "\ufeff"
    if kind == "text":
        write_lines(tmp_path / "train.en", [bom + EN[0], *EN[1:]])
        write_lines(tmp_path / "train.de.gz", [bom + DE[0], *DE[1:]])
    else:
        rows = {
            "tsv": [f"{e}\t{d}" for e, d in zip(EN, DE, strict=True)],
            "jsonl": [json.dumps({"translation": {"en": e, "de": d}}) for e, d in zip(EN, DE, strict=True)],
        }[kind]
        name = "train.tsv.gz" if kind == "tsv" else "train.jsonl"
        write_lines(tmp_path / name, [bom + rows[0], *rows[1:]])
    assert pairs(load(tmp_path)["train"]) == list(zip(EN, DE, strict=True))


@pytest.mark.parametrize("value", [None, ["eine Übung"], 3, {"text": "a dict"}])
def test_a_jsonl_value_that_is_not_a_string_is_located(tmp_path, value):
    rows = [{"translation": {"en": e, "de": d}} for e, d in zip(EN, DE, strict=True)]
    rows[2]["translation"]["en"] = value
    write_lines(tmp_path / "train.jsonl.gz", [json.dumps(row) for row in rows])
    with pytest.raises(ValueError, match=r"^\S*train\.jsonl\.gz:3: the 'en' sentence must be a string, got ") as error:
        load(tmp_path)
    assert "\n" not in str(error.value) and str(error.value).endswith(f"got {json.dumps(value, ensure_ascii=False)}")


def test_ambiguous_split_is_rejected(tmp_path):
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", DE)
    write_lines(tmp_path / "train.tsv", ["a\tb"])
    with pytest.raises(ValueError, match="split 'train' is ambiguous"):
        discover_parallel_files(tmp_path, "en", "de")


def test_found_files_say_their_format(tmp_path):
    """Each split's kind, paths and columns: scripts/evaluate.py names "the source file" and "the reference file"
    of a text pair only, "the data file" of a TSV or JSONL."""
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", DE)
    write_lines(tmp_path / "valid.de-en.tsv", ["ein hund .\ta dog ."])
    write_lines(tmp_path / "test.jsonl", [json.dumps({"translation": {"en": "a dog .", "de": "ein hund ."}})])
    assert discover_parallel_files(tmp_path, "en", "de") == {
        "test": ParallelFiles("jsonl", (str(tmp_path / "test.jsonl"),)),
        "train": ParallelFiles("text", (str(tmp_path / "train.en"), str(tmp_path / "train.de"))),
        "valid": ParallelFiles("tsv", (str(tmp_path / "valid.de-en.tsv"),), ("de", "en")),
    }


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="either dataset="):
        load_parallel_dataset(source_lang="en", target_lang="de")
    with pytest.raises(ValueError, match="either dataset="):
        load_parallel_dataset(source_lang="en", target_lang="de", dataset="wmt/wmt14", data_dir=tmp_path)
    with pytest.raises(ValueError, match="both 'en'"):
        load_parallel_dataset(source_lang="en", target_lang="en", data_dir=tmp_path)
    # Named files and a Hub dataset too: a TSV read as English twice gave one column, {"en": <the second>}.
    write_lines(tmp_path / "dev.tsv", ["a dog .\tein hund ."])
    with pytest.raises(ValueError, match="both 'en'"):
        load_parallel_dataset(source_lang="en", target_lang="en", data_dir=tmp_path, data_files={"train": "dev.tsv"})
    with pytest.raises(ValueError, match="both 'en'"):
        load_parallel_dataset(source_lang="en", target_lang="en", dataset=str(tmp_path))


def test_a_revision_of_local_files_is_refused(tmp_path):
    """A revision names a commit, branch or tag of a Hub dataset: with local files it would be ignored silently, the
    run recording a version of data it did not read."""
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", DE)
    with pytest.raises(ValueError, match=r"^revision='v1' names a version of a Hub dataset: local files have none$"):
        load(tmp_path, revision="v1")


def test_named_data_files_that_cannot_be_read_as_a_pair_are_named(tmp_path):
    write_lines(tmp_path / "corpus.en", EN)
    write_lines(tmp_path / "corpus.txt", EN)
    with pytest.raises(ValueError, match=r"^data_files\['train'\] has no file for \['de'\]; it has \['en'\]$"):
        load(tmp_path, data_files={"train": {"en": "corpus.en"}})
    with pytest.raises(ValueError, match=r"^data_files\['train'\] = .*corpus\.txt: expected a \.tsv or \.jsonl file"):
        load(tmp_path, data_files={"train": "corpus.txt"})


def test_finding_files_of_one_language_twice_or_in_a_file_is_refused_naming_it(tmp_path):
    """train.py (which looks for the training files first) said "not enough values to unpack (expected 1, got 0)"
    for --source_lang en --target_lang en; a file given as the data directory "does not exist"."""
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", DE)
    with pytest.raises(ValueError, match=r"^source and target language are both 'en'$"):
        discover_parallel_files(tmp_path, "en", "en", ["train"])
    with pytest.raises(
        NotADirectoryError, match=r"^data directory .*train\.en is a file: give the directory that holds it\.$"
    ):
        discover_parallel_files(tmp_path / "train.en", "en", "de")
    write_lines(tmp_path / "train.en.gz", EN[:2])  # which one is the corpus? neither is chosen in silence
    with pytest.raises(ValueError, match=r"^two files for one split and language: .*train\.en and .*train\.en\.gz$"):
        discover_parallel_files(tmp_path, "en", "de")


def hub_like(features: datasets.Features | None = None, **columns) -> datasets.DatasetDict:
    """A DatasetDict shaped like a Hub translation dataset, e.g. wmt/wmt14 de-en."""
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns, features=features)})


def test_wmt_schema_with_translation_feature():
    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})
    rows = [{"de": d, "en": e} for e, d in zip(EN, DE, strict=True)]
    ds = normalize_translation_dataset(hub_like(features, translation=rows), "en", "de")
    assert pairs(ds["train"]) == list(zip(EN, DE, strict=True))
    assert ds["train"].column_names == ["translation"]


def test_extra_languages_and_columns_are_dropped():
    rows = [{"de": d, "en": e, "fr": "x"} for e, d in zip(EN, DE, strict=True)]
    ds = normalize_translation_dataset(hub_like(translation=rows, id=list(range(4))), "de", "en")
    assert ds["train"].column_names == ["translation"]
    assert list(ds["train"][0]["translation"]) == ["de", "en"]
    assert pairs(ds["train"], "de", "en") == list(zip(DE, EN, strict=True))


def test_one_column_per_language():
    ds = normalize_translation_dataset(hub_like(en=EN, de=DE, score=[1.0] * 4), "en", "de")
    assert pairs(ds["train"]) == list(zip(EN, DE, strict=True))


def test_dataset_option_goes_through_load_dataset(tmp_path):
    # The Hub code path, offline: `datasets.load_dataset` also reads a local folder of JSONL splits.
    rows = [json.dumps({"translation": {"de": d, "en": e}}) for e, d in zip(EN, DE, strict=True)]
    write_lines(tmp_path / "train.jsonl", rows)
    write_lines(tmp_path / "validation.jsonl", rows[:1])
    ds = load_parallel_dataset(
        source_lang="de", target_lang="en", dataset=str(tmp_path), splits=["validation"], cache_dir=str(tmp_path / "c")
    )
    assert list(ds) == ["validation"] and pairs(ds["validation"], "de", "en") == [(DE[0], EN[0])]


def test_a_hub_dataset_on_a_stalled_hub_fails_within_the_timeout(quick_hub, monkeypatch, tmp_path):
    """Without the Hub's timeouts, a Hub dataset named on a Hub that never answers waited minutes, retried."""
    monkeypatch.setattr(hf_http.time, "sleep", lambda seconds: None)  # huggingface_hub's pauses between retries
    with stalled_endpoint() as endpoint:
        quick_hub(endpoint)
        monkeypatch.setattr(datasets.config, "HF_ENDPOINT", endpoint)
        start = time.monotonic()
        with pytest.raises(ConnectionError, match="^Couldn't reach 'user/corpus' on the Hub"):
            load_parallel_dataset(source_lang="en", target_lang="de", dataset="user/corpus", cache_dir=str(tmp_path))
        assert time.monotonic() - start < 10


def write_wmt14_like(repo: Path) -> Path:
    """wmt/wmt14's layout: parquet files by split, the configs in README.md."""
    (repo / "de-en").mkdir(parents=True)
    for split, count in (("train", 50), ("validation", 3), ("test", 4)):
        rows = [{"de": f"{split} {i} de", "en": f"{split} {i} en"} for i in range(count)]
        pyarrow.parquet.write_table(
            pyarrow.table({"translation": rows}), repo / "de-en" / f"{split}-00000-of-00001.parquet"
        )
    configs = "\n".join(f"  - split: {split}\n    path: de-en/{split}-*" for split in ("train", "validation", "test"))
    (repo / "README.md").write_text(f"---\nconfigs:\n- config_name: de-en\n  data_files:\n{configs}\n---\n")
    return repo


def test_a_hub_dataset_of_data_files_reads_only_the_splits_asked_for(tmp_path):
    """`load_dataset(split="test")` downloaded and converted every split first (datasets#6529), 4.5M training pairs
    to score newstest2014's 3,003."""
    repo = write_wmt14_like(tmp_path / "wmt14")
    cache = tmp_path / "cache"
    ds = load_parallel_dataset(
        source_lang="en", target_lang="de", dataset=str(repo), language_pair="de-en", splits=["test"], cache_dir=cache
    )
    assert list(ds) == ["test"] and pairs(ds["test"])[0] == ("test 0 en", "test 0 de")
    assert sorted(path.name for path in cache.rglob("*.arrow")) == ["wmt14-test.arrow"]


def test_a_local_dataset_folder_without_the_language_pair_asked_for_names_the_ones_it_has(tmp_path):
    """A folder is no Hub repo: its error is datasets' own, not a search of the caches for it (which ends in
    huggingface_hub's "Repo id must be in the form 'repo_name' or 'namespace/repo_name'")."""
    repo = write_wmt14_like(tmp_path / "wmt14")
    with pytest.raises(ValueError, match=re.escape("BuilderConfig 'fr-en' not found. Available: ['de-en']")):
        load_parallel_dataset(
            source_lang="en",
            target_lang="fr",
            dataset=str(repo),
            language_pair="fr-en",
            splits=["test"],
            cache_dir=tmp_path / "cache",
        )


def go_offline(monkeypatch) -> None:
    """HF_HUB_OFFLINE=1 as both libraries read it at import."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def read_test_split_online_then_offline(
    dataset: str, cache_dir: Path, monkeypatch, caplog, expected: list[tuple[str, str]]
) -> None:
    """The test split of the Hub dataset `dataset`, no language pair named, read online then offline: the same pairs
    (offline, as the earlier read left them in the datasets cache; warnings in `caplog`)."""
    for online in (True, False):
        if not online:
            go_offline(monkeypatch)
        with caplog.at_level(logging.WARNING, logger="modeling.data"):
            ds = load_parallel_dataset(
                source_lang="en", target_lang="de", dataset=dataset, splits=["test"], cache_dir=cache_dir
            )
        assert pairs(ds["test"]) == expected


@pytest.mark.parametrize("hub_state", ["HF_HUB_OFFLINE", "unreachable"])
def test_the_splits_a_hub_dataset_was_read_by_load_from_the_cache_where_the_hub_cannot_be_asked(
    hub_state, hub_here, quick_hub, tmp_path, monkeypatch, caplog
):
    """A compute node without internet scoring the test set a login node read: datasets looked for the cache under
    the configuration's name alone, where the splits read one by one are cached under the name and a hash of
    their files ("ValueError: Couldn't find cache for tester/wmt14 for config 'de-en'")."""
    endpoint, _ = hub_here
    repo_id = f"tester/wmt14-{hub_state.lower()}"  # one Hub serves the module
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    api.create_repo(repo_id, repo_type="dataset")
    api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=write_wmt14_like(tmp_path / "wmt14"))
    cache = tmp_path / "cache"

    def read(*splits: str, revision: str | None = None) -> datasets.DatasetDict:
        return load_parallel_dataset(
            source_lang="en",
            target_lang="de",
            dataset=repo_id,
            language_pair="de-en",
            splits=splits,
            cache_dir=cache,
            revision=revision,
        )

    first = pairs(read("test")["test"])
    first_commit = api.dataset_info(repo_id).sha
    revised = tmp_path / "revised.parquet"  # a later commit of the dataset: the node reads the latest copy
    pyarrow.parquet.write_table(pyarrow.table({"translation": [{"de": "neu", "en": "new"}]}), revised)
    api.upload_file(
        repo_id=repo_id, repo_type="dataset", path_or_fileobj=revised, path_in_repo="de-en/test-00000-of-00001.parquet"
    )
    online = {split: pairs(read(split)[split]) for split in ("test", "validation")}
    latest = api.dataset_info(repo_id).sha
    assert online["test"] == [("new", "neu")]
    killed = next(cache.rglob("dataset_info.json")).parent  # a read killed before datasets renamed its directory
    shutil.copytree(killed, killed.with_name(killed.name + ".incomplete"))
    info = killed.with_name(killed.name + ".incomplete") / "dataset_info.json"
    info.write_text(info.read_text().replace('"test"', '"train"').replace('"validation"', '"train"'))
    cut_short = killed.parents[2] / "de-en-0000000000000000" / "0.0.0" / killed.name / "dataset_info.json"
    cut_short.parent.mkdir(parents=True)
    cut_short.write_text('{"config_name": "de-')  # a copy whose record a lost disk cut short
    if hub_state == "HF_HUB_OFFLINE":
        go_offline(monkeypatch)
    else:
        monkeypatch.setattr(hf_http.time, "sleep", lambda seconds: None)  # huggingface_hub's pauses between retries
        with socket.socket() as closed:  # a port that refuses connections
            closed.bind(("127.0.0.1", 0))
            nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
        quick_hub(nowhere)
        monkeypatch.setattr(datasets.config, "HF_ENDPOINT", nowhere)
    with caplog.at_level(logging.WARNING, logger="modeling.data"):
        cached = read("test", "validation")
    assert {split: pairs(cached[split]) for split in cached} == online
    assert "split 'test' from the datasets cache" in caplog.text
    assert f"Not reading the cached copy {cut_short.parent}: " in caplog.text
    with pytest.raises(ValueError, match=rf"nor the Hub cache holds the split 'train' at {latest}: read it where the"):
        read("train")
    assert pairs(read("test", revision=first_commit)["test"]) == first  # the commit asked for, not the latest
    with pytest.raises(ValueError, match=rf"holding at .*{first_commit}: \['test'\].* holds the split 'test' at v1:"):
        read("test", revision="v1")  # a tag: only the Hub knows its commit


def test_a_hub_dataset_hf_download_put_in_the_hub_cache_loads_where_the_hub_cannot_be_asked(
    hub_here, tmp_path, monkeypatch, caplog
):
    """`hf download wmt/wmt14 --repo-type dataset`, as README says of models, then HF_HUB_OFFLINE=1: datasets reads
    only its own cache ("ConnectionError: Couldn't reach 'tester/downloaded' on the Hub (OfflineModeIsEnabled)")."""
    commit = push_translation_dataset(
        hub_here[0], "tester/downloaded", {"train": synthetic_pairs(5), "test": synthetic_pairs(3, seed=1)}
    )
    snapshot_download("tester/downloaded", repo_type="dataset", allow_patterns=["README.md", "de-en/*"])
    go_offline(monkeypatch)

    def read(split: str) -> datasets.DatasetDict:
        return load_parallel_dataset(
            source_lang="en",
            target_lang="de",
            dataset="tester/downloaded",
            language_pair="de-en",
            splits=[split],
            cache_dir=tmp_path / "datasets",
        )

    with caplog.at_level(logging.WARNING, logger="modeling.data"):
        assert pairs(read("test")["test"]) == synthetic_pairs(3, seed=1)
    assert f"read from the Hub cache, {tmp_path / 'cache'}" in caplog.text and commit in caplog.text
    assert pinned_dataset_commit("tester/downloaded", "de-en") == commit
    assert pairs(read("train")["train"]) == synthetic_pairs(5)
    with pytest.raises(
        ValueError, match=rf"\(holding nothing\) nor the Hub cache holds the split 'validation' at {commit}"
    ):
        read("validation")  # the dataset has none, and the datasets cache holds no copy of it


def test_a_hub_dataset_read_whole_or_split_by_split_is_read_at_the_revision_asked_for(hub_here, tmp_path):
    """Every split, at the commit asked for (the one a run recorded), not the latest."""
    first = push_translation_dataset(
        hub_here[0], "tester/revised", {"train": synthetic_pairs(4), "test": synthetic_pairs(2, seed=1)}
    )
    push_translation_dataset(
        hub_here[0], "tester/revised", {"train": synthetic_pairs(4, seed=2), "test": synthetic_pairs(2, seed=3)}
    )
    ds = load_parallel_dataset(
        source_lang="en",
        target_lang="de",
        dataset="tester/revised",
        language_pair="de-en",
        cache_dir=tmp_path / "datasets",
        revision=first,
    )
    assert pairs(ds["train"]) == synthetic_pairs(4) and pairs(ds["test"]) == synthetic_pairs(2, seed=1)
    # Written in the cache asked for, not in the user's datasets cache
    assert ds["train"].cache_files
    assert all(Path(file["filename"]).is_relative_to(tmp_path / "datasets") for file in ds["train"].cache_files)
    # Split by split too: the configuration's files are those of that commit, not of main's latest
    test = load_parallel_dataset(
        source_lang="en",
        target_lang="de",
        dataset="tester/revised",
        language_pair="de-en",
        splits=["test"],
        cache_dir=tmp_path / "split_by_split",
        revision=first,
    )
    assert pairs(test["test"]) == synthetic_pairs(2, seed=1)


def test_a_hub_dataset_that_neither_cache_holds_offline_raises_datasets_error(hub_here, tmp_path, monkeypatch):
    """Offline, splits asked for of a Hub dataset never read: datasets' "Couldn't reach" (it names offline mode), not
    an error about a dataset without splits."""
    go_offline(monkeypatch)
    with pytest.raises(ConnectionError, match="^Couldn't reach 'tester/never-read' on the Hub"):
        load_parallel_dataset(
            source_lang="en",
            target_lang="de",
            dataset="tester/never-read",
            language_pair="de-en",
            splits=["test"],
            cache_dir=tmp_path / "datasets",
        )


def test_a_hub_dataset_without_configurations_loads_from_the_datasets_cache_offline(
    hub_here, tmp_path, monkeypatch, caplog
):
    """A dataset of bare data files (its configuration is datasets' "default", no language pair named): the split
    read online is read from the datasets cache offline, and the warning names the configuration."""
    api = HfApi(endpoint=hub_here[0], token=HUB_TOKEN)
    api.create_repo("tester/plain", repo_type="dataset")
    for split, count in (("train", 5), ("test", 3)):
        table = pyarrow.table({"translation": [{"en": en, "de": de} for en, de in synthetic_pairs(count, seed=count)]})
        pyarrow.parquet.write_table(table, tmp_path / f"{split}.parquet")
        api.upload_file(
            repo_id="tester/plain",
            repo_type="dataset",
            path_or_fileobj=tmp_path / f"{split}.parquet",
            path_in_repo=f"data/{split}-00000-of-00001.parquet",
        )

    read_test_split_online_then_offline(
        "tester/plain", tmp_path / "datasets", monkeypatch, caplog, synthetic_pairs(3, seed=3)
    )
    assert "tester/plain (default): split 'test' from the datasets cache" in caplog.text


def test_offline_a_dataset_of_one_named_configuration_read_without_naming_it_loads_from_the_datasets_cache(
    hub_here, tmp_path, monkeypatch, caplog
):
    """No language pair named, as online, where datasets takes a dataset's only configuration ("de-en" here): the
    split read online is read from the datasets cache offline, as datasets' own cache takes the only configuration
    it holds (it looked under "default" alone: datasets' "Couldn't find cache ... Available configs")."""
    commit = push_translation_dataset(hub_here[0], "tester/unnamed", {"test": synthetic_pairs(3, seed=1)})

    read_test_split_online_then_offline(
        "tester/unnamed", tmp_path / "ds", monkeypatch, caplog, synthetic_pairs(3, seed=1)
    )
    assert "tester/unnamed (de-en): split 'test' from the datasets cache" in caplog.text
    assert pinned_dataset_commit("tester/unnamed", cache_dir=str(tmp_path / "ds")) == commit


def test_offline_a_dataset_read_whole_gives_the_splits_of_the_commit_asked_for(hub_here, tmp_path, monkeypatch):
    """Offline, datasets' own copies of a dataset read whole at two commits: the splits asked for are resolved among
    those of the commit asked for ("valid" at the first), not of the latest copy ("validation")."""
    first = push_translation_dataset(
        hub_here[0], "tester/renamed", {"train": synthetic_pairs(4), "valid": synthetic_pairs(2, seed=1)}
    )
    second = push_translation_dataset(
        hub_here[0], "tester/renamed", {"train": synthetic_pairs(4, seed=2), "validation": synthetic_pairs(2, seed=3)}
    )

    def read(revision: str, splits: list[str] | None = None) -> datasets.DatasetDict:
        return load_parallel_dataset(
            source_lang="en",
            target_lang="de",
            dataset="tester/renamed",
            language_pair="de-en",
            splits=splits,
            cache_dir=tmp_path / "datasets",
            revision=revision,
        )

    assert sorted(read(first)) == ["train", "valid"] and sorted(read(second)) == ["train", "validation"]
    go_offline(monkeypatch)
    ds = read(first, ["validation"])
    assert list(ds) == ["valid"] and pairs(ds["valid"]) == synthetic_pairs(2, seed=1)
    ds = read(second, ["validation"])
    assert list(ds) == ["validation"] and pairs(ds["validation"]) == synthetic_pairs(2, seed=3)


def write_cached_copy(root: Path, config_dir: str, commit: str, info: object, mtime: float) -> None:
    """A copy of a Hub dataset as datasets caches it: <root>/tester___corpus/<config dir>/0.0.0/<commit>/; `info`
    written as JSON, a string as it is (a record cut short)."""
    info_file = root / "tester___corpus" / config_dir / "0.0.0" / commit / "dataset_info.json"
    info_file.parent.mkdir(parents=True)
    info_file.write_text(info if isinstance(info, str) else json.dumps(info))
    os.utime(info_file, (mtime, mtime))


def test_offline_the_pinned_commit_is_the_latest_the_datasets_cache_holds_of_this_configuration(tmp_path, monkeypatch):
    """Offline, with no Hub cache, main's commit is the one of the configuration's latest copy in the datasets cache:
    not a later copy of a configuration whose name begins with it (its directory matches the same pattern), nor a
    record that is not datasets'; an unreadable copy before it is passed over, not the end of the search."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    root = tmp_path / "datasets"
    ours, older, other = "a" * 40, "b" * 40, "c" * 40
    write_cached_copy(root, "de-en", older, {"config_name": "de-en", "splits": {"test": {}}}, 1_000)
    write_cached_copy(root, "de-en-0123456789abcdef", ours, {"config_name": "de-en", "splits": {"test": {}}}, 2_000)
    write_cached_copy(root, "de-en-extended", other, {"config_name": "de-en-extended", "splits": {"test": {}}}, 3_000)
    write_cached_copy(root, "de-en-listed", other, ["not", "datasets'"], 4_000)
    write_cached_copy(root, "de-en-nameless", other, {"splits": {"test": {}}}, 4_500)  # a dict, not datasets' either
    write_cached_copy(root, "de-en-unsplit", "d" * 40, {"config_name": "de-en", "splits": None}, 500)  # holds none
    # older than ours, and neither read: a read killed before datasets renamed it, a record a lost disk cut short
    write_cached_copy(
        root, "de-en-1", f"{'e' * 40}.incomplete", {"config_name": "de-en", "splits": {"test": {}}}, 1_500
    )
    write_cached_copy(root, "de-en-2", "f" * 40, '{"config_name": "de-', 1_700)
    assert pinned_dataset_commit("tester/corpus", "de-en", cache_dir=str(root)) == ours
    assert pinned_dataset_commit("tester/corpus", "de-en-extended", cache_dir=str(root)) == other
    assert pinned_dataset_commit("tester/corpus", "fr-en", cache_dir=str(root)) is None  # nothing cached, no revision
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(root))  # no cache_dir: datasets' own
    assert pinned_dataset_commit("tester/corpus", "de-en") == ours


def test_offline_the_pinned_commit_is_the_one_of_the_latest_copy_written_not_the_last_by_name(tmp_path, monkeypatch):
    """Copies are taken oldest written first, so a commit's time is that of its latest copy: taken in the order of
    their directories' names, a commit read again today would count as old as its first copy, and an older one win."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    root = tmp_path / "datasets"
    again, between = "a" * 40, "b" * 40
    info = {"config_name": "de-en", "splits": {"test": {}}}
    write_cached_copy(root, "de-en-ffffffffffffffff", again, info, 1_000)  # last by name, first written
    write_cached_copy(root, "de-en-5555555555555555", between, info, 2_000)
    write_cached_copy(root, "de-en-0000000000000000", again, info, 3_000)  # first by name, read again last
    assert pinned_dataset_commit("tester/corpus", "de-en", cache_dir=str(root)) == again


def test_the_pinned_commit_is_the_revision_as_given_where_nothing_says_which_commit_it_is(tmp_path, monkeypatch):
    """Offline with neither cache knowing it, a tag or branch asked for is what a run records (and loads with), not
    None, nor the commit of a copy of main."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    root = tmp_path / "datasets"
    write_cached_copy(root, "de-en", "a" * 40, {"config_name": "de-en", "splits": {"test": {}}}, 1_000)
    assert pinned_dataset_commit("tester/corpus", "de-en", revision="v1", cache_dir=str(root)) == "v1"
    assert pinned_dataset_commit("tester/corpus", "fr-en", revision="v1", cache_dir=str(root)) == "v1"
    assert pinned_dataset_commit(str(tmp_path), "de-en", revision="v1", cache_dir=str(root)) is None  # a folder


def test_a_hub_dataset_read_split_by_split_keeps_its_configurations_options(tmp_path):
    """A TSV's separator, declared in the dataset's README, was dropped: one column 'en\\tde', refused."""
    (tmp_path / "train.tsv").write_text("en\tde\nthe cat, the dog\tdie katze, der hund\n")
    (tmp_path / "test.tsv").write_text("en\tde\nhello\thallo\n")
    files = "\n".join(f"  - split: {split}\n    path: {split}.tsv" for split in ("train", "test"))
    (tmp_path / "README.md").write_text(
        f'---\nconfigs:\n- config_name: de-en\n  sep: "\\t"\n  data_files:\n{files}\n---\n'
    )
    ds = load_parallel_dataset(
        source_lang="en",
        target_lang="de",
        dataset=str(tmp_path),
        language_pair="de-en",
        splits=["train"],
        cache_dir=tmp_path / "cache",
    )
    assert pairs(ds["train"]) == [("the cat, the dog", "die katze, der hund")]


def test_a_null_sentence_in_a_hub_dataset_is_refused_naming_the_split_and_row(tmp_path):
    one_column_each = hub_like(en=["a b", None, "c", None], de=["x", "y", "z", "w"])
    with pytest.raises(ValueError, match=r"^split 'train', row 1: the 'en' sentence is null \(in 2 of 4 rows\); drop"):
        normalize_translation_dataset(one_column_each, "en", "de")
    pair_missing = hub_like(translation=[{"de": "a", "en": "b"}, None])
    with pytest.raises(ValueError, match=r"^split 'train', row 1: the 'de' sentence is null \(in 1 of 2 rows\)"):
        normalize_translation_dataset(pair_missing, "de", "en")
    among_three_languages = hub_like(translation=[{"de": "a", "en": "b", "fr": "c"}, None])
    with pytest.raises(ValueError, match=r"^split 'train', row 1: the 'en' sentence is null"):
        normalize_translation_dataset(among_three_languages, "en", "de")
    # Through the Hub code path (`datasets.load_dataset` reads a local folder of JSONL splits): the dataset named.
    rows = [json.dumps({"translation": {"de": d, "en": e}}) for e, d in zip(EN, DE, strict=True)]
    write_lines(tmp_path / "train.jsonl", [*rows, json.dumps({"translation": {"de": None, "en": "x"}})])
    with pytest.raises(ValueError, match=rf"^{tmp_path}: split 'train', row 4: the 'de' sentence is null"):
        load_parallel_dataset(source_lang="en", target_lang="de", dataset=str(tmp_path), cache_dir=str(tmp_path / "c"))


def test_unknown_language_in_hub_dataset():
    with pytest.raises(ValueError, match=r"split 'train' has languages \['de', 'en'\], not \['fr'\]"):
        normalize_translation_dataset(hub_like(translation=[{"de": "a", "en": "b"}]), "en", "fr")
    with pytest.raises(ValueError, match="needs a 'translation' column"):
        normalize_translation_dataset(hub_like(text=["a"]), "en", "de")
    with pytest.raises(ValueError, match="^the dataset has no splits$"):
        normalize_translation_dataset(datasets.DatasetDict(), "en", "de")


def test_an_empty_split_is_refused_naming_where_it_comes_from(tmp_path):
    write_lines(tmp_path / "val.en", [])
    write_lines(tmp_path / "val.de", [])
    empty = load(tmp_path)["val"]
    wmt_schema = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})
    assert empty.features == wmt_schema  # as every split's, empty or not: no column typed null
    assert str(empty.split) == "val"  # named as a split with pairs is
    where = split_source("validation", source_lang="en", target_lang="de", data_dir=tmp_path)
    assert where == f"{tmp_path / 'val.en'} + {tmp_path / 'val.de'}"
    with pytest.raises(ValueError, match=rf"^split 'val' is empty: {re.escape(where)} hold\(s\) no sentence pairs$"):
        require_rows(empty, "val", where)
    train = tiny_corpus()["train"]
    assert require_rows(train, "train", where) is train
    # A split whose files cannot be told (none, or incomplete): the directory is named.
    assert split_source("test", source_lang="en", target_lang="de", data_dir=tmp_path) == f"{tmp_path} (split 'test')"
    hub = {"source_lang": "en", "target_lang": "de", "dataset": "wmt/wmt14"}
    assert split_source("test", **hub, language_pair="de-en") == "wmt/wmt14 (de-en), split 'test'"
    assert split_source("test", **hub) == "wmt/wmt14, split 'test'"


def test_only_datasets_refusal_of_an_empty_corpus_gives_an_empty_split(tmp_path, monkeypatch):
    """Any other ValueError of datasets' is its own: taken for empty files, a corpus would load as no pairs."""
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", DE)

    def failing(*args, **kwargs):
        raise ValueError("some other failure")

    monkeypatch.setattr(datasets.Dataset, "from_generator", failing)
    with pytest.raises(ValueError, match="^some other failure$"):
        load(tmp_path)


def test_the_default_cleaning_is_fairseqs_up_to_250_words_and_a_ratio_of_1_5():
    rows = [("w " * 250, "v " * 250), ("w " * 251, "v " * 251), ("a b", "c d e"), ("a b", "c d e f g")]
    ds = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"translation": [{"en": e, "de": d} for e, d in rows]})}
    )
    assert clean_parallel_dataset(ds, "en", "de")[1]["train"] == {
        "total": 4,
        "empty": 0,
        "too_long": 1,
        "ratio": 1,
        "kept": 2,
    }


def test_each_cleaning_rule_is_counted_and_logged(caplog):
    rows = [
        ("a man runs .", "ein mann läuft ."),  # kept
        ("", "leer ."),  # empty
        ("  ", "leer ."),  # blank counts as empty
        ("\u200b \ufeff\u00ad", "leer ."),  # so do characters that show nothing (zero-width space, BOM, soft hyphen)
        ("one \u200b", "eins zwei"),  # 1 word shown against 2: ratio 2 > 1.5
        ("word " * 11, "wort " * 11),  # too long (max_length=10)
        ("one two", "eins zwei drei vier"),  # ratio 2 > 1.5
        ("a b", "c d e"),  # ratio exactly 1.5: kept
    ]
    translation = [{"en": e, "de": d} for e, d in rows]
    ds = datasets.DatasetDict(
        {split: datasets.Dataset.from_dict({"translation": translation}) for split in ("train", "test")}
    )
    with caplog.at_level(logging.INFO, logger="modeling.data"):
        cleaned, counts = clean_parallel_dataset(ds, "en", "de", max_length=10)
    assert counts == {"train": {"total": 8, "empty": 3, "too_long": 1, "ratio": 2, "kept": 2}}
    assert pairs(cleaned["train"]) == [rows[0], rows[7]]
    assert len(cleaned["test"]) == 8  # test sentences are never dropped by default
    assert "removed 3 empty, 1 longer than 10 words, 2 with length ratio > 1.5" in caplog.text

    _, counts = clean_parallel_dataset(ds, "en", "de", max_length=None, max_ratio=None, splits=["train", "test"])
    assert counts["test"] == {"total": 8, "empty": 3, "too_long": 0, "ratio": 0, "kept": 5}


@pytest.mark.parametrize(
    ("language", "target"),
    [
        ("zh", "小狗看见一个红球，很高兴。"),
        ("ja", "小さい犬は赤いボールを見る。"),
        ("th", "สุนัขตัวเล็กเห็นลูกบอลสีแดง"),
        ("zh", "我用 iPhone 拍了照片。"),  # a Latin word inside: three "words"
    ],
)
def test_the_length_ratio_rule_keeps_pairs_with_a_side_written_without_spaces_between_words(language, target, caplog):
    """Such a sentence is one "word" (or a few) however long: the rule removed nearly every pair of an
    English-Chinese corpus, the short sentences alone left to train on, with no more than an INFO line."""
    rows = [
        ("The small dog sees a red ball and is happy.", target),
        ("Hello!", "你好！"),
        ("one two", "eins zwei drei vier"),  # still removed: ratio 2 > 1.5 between spaced languages
        ("word " * 11, target),  # still removed: too long (max_length=10)
    ]
    translation = [{"en": e, language: t} for e, t in rows]
    ds = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": translation})})
    with caplog.at_level(logging.INFO, logger="modeling.data"):
        cleaned, counts = clean_parallel_dataset(ds, "en", language, max_length=10)
    assert counts == {"train": {"total": 4, "empty": 0, "too_long": 1, "ratio": 1, "kept": 2}}
    assert [pair["en"] for pair in cleaned["train"]["translation"]] == [rows[0][0], "Hello!"]
    assert "1 with length ratio > 1.5 (1 past it kept: a side is written without spaces between words)" in caplog.text


@pytest.fixture(scope="module")
def tokenizer():
    return train_shared_bpe((s for pair in zip(EN * 5, DE * 5, strict=True) for s in pair), vocab_size=120)


def tiny_corpus() -> datasets.DatasetDict:
    rows = [{"en": e, "de": d} for e, d in zip(EN, DE, strict=True)]
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": rows})})


def test_the_tokenisation_is_cached_by_content_not_by_where_the_tokenizer_came_from(
    tmp_path, datasets_cache, tokenizer
):
    """The process that trained the BPE holds it in memory, the others and every requeue load it from the run's
    directory: datasets' own key told them apart, and each tokenised the whole corpus again (for English-German
    WMT, 10 minutes and 2.3 GB of cache a time)."""
    text = load_parallel_dataset(
        source_lang="en", target_lang="de", data_dir=write_corpus(tmp_path, 20, word_for_word)
    )
    for directory in ("a", "b"):
        tokenizer.save_pretrained(tmp_path / directory)
    loaded = [AutoTokenizer.from_pretrained(tmp_path / directory) for directory in ("a", "b")]
    tokenised = [tokenize_parallel_dataset(text, each, "en", "de")["train"] for each in (tokenizer, *loaded)]
    cached = [each.cache_files for each in tokenised]
    assert cached[0] and cached[0] == cached[1] == cached[2]
    assert tokenize_parallel_dataset(text, tokenizer, "en", "de", max_length=3)["train"].cache_files != cached[0]
    # Other code (a fix to the encoding, another transformers): datasets hashes a function by its name alone.
    with mock.patch.object(data_module, "_code_version", lambda: "other code"):
        assert tokenize_parallel_dataset(text, tokenizer, "en", "de")["train"].cache_files != cached[0]
        assert load_parallel_dataset(source_lang="en", target_lang="de", data_dir=tmp_path)["train"].cache_files != (
            text["train"].cache_files
        )
    # Stored as small as they hold (labels took 64 bits: English-French WMT's tokenised copy was 19 GB).
    widths = {name: feature.feature.dtype for name, feature in tokenised[0].features.items()}
    assert widths == {"input_ids": "int32", "attention_mask": "int8", "labels": "int32"}


def test_the_tokenisation_cache_tells_apart_tokenizers_that_split_special_tokens_or_not(
    tmp_path, datasets_cache, tokenizer
):
    """Whether "</s>" written in a sentence is the end-of-sentence token or text is no part of the backend's rules
    (`backend_tokenizer.to_str()`): a tokenizer that keeps it whole must not be served the other's cached ids."""
    write_lines(tmp_path / "train.en", ["a man </s> runs ."])
    write_lines(tmp_path / "train.de", ["ein mann läuft ."])
    text = load_parallel_dataset(source_lang="en", target_lang="de", data_dir=tmp_path)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    whole = AutoTokenizer.from_pretrained(tmp_path / "tokenizer", split_special_tokens=False)
    assert whole.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    [split_ids], [whole_ids] = (
        tokenize_parallel_dataset(text, each, "en", "de")["train"]["input_ids"] for each in (tokenizer, whole)
    )
    assert whole_ids == whole("a man </s> runs .")["input_ids"] != split_ids
    assert whole_ids.count(whole.eos_token_id) == 2 and split_ids.count(tokenizer.eos_token_id) == 1


def test_the_cache_keys_follow_the_code_that_reads_and_encodes(tmp_path, monkeypatch):
    """datasets hashes a function by its name alone: a fix to reading or encoding must give other keys, or the
    cache serves what the old code made."""
    edited = tmp_path / "data.py"
    edited.write_text(Path(data_module.__file__).read_text(encoding="utf-8") + "# a fix\n", encoding="utf-8")
    data_module._code_version.cache_clear()
    this_code = data_module._code_version()
    monkeypatch.setattr(data_module, "__file__", str(edited))
    data_module._code_version.cache_clear()
    try:
        assert data_module._code_version() != this_code
    finally:
        data_module._code_version.cache_clear()


def test_large_splits_are_tokenised_by_a_process_per_core_with_the_same_result(
    tmp_path, datasets_cache, tokenizer, monkeypatch
):
    cores = len(os.sched_getaffinity(0))
    assert tokenisation_workers(2 * PAIRS_PER_TOKENISATION_WORKER - 1) is None
    assert tokenisation_workers(10**9) == (cores if cores > 1 else None)
    if cores > 1:  # a job given some of the machine's cores (taskset, a Slurm allocation): those alone
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, sorted(allowed)[:1])
        try:
            assert tokenisation_workers(10**9) is None
        finally:
            os.sched_setaffinity(0, allowed)
    with monkeypatch.context() as no_affinity:  # macOS: no sched_getaffinity, the machine's count
        no_affinity.delattr(os, "sched_getaffinity")
        no_affinity.setattr(os, "cpu_count", lambda: 4)
        assert tokenisation_workers(10**9) == 4
        no_affinity.setattr(os, "cpu_count", lambda: None)  # unknown: one
        assert tokenisation_workers(10**9) is None
    text = load_parallel_dataset(
        source_lang="en", target_lang="de", data_dir=write_corpus(tmp_path, 40, word_for_word)
    )
    two, one = (tokenize_parallel_dataset(text, tokenizer, "en", "de", num_proc=n)["train"] for n in (2, 1))
    assert one.to_dict() == two.to_dict()
    assert len(two.cache_files) == 2  # the processes asked for, each writing its shard, however small the split


def test_tokenized_columns_work_with_seq2seq_collator(tokenizer):
    encoded = tokenize_parallel_dataset(tiny_corpus(), tokenizer, "en", "de")["train"]
    assert encoded.column_names == ["input_ids", "attention_mask", "labels"]
    assert encoded["attention_mask"] == [[1] * len(ids) for ids in encoded["input_ids"]]
    assert encoded[0]["input_ids"] == tokenizer(EN[0])["input_ids"]
    assert encoded[0]["labels"][-1] == tokenizer.eos_token_id
    batch = DataCollatorForSeq2Seq(tokenizer)([encoded[i] for i in range(4)])
    assert batch["input_ids"].shape == batch["attention_mask"].shape
    assert (batch["labels"] == -100).any() and (batch["input_ids"] == tokenizer.pad_token_id).any()
    source, target = sequence_lengths(encoded)
    assert source.tolist() == [len(ids) for ids in encoded["input_ids"]]
    assert target.tolist() == [len(ids) for ids in encoded["labels"]]


def test_truncation_keeps_eos_and_is_counted(tokenizer, caplog):
    with caplog.at_level(logging.WARNING, logger="modeling.data"):
        encoded = tokenize_parallel_dataset(tiny_corpus(), tokenizer, "en", "de", max_length=4)["train"]
    source, target = sequence_lengths(encoded)
    assert source.max() <= 4 and target.max() <= 4
    assert all(ids[-1] == tokenizer.eos_token_id for ids in [*encoded["input_ids"], *encoded["labels"]])
    full = tokenize_parallel_dataset(tiny_corpus(), tokenizer, "en", "de")["train"]
    over = sum(int(n > 4) for side in sequence_lengths(full) for n in side)
    assert over > 0 and f"truncated {over} sequences to max_length=4" in caplog.text
    long = next(i for i, ids in enumerate(full["input_ids"]) if len(ids) > 4)
    assert encoded[long]["input_ids"] == full[long]["input_ids"][:3] + [tokenizer.eos_token_id]


def test_only_the_side_longer_than_max_length_is_truncated(tokenizer):
    rows = [{"en": EN[1], "de": "ein mann"}, {"en": "a man", "de": DE[1]}]  # the short sides: max_length exactly
    max_length = len(tokenizer("ein mann")["input_ids"])
    assert max_length == len(tokenizer("a man")["input_ids"]) < len(tokenizer(DE[1])["input_ids"])
    corpus = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": rows})})
    encoded, truncations = tokenize_counting_truncations(corpus, tokenizer, "en", "de", max_length=max_length)
    assert truncations == {"train": 2}
    cut = max_length - 1
    assert encoded["train"]["input_ids"] == [
        tokenizer(EN[1])["input_ids"][:cut] + [tokenizer.eos_token_id],
        tokenizer("a man")["input_ids"],
    ]
    assert encoded["train"]["labels"] == [
        tokenizer("ein mann")["input_ids"],
        tokenizer(DE[1])["input_ids"][:cut] + [tokenizer.eos_token_id],
    ]


def test_an_empty_split_is_tokenised_empty_with_no_truncations(tokenizer):
    """An empty split (say a blind test set) is tokenised to one with the tokenised columns, and 0 truncations (pyarrow
    sums no values to null). Before: datasets' KeyError "Column truncated not in the dataset"."""
    empty = datasets.Dataset.from_dict({"translation": []}, features=data_module._translation_features("en", "de"))
    corpus = datasets.DatasetDict({"train": tiny_corpus()["train"], "test": empty})
    encoded, truncations = tokenize_counting_truncations(corpus, tokenizer, "en", "de", max_length=4)
    assert len(encoded["test"]) == 0 and truncations["test"] == 0 and truncations["train"] > 0
    assert encoded["test"].column_names == encoded["train"].column_names == ["input_ids", "attention_mask", "labels"]
    assert encoded["test"].features == encoded["train"].features  # typed as every split, not as nulls


@pytest.mark.parametrize("max_length", [1, 0, -3])
def test_a_max_length_without_room_for_a_token_and_eos_is_refused(tokenizer, max_length):
    # 0 kept whole sequences while logging them as truncated; a negative value dropped tokens from their middle.
    with pytest.raises(ValueError, match=rf"^max_length must be at least 2 .*, got {max_length}$"):
        tokenize_parallel_dataset(tiny_corpus(), tokenizer, "en", "de", max_length=max_length)


def test_the_smallest_max_length_keeps_one_token_and_eos(tokenizer):
    encoded = tokenize_parallel_dataset(tiny_corpus(), tokenizer, "en", "de", max_length=2)["train"]
    full = tokenize_parallel_dataset(tiny_corpus(), tokenizer, "en", "de")["train"]
    assert encoded["input_ids"] == [[ids[0], tokenizer.eos_token_id] for ids in full["input_ids"]]


@pytest.mark.parametrize(("option", "value"), [("max_length", 0), ("max_length", -1), ("max_ratio", 0.9)])
def test_cleaning_limits_that_would_reject_every_pair_are_refused(option, value):
    with pytest.raises(ValueError, match=rf"^{option} must be at least 1 .*, got {value}$"):
        clean_parallel_dataset(tiny_corpus(), "en", "de", **{option: value})


def test_the_tightest_cleaning_limits_keep_pairs_of_one_word_each():
    rows = [{"en": "dog", "de": "hund"}, {"en": "a dog", "de": "ein hund"}, {"en": "dog", "de": "der hund"}]
    corpus = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": rows})})
    counts = clean_parallel_dataset(corpus, "en", "de", max_length=1, max_ratio=1)[1]["train"]
    assert counts == {"total": 3, "empty": 0, "too_long": 2, "ratio": 0, "kept": 1}
    assert clean_parallel_dataset(corpus, "en", "de", max_length=None, max_ratio=1)[1]["train"]["ratio"] == 1


def test_cleaning_caches_the_rejection_codes_alone_not_a_second_copy_of_the_corpus(tmp_path):
    """The cleaning's cache file holds one small column per pair: with the text beside it, WMT's 4.5M pairs would be
    written to the cache a second time."""
    write_lines(tmp_path / "train.en", EN)
    write_lines(tmp_path / "train.de", DE)
    ds = load(tmp_path)
    before = set((tmp_path / ".cache").rglob("*.arrow"))
    clean_parallel_dataset(ds, "en", "de")
    written = set((tmp_path / ".cache").rglob("*.arrow")) - before
    assert written and [datasets.Dataset.from_file(str(path)).column_names for path in written] == [["reject"]]


def test_cleaning_an_empty_split_leaves_it_empty_for_its_user_to_refuse():
    """An empty split (empty files) is refused naming its files (`require_rows`), not as a cleaning that removed
    every pair."""
    empty = datasets.Dataset.from_dict({"translation": []}, features=data_module._translation_features("en", "de"))
    cleaned, counts = clean_parallel_dataset(datasets.DatasetDict({"train": empty}), "en", "de")
    assert len(cleaned["train"]) == 0
    assert counts == {"train": {"total": 0, "empty": 0, "too_long": 0, "ratio": 0, "kept": 0}}


def test_sampler_drives_a_dataloader(tokenizer):
    corpus = datasets.DatasetDict({"train": datasets.concatenate_datasets([tiny_corpus()["train"]] * 10)})
    encoded = tokenize_parallel_dataset(corpus, tokenizer, "en", "de")["train"]
    sampler = TokenBudgetBatchSampler(*sequence_lengths(encoded), max_tokens=64)
    loader = DataLoader(encoded, batch_sampler=sampler, collate_fn=DataCollatorForSeq2Seq(tokenizer))
    batches = list(loader)
    assert len(batches) == len(sampler)
    assert sum(len(b["input_ids"]) for b in batches) == 40
    assert all(b["input_ids"].numel() <= 64 and b["labels"].numel() <= 64 for b in batches)
    assert all(isinstance(b["labels"], torch.Tensor) for b in batches)


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="shared Multi30k data not present")
def test_multi30k_splits(tmp_path):
    ds = load_parallel_dataset(source_lang="en", target_lang="de", data_dir=MULTI30K, cache_dir=str(tmp_path))
    assert {split: len(part) for split, part in ds.items()} == {
        "train": 29000,
        "val": 1014,
        "test_2016_flickr": 1000,
    }
    assert resolve_split(ds, "test") == "test_2016_flickr"
    assert all(row["en"] and row["de"] for row in ds["val"]["translation"])


def test_cleaning_of_a_cached_dataset_follows_the_code_that_cleans_it(tmp_path, monkeypatch):
    """A Hub dataset's cache key says nothing of this code, and datasets hashes `_rejection_codes` by its name alone:
    an English-Chinese corpus whose pairs an older release removed by their length ratio was cleaned from the cache
    again after the update, the pairs removed as before (as they would be after any change to the rules)."""
    translation = [
        {"en": "Hello!", "zh": "你好！"},
        {"en": "The small dog sees a red ball and is happy.", "zh": "小狗看见一个红球，很高兴。"},
    ]
    datasets.Dataset.from_dict({"translation": translation}).save_to_disk(tmp_path / "saved")
    ds = datasets.DatasetDict({"train": datasets.load_from_disk(tmp_path / "saved")})  # cached, as a Hub dataset is
    with monkeypatch.context() as older_release:
        older_release.setattr(data_module, "_code_version", lambda: "older release")
        older_release.setattr(data_module, "_UNSEGMENTED_SCRIPT", re.compile("(?!)"))  # the rule before the fix
        assert clean_parallel_dataset(ds, "en", "zh")[1]["train"]["kept"] == 1
    monkeypatch.setattr(data_module, "_code_version", lambda: "this release")
    assert clean_parallel_dataset(ds, "en", "zh")[1]["train"]["kept"] == 2
