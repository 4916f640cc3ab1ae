"""Tests of modeling/tokenization.py: the shared BPE and the corpus readers that feed it."""

import gzip
import json
import logging
import os
import signal
import threading
import unicodedata

import datasets
import pytest
from helpers import MULTI30K
from transformers import AutoTokenizer

from modeling.callbacks import PreemptionCallback, SignalledBeforeTraining
from modeling.tokenization import (
    check_tokenizer_destination,
    is_blank,
    iter_corpus_text,
    iter_text_files,
    missing_tokenizer_files,
    round_up,
    train_shared_bpe,
    visible_words,
)


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


# Made-up sentences in scripts beyond the European ones: no spaces between words, right to left with direction
# marks, combining marks, joiners, emoji sequences.
WORLD_SENTENCES = [
    "小狗看见一个红球。",  # Chinese
    "女は赤いボールを食べる。",  # Japanese
    "한국어 문장입니다.",  # Korean
    "ผู้หญิงดื่มน้ำและทำอาหาร",  # Thai: combining marks, SARA AM (น้ำ, ทำ)
    "ຂ້ອຍກິນນ້ຳ",  # Lao: SARA AM
    "ໝາໜຶ່ງໂຕ",  # Lao: HO MO and HO NO (ໝາ "dog", ໜຶ່ງ "one")
    "\u200fمرحبا بكم\u200f",  # Arabic between right-to-left marks
    "שָׁלוֹם עוֹלָם",  # Hebrew with niqqud
    "می\u200cخواهم",  # Persian: a zero-width non-joiner inside the word
    "नमस्ते दुनिया, क्\u200dष",  # Hindi: virama, a zero-width joiner
    "Привет, мир!",  # Russian
    "👨\u200d👩\u200d👧 family 🎉",  # an emoji sequence joined by zero-width joiners
]


def test_scripts_without_spaces_right_to_left_and_with_joiners_decode_as_they_were_written():
    """NFKC split Thai and Lao SARA AM into NIKHAHIT + SARA AA: every "น้ำ" (water) the model wrote came out as
    "น้ํา", which no reference nor reader spells so; and Lao HO NO and HO MO into HO SUNG + NO / MO ("ໜຶ່ງ", one, as
    "ຫນຶ່ງ"). Nothing else here is changed, joiners and marks included."""
    tokenizer = train_shared_bpe(WORLD_SENTENCES * 3, vocab_size=200)
    for text in WORLD_SENTENCES:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    decomposed = "น\u0e49\u0e4d\u0e32"  # typed as NIKHAHIT + SARA AA, as NFKC made it: the same word
    assert tokenizer.decode(tokenizer(decomposed)["input_ids"], skip_special_tokens=True) == "น้ำ"


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
    one_short = train_shared_bpe(["abc"], vocab_size=64)  # 3 special tokens, 4 characters, no pair seen twice
    assert len(one_short) == 8 and one_short.convert_ids_to_tokens(7) == "<unused0>"


def test_trains_from_a_one_shot_generator(corpus):
    tokenizer = train_shared_bpe((s for s in corpus), vocab_size=64)
    assert len(tokenizer) == 64


def test_a_signal_while_the_bpe_trains_stops_it_at_once(corpus):
    """tokenizers trains with the GIL released, reading the text from threads of its own: the handler of a signal
    that came meanwhile ran only once the BPE was trained (English-French WMT: 20-33 minutes, past a scheduler's
    grace period). Here the text waits, after the signal, until it is handled or 30 s have passed."""
    handled, read_to_the_end, let_go = threading.Event(), threading.Event(), threading.Event()

    def texts():
        try:
            yield from corpus[:10]
            os.kill(os.getpid(), signal.SIGTERM)
            handled.wait(timeout=30)
            yield from corpus[10:]
            read_to_the_end.set()
        finally:  # closed by the reader that stopped, or read to the end
            let_go.set()

    preemption = PreemptionCallback()
    with preemption.handling(), pytest.raises(SignalledBeforeTraining):
        try:
            with preemption.stopping_at_once():
                train_shared_bpe(texts(), vocab_size=100)
        finally:
            stopped_before_the_end = not read_to_the_end.is_set()
            training = [thread for thread in threading.enumerate() if thread.name == "BPE training"]
            handled.set()
    assert stopped_before_the_end and training
    for thread in training:  # left to end with the process (which does not wait for it), reading no further
        assert thread.daemon
        thread.join(timeout=30)
    # The text is read by a thread of tokenizers', which may resume after "BPE training" has ended: wait for it.
    assert let_go.wait(timeout=30)
    assert not read_to_the_end.is_set()


def test_a_failure_while_reading_the_text_is_raised_not_a_bpe_of_what_came_before(corpus):
    """The BPE trains in a thread of its own: what the text's reader raises there (a gzip file cut short) must reach
    the caller, not leave a tokenizer of the lines read until then."""

    def cut_short():
        yield from corpus[:20]
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")

    with pytest.raises(EOFError, match="^Compressed file ended"):
        train_shared_bpe(cut_short(), vocab_size=100)


def _drawn_on_a_terminal(**kwargs) -> bytes:
    """What training a tiny BPE writes to stderr when stderr is a terminal (tokenizers draws its bars only there).

    The terminal is read while the BPE trains: a full terminal would block the writer."""
    terminal, stderr = os.openpty()
    drawn = bytearray()

    def read_until_closed():
        while True:
            try:
                chunk = os.read(terminal, 1 << 16)
            except OSError:  # EIO: the other end is closed and everything written was read
                return
            if not chunk:
                return
            drawn.extend(chunk)

    reader = threading.Thread(target=read_until_closed, daemon=True)
    reader.start()
    saved = os.dup(2)
    os.dup2(stderr, 2)
    try:
        train_shared_bpe(["a dog runs", "the dog"] * 5, vocab_size=32, **kwargs)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(stderr)
    reader.join(timeout=30)
    os.close(terminal)
    return bytes(drawn)


def test_progress_bars_are_drawn_only_when_asked_for():
    # tokenizers' trainer draws them by default: a library call (the training script's data preparation, a notebook)
    # would fill the terminal; scripts/train_tokenizer.py asks for them.
    assert _drawn_on_a_terminal() == b""
    assert b"Pre-processing sequences" in _drawn_on_a_terminal(show_progress=True)


def test_a_pair_is_merged_once_seen_min_frequency_times_twice_by_default():
    texts = ["xy", "zw", "zw"]
    tokenizer = train_shared_bpe(texts, vocab_size=64)
    assert (tokenizer.tokenize("xy"), tokenizer.tokenize("zw")) == (["▁", "x", "y"], ["▁zw"])
    every_pair = train_shared_bpe(texts, vocab_size=64, min_frequency=0)  # the smallest, allowed
    assert (every_pair.tokenize("xy"), every_pair.tokenize("zw")) == (["▁xy"], ["▁zw"])
    with pytest.raises(ValueError, match=r"^min_frequency must be at least 0 .*, got -1$"):
        train_shared_bpe(texts, vocab_size=64, min_frequency=-1)


def test_rejects_vocab_without_room_for_specials(corpus):
    with pytest.raises(ValueError, match="vocab_size"):
        train_shared_bpe(iter(corpus), vocab_size=3)


@pytest.mark.parametrize(
    "texts",
    [[], ["", "  ", "\t"], ["\u200b", "\ufeff \u00ad"]],  # the last: once a tokenizer of <unk>s, saved as a success
    ids=["nothing", "blank lines", "invisible characters"],
)
def test_refuses_to_train_on_no_text(texts):
    with pytest.raises(ValueError, match=r"^no text to train the BPE on: train\.en, train\.de hold\(s\) no line"):
        train_shared_bpe(iter(texts), vocab_size=16, source="train.en, train.de")
    with pytest.raises(ValueError, match=r"^no text to train the BPE on: the input hold\(s\) no line"):
        train_shared_bpe(iter(texts), vocab_size=16)


def test_text_followed_by_blank_lines_is_text_to_train_on():
    # A file ending in an empty line, or a second file of blank lines, still holds the text before them.
    tokenizer = train_shared_bpe(iter(["a dog runs", "", "\u200b"]), vocab_size=16)
    assert tokenizer.unk_token_id not in tokenizer("a dog runs")["input_ids"]  # trained on the text, not refused


def test_a_vocabulary_larger_than_asked_is_explained(corpus, caplog):
    """BPE keeps every character of the corpus: below their count, `vocab_size` cannot be met."""
    characters = len(set("".join(corpus)))
    with caplog.at_level(logging.WARNING, logger="modeling.tokenization"):
        tokenizer = train_shared_bpe(iter(corpus), vocab_size=4)
    assert len(tokenizer) == round_up(characters + 3, 8) > 8
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
    # Written down for readers with another default (older transformers cleaned up): "a ." read back as "a.".
    assert config["clean_up_tokenization_spaces"] is False
    assert "auto_map" not in config
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(corpus[:50])["input_ids"] == tokenizer(corpus[:50])["input_ids"]
    assert loaded(corpus[:5], text_target=corpus[5:10])["labels"] == tokenizer(corpus[5:10])["input_ids"]
    assert (loaded.pad_token_id, loaded.unk_token_id, loaded.eos_token_id) == (0, 1, 2)
    assert len(loaded) == len(tokenizer) and loaded.model_max_length == 1024
    text = "der  hund läuft ."
    assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text


def test_special_token_strings_in_text_are_text_also_after_loading(tokenizer, tmp_path):
    # Read as control tokens they would end a source early, or teach a model to stop mid-sentence.
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for each in (tokenizer, loaded):
        ids = each("a dog </s> runs <pad> in <unk> snow", text_target="ein hund </s> läuft")
        assert 0 not in ids["input_ids"] and 1 in ids["input_ids"]  # "<", "/", ">" were not seen in training
        assert ids["input_ids"].index(2) == len(ids["input_ids"]) - 1
        assert ids["labels"].index(2) == len(ids["labels"]) - 1
        first = each("a dog")["input_ids"]
        padded = each.pad([{"input_ids": first}, {"input_ids": [5]}])["input_ids"]
        assert padded[1] == [5] + [0] * (len(first) - 1)  # padding still pads


def test_iter_text_files_reads_each_file_in_turn(tmp_path):
    plain, packed, unnamed = tmp_path / "a.txt", tmp_path / "b.txt.gz", tmp_path / "c.txt"
    plain.write_bytes(b"one\r\ntwo\rstill two\n\nfour")  # only \n ends a line
    packed.write_bytes(gzip.compress("über\nfünf\n".encode()))
    unnamed.write_bytes(gzip.compress(b"\xef\xbb\xbfsechs\n"))  # gzip without the suffix, a byte order mark
    assert list(iter_text_files([plain, packed, unnamed, plain])) == [
        *("one", "two\rstill two", "", "four", "über", "fünf", "sechs"),
        *("one", "two\rstill two", "", "four"),
    ]
    lines = iter_text_files([plain, tmp_path / "missing.txt"])
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        next(lines)  # before the first file's lines, not after a WMT-sized file was read for nothing


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


def test_blank_means_whitespace_and_characters_that_show_nothing_only():
    assert is_blank("") and is_blank(" \t\u00a0") and is_blank("\u200b\ufeff\u00ad\u2060\u200f")
    # Format characters that are seen (Arabic number sign, end of ayah) and text are not blank.
    assert not is_blank("\u0600") and not is_blank("\u06dd") and not is_blank("\u200ba")


def test_visible_words_leave_out_characters_that_show_nothing():
    assert visible_words("\ufeffa man\u00ad \u200b rides\u200b. ") == ["a", "man", "rides."]


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_a_directory_holding_weights_without_a_config_keeps_its_tokenizer(weights, tmp_path):
    # A model's weights alone (a config.json lost or not yet written) were trained with the tokenizer beside them.
    (tmp_path / weights).write_bytes(b"")
    with pytest.raises(FileExistsError, match=rf"^{tmp_path} holds a model \({weights}\): a new tokenizer there"):
        check_tokenizer_destination(tmp_path)


def test_a_directory_holding_a_model_is_refused_naming_its_config(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileExistsError, match=rf"^{tmp_path} holds a model \(config\.json\): a new tokenizer there"):
        check_tokenizer_destination(tmp_path)


def test_a_directory_without_a_model_or_a_run_takes_a_tokenizer(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")  # an earlier tokenizer is replaced, as asked
    (tmp_path / "notes.txt").write_text("")
    check_tokenizer_destination(tmp_path)
    check_tokenizer_destination(tmp_path / "new")  # created when the tokenizer is saved


@pytest.mark.parametrize(
    ("config", "missing"),
    [
        (None, ["tokenizer_config.json"]),
        ({"tokenizer_class": "TokenizersBackend"}, ["tokenizer.json"]),  # transformers 5's name
        ({"tokenizer_class": "PreTrainedTokenizerFast"}, ["tokenizer.json"]),  # 4.x's, in a tokenizer saved then
        ({"tokenizer_class": "FairseqTokenizer"}, ["vocab-src.json", "vocab-tgt.json", "merges.txt"]),
        ({"tokenizer_class": "BertTokenizer"}, []),  # its loading names what it lacks
        ("not json", []),
        (["a list"], []),
    ],
    ids=["no config", "5.x", "4.x", "fairseq", "another class", "unparsable", "not a mapping"],
)
def test_the_missing_files_of_a_saved_tokenizer_are_those_its_class_reads(config, missing, tmp_path):
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (tmp_path / "tokenizer_config.json").write_text(text, encoding="utf-8")
    assert missing_tokenizer_files(tmp_path) == missing
    assert missing_tokenizer_files(str(tmp_path)) == missing
    for name in missing:
        if name != "tokenizer_config.json":
            (tmp_path / name).write_text("{}")
    if config is not None:
        assert missing_tokenizer_files(tmp_path) == []  # once there, nothing is missing
