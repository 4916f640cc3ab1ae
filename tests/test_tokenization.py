"""Tests of modeling/tokenization.py: the shared BPE and the line readers."""

import gzip
import io
import json
import logging
import sys
import unicodedata

import datasets
import pytest
from helpers import MULTI30K
from transformers import AutoTokenizer

from modeling.tokenization import _round_up, iter_corpus_text, iter_lines, iter_text_files, train_shared_bpe


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_shared_bpe(iter(corpus), vocab_size=100)


def test_special_tokens_and_ids(tokenizer):
    assert (tokenizer.pad_token, tokenizer.unk_token, tokenizer.eos_token) == ("<pad>", "<unk>", "</s>")
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.model_max_length == 1024


def test_source_and_target_end_with_eos(tokenizer):
    batch = tokenizer(["the man runs .", "a dog"], text_target=["der mann läuft .", "ein hund"])
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    for ids in batch["input_ids"] + batch["labels"]:
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.eos_token_id not in ids[:-1]
    assert [len(m) for m in batch["attention_mask"]] == [len(ids) for ids in batch["input_ids"]]


@pytest.mark.parametrize(
    "text",
    [
        "the man runs in the park .",
        "der hund läuft  im   park!",  # repeated spaces survive
        "ein rotem ball ,",
        "the ﬁ ball",  # NFKC: the ligature decodes as "fi"
    ],
)
def test_decode_encode_round_trip_is_nfkc(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == unicodedata.normalize("NFKC", text)


def test_leading_space_is_the_one_loss(tokenizer):
    # Metaspace reads a leading space as the word-boundary mark it would have prepended anyway.
    assert tokenizer.decode(tokenizer(" the dog")["input_ids"], skip_special_tokens=True) == "the dog"


def test_unseen_character_is_unk(tokenizer):
    assert tokenizer.unk_token_id in tokenizer("the ☃")["input_ids"]


def test_vocab_size_is_rounded_up_to_multiple_of_8(corpus):
    tokenizer = train_shared_bpe(iter(corpus), vocab_size=101)
    assert len(tokenizer) == 104


def test_small_corpus_is_padded_with_unreachable_fillers(corpus):
    tokenizer = train_shared_bpe(iter(corpus), vocab_size=5000)  # far more than this corpus can merge
    assert len(tokenizer) % 8 == 0
    vocab = tokenizer.get_vocab()
    fillers = {i for token, i in vocab.items() if token.startswith("<unused")}
    assert fillers and max(fillers) == len(tokenizer) - 1
    encoded = {i for ids in tokenizer(corpus)["input_ids"] for i in ids}
    assert not encoded & fillers


def test_trains_from_a_one_shot_generator(corpus):
    tokenizer = train_shared_bpe((s for s in corpus), vocab_size=64)
    assert len(tokenizer) == 64


def test_rejects_vocab_without_room_for_specials(corpus):
    with pytest.raises(ValueError, match="vocab_size"):
        train_shared_bpe(iter(corpus), vocab_size=3)


@pytest.mark.parametrize("texts", [[], ["", "  ", "\t"]], ids=["nothing", "blank lines"])
def test_refuses_to_train_on_no_text(texts):
    with pytest.raises(ValueError, match=r"^no text to train the BPE on: train\.en, train\.de hold\(s\) no line"):
        train_shared_bpe(iter(texts), vocab_size=16, source="train.en, train.de")
    with pytest.raises(ValueError, match=r"^no text to train the BPE on: the input hold\(s\) no line"):
        train_shared_bpe(iter(texts), vocab_size=16)


def test_a_vocabulary_larger_than_asked_is_explained(corpus, caplog):
    """BPE keeps every character of the corpus: below their count, `vocab_size` cannot be met."""
    characters = len(set("".join(corpus)))
    with caplog.at_level(logging.WARNING, logger="modeling.tokenization"):
        tokenizer = train_shared_bpe(iter(corpus), vocab_size=4)
    assert len(tokenizer) == _round_up(characters + 3, 8) > 8
    assert f"{len(tokenizer)} entries, more than vocab_size=4" in caplog.text
    assert f"{characters} distinct characters" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="modeling.tokenization"):
        train_shared_bpe(iter(corpus), vocab_size=101)
    assert caplog.text == ""


def test_save_and_load_through_auto_tokenizer(tokenizer, corpus, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "TokenizersBackend"  # a built-in class: no remote code needed
    assert "auto_map" not in config
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(corpus[:50])["input_ids"] == tokenizer(corpus[:50])["input_ids"]
    assert loaded(corpus[:5], text_target=corpus[5:10])["labels"] == tokenizer(corpus[5:10])["input_ids"]
    assert (loaded.pad_token_id, loaded.unk_token_id, loaded.eos_token_id) == (0, 1, 2)
    assert len(loaded) == len(tokenizer) and loaded.model_max_length == 1024
    text = "der  hund läuft ."
    assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text


def test_iter_lines_plain_and_gzip(tmp_path):
    plain, packed = tmp_path / "a.txt", tmp_path / "b.txt.gz"
    plain.write_bytes(b"one\r\ntwo\rstill two\n\nfour")  # only \n ends a line
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write("über\nfünf\n")
    assert list(iter_lines(plain)) == ["one", "two\rstill two", "", "four"]
    assert list(iter_text_files([plain, packed])) == ["one", "two\rstill two", "", "four", "über", "fünf"]


def test_iter_lines_names_unreadable_file(tmp_path):
    broken = tmp_path / "broken.en.gz"
    broken.write_bytes(gzip.compress(b"fine\n" * 100)[:-20])
    with pytest.raises(ValueError, match="broken.en.gz"):
        list(iter_lines(broken))
    latin1 = tmp_path / "latin1.de"
    latin1.write_bytes("grün\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.de:1: not valid UTF-8"):
        list(iter_lines(latin1))


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_an_invalid_utf8_byte_is_located_on_its_exact_line(tmp_path, suffix):
    """Text-mode reading decodes ahead in blocks: line by line from bytes names the very line, gzip too."""
    lines = [f"line {i} ist grün".encode() for i in range(1, 5000)]
    lines[4321] = "line 4322 ist grün".encode("latin-1")
    path = tmp_path / f"train.de{suffix}"
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(data) if suffix else data)
    with pytest.raises(ValueError, match=rf"train\.de{suffix}:4322: not valid UTF-8") as error:
        list(iter_lines(path))
    assert "iconv" in str(error.value)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_byte_order_mark_is_dropped_at_the_start_of_the_file_only(tmp_path, suffix):
    # Windows editors write one: kept, it would open the first reference (lower BLEU) or join the vocabulary.
    path = tmp_path / f"refs.de{suffix}"
    data = b"\xef\xbb\xbfeins\nzwei \xef\xbb\xbf drei\n\xef\xbb\xbfvier\n"
    path.write_bytes(gzip.compress(data) if suffix else data)
    assert list(iter_lines(path)) == ["eins", "zwei \ufeff drei", "\ufeffvier"]  # later ones are text


def test_a_byte_order_mark_is_dropped_from_standard_input(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbfone\ntwo\n"), encoding="utf-8"))
    assert list(iter_lines("-")) == ["one", "two"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_utf16_text_is_named_as_such(tmp_path, encoding):
    path = tmp_path / "train.en"
    path.write_bytes(("\ufeff" if encoding.endswith("be") else "").encode(encoding) + "a cat\n".encode(encoding))
    with pytest.raises(ValueError, match=r"^.*train\.en is UTF-16 text: convert it to UTF-8 \(e\.g\. iconv -f utf-16"):
        list(iter_lines(path))


def test_gzip_data_without_the_gz_suffix_is_read_as_gzip(tmp_path, monkeypatch):
    # Its first bytes, 1f 8b, cannot start UTF-8 text, so reading it as gzip cannot misread a text file.
    path = tmp_path / "train.txt"
    path.write_bytes(gzip.compress("\ufeffüber\nfünf\n".encode()))
    assert list(iter_lines(path)) == ["über", "fünf"]
    assert list(iter_text_files([path, path])) == ["über", "fünf"] * 2
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(b"one\ntwo\n")), encoding="utf-8"))
    assert list(iter_lines("-")) == ["one", "two"]
    path.write_bytes(gzip.compress(b"fine\n" * 100)[:-20])  # truncated: named as gzip, not as Latin-1
    with pytest.raises(ValueError, match=r"^cannot read .*train\.txt after \d+ lines"):
        list(iter_lines(path))


def test_one_byte_and_empty_files_are_not_mistaken_for_gzip(tmp_path):
    (tmp_path / "one").write_bytes(b"\x1f")
    (tmp_path / "empty").write_bytes(b"")
    assert list(iter_lines(tmp_path / "one")) == ["\x1f"]
    assert list(iter_lines(tmp_path / "empty")) == []


def test_iter_corpus_text_streams_both_sides():
    ds = datasets.Dataset.from_dict({"translation": [{"en": f"e{i}", "de": f"d{i}"} for i in range(5)]})
    assert list(iter_corpus_text(ds, ["en", "de"], batch_size=2)) == [s for i in range(5) for s in (f"e{i}", f"d{i}")]


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="shared Multi30k data not present")
def test_multi30k_val_round_trip_is_exact():
    tokenizer = train_shared_bpe(
        iter_text_files([MULTI30K / "train.en.gz", MULTI30K / "train.de.gz"]), vocab_size=8000
    )
    assert len(tokenizer) == 8000
    val = list(iter_text_files([MULTI30K / "val.en.gz", MULTI30K / "val.de.gz"]))
    decoded = tokenizer.batch_decode(tokenizer(val)["input_ids"], skip_special_tokens=True)
    failures = [s for s, d in zip(val, decoded, strict=True) if d != unicodedata.normalize("NFKC", s)]
    assert failures == []


def test_iter_lines_reads_standard_input_as_it_reads_files(monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO(b"one\r\ntwo\rstill two\n\nvier"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert list(iter_lines("-")) == ["one", "two\rstill two", "", "vier"]
    assert not stdin.closed, "standard input stays open for whoever reads it next"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("grün\n".encode("latin-1")), encoding="utf-8"))
    with pytest.raises(ValueError, match=r"^<stdin>:1: not valid UTF-8"):
        list(iter_lines("-"))
