"""Tests of modeling/translation.py: bulk translation keeps order and empty lines, batches by token budget; a file
is translated a chunk at a time and resumed after a kill, never mixed with another text's or model's."""

import copy
import errno
import fcntl
import gzip
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path

import huggingface_hub.utils._http as hf_http
import pytest
import torch
from helpers import (
    HUB_TOKEN,
    EchoModel,
    closed_port_endpoint,
    convert_fairseq_fixture,
    fed_pipe,
    reloaded_with_config,
    save_tiny_checkpoint,
    stalled_endpoint,
    subprocess_env,
    synthetic_pairs,
    tiny_tokenizer,
    tiny_translator,
    train_shared_bpe,
    word_tokenizer,
)
from transformers import AutoTokenizer, GenerationConfig

from modeling import TransformerForConditionalGeneration, translation
from modeling.export import export
from modeling.files import DiskFullError, UnwritableError
from modeling.hub_client import HUB_TIMEOUT_ENV, HubError
from modeling.quantization import quantize_int8
from modeling.translation import (
    TranslationInProgressError,
    generate_batches,
    load_model_and_tokenizer,
    model_files,
    model_fingerprint,
    partial_translation_path,
    tokenizer_fingerprint,
    translate,
    translate_file,
)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_translate_keeps_order_and_empty_lines(tokenizer):
    pairs = synthetic_pairs(30, seed=1)
    sentences = [en for en, _ in pairs]
    sentences[3:3] = [""]
    sentences[10:10] = ["   "]
    sentences[15:15] = ["\u200b \u2060\u00ad\ufeff\u200e"]  # zero-width space, word joiner, soft hyphen, BOM, LRM
    sentences.append("")
    model = EchoModel()

    outputs = translate(model, tokenizer, sentences, max_tokens=40, num_beams=2, max_new_tokens=7)

    assert outputs == ["" if s.strip(" \u200b\u2060\u00ad\ufeff\u200e") == "" else s.strip() for s in sentences]
    assert model.training, "the model's train/eval mode is restored"
    seen = [ids for call in model.calls for ids in call["input_ids"].tolist()]
    assert len(seen) == len(sentences) - 4, "empty and invisible lines never reach the model"
    for call in model.calls:
        batch_size, width = call["input_ids"].shape
        assert batch_size == 1 or batch_size * width * 2 <= 40, "batches respect the token budget, beams counted"
        assert call["kwargs"] == {"num_beams": 2, "max_new_tokens": 7}
        assert call["attention_mask"].sum(1).max() == width, "no batch is padded beyond its longest sentence"
    assert len(model.calls) > 1


def test_translate_gives_an_oversized_sentence_a_batch_of_its_own(tokenizer):
    long_sentence = " ".join(["the small dog sees a red ball today."] * 4)
    model = EchoModel()
    assert translate(model, tokenizer, ["a cat.", long_sentence], max_tokens=8) == ["a cat.", long_sentence]
    assert [call["input_ids"].shape[0] for call in model.calls] == [1, 1]


def test_sentences_are_sorted_by_length_so_a_batch_pads_none_to_a_longer_one(tokenizer):
    # In the input's order, short and long lines alternating, every batch padded its short lines to the long ones.
    short, long = "a cat.", "the small dog sees a red ball today."
    width = len(tokenizer(long)["input_ids"])
    sentences = [short, long] * 4
    model = EchoModel()
    assert translate(model, tokenizer, sentences, max_tokens=4 * width, num_beams=1) == sentences
    assert [call["input_ids"].shape[0] for call in model.calls] == [4, 4], "the four long lines, then the four short"
    assert all(call["attention_mask"].all() for call in model.calls), "no batch holds padding"


def test_a_progress_bar_counts_the_sentences_only_when_asked_for(tokenizer, capsys):
    sentences = ["a cat.", "", "the dog."]
    translate(EchoModel(), tokenizer, sentences)
    assert capsys.readouterr().err == "", "a library call is quiet"
    translate(EchoModel(), tokenizer, sentences, progress=True)
    assert "2/2" in capsys.readouterr().err, "the lines translated, empty ones aside"


def test_translate_of_only_empty_lines_does_not_call_the_model(tokenizer):
    model = EchoModel()
    assert translate(model, tokenizer, ["", " "]) == ["", ""]
    assert model.calls == []


# What `str.splitlines` ends a line at ("\r" too, as Python's universal newlines do), "\n" aside.
LINE_BREAKS_BUT_NEWLINE = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def test_a_line_break_inside_a_translation_becomes_a_space_so_no_reader_splits_it(tmp_path, capsys):
    # Web text (ParaCrawl, CommonCrawl) holds them inside sentences, so a BPE trained on it has them and a model emits
    # them: kept, `sacrebleu REF < hypotheses` (universal newlines) read one holding "\r" as two lines and refused
    # the file ("System and reference streams have different lengths"); str.splitlines split it at any of them.
    breaks = [*LINE_BREAKS_BUT_NEWLINE, "\n"]
    texts = [text for pair in synthetic_pairs(100) for text in pair] + [f"a{mark}b" for mark in breaks]
    tokenizer = train_shared_bpe(texts, vocab_size=96, min_frequency=1)
    sentences = [f"the dog{mark}sees a cat." for mark in breaks]

    assert translate(EchoModel(), tokenizer, sentences) == ["the dog sees a cat."] * len(breaks)

    source = tmp_path / "news.en"  # each line read whole: only "\n" ends a line of a file read
    source.write_bytes("".join(sentence + "\n" for sentence in sentences[:-1]).encode())
    assert translate_file(EchoModel(), tokenizer, source, None) == len(breaks) - 1
    assert capsys.readouterr().out.splitlines() == ["the dog sees a cat."] * (len(breaks) - 1)


@pytest.mark.parametrize(
    ("sentences", "error", "message"),
    [
        ("the dog.", TypeError, r"takes a list of lines, got one str: pass \[text\]"),  # was a line per character
        (["a cat.", None], TypeError, r"sentences\[1\] is NoneType, not str"),
        (["a cat.", b"the dog."], TypeError, r"sentences\[1\] is bytes, not str"),
        # json.loads('"the \\ud83d dog"'): half a surrogate pair, which the tokenizer refused naming no line
        (["a cat.", "the \ud83d dog."], ValueError, r"sentences\[1\] is not valid Unicode: '\\ud83d' at character 4"),
    ],
)
def test_what_is_not_a_list_of_lines_of_text_is_refused_naming_the_line(tokenizer, sentences, error, message):
    model = EchoModel()
    with pytest.raises(error, match=message):
        translate(model, tokenizer, sentences)
    assert model.calls == []


def test_a_token_budget_or_a_chunk_below_one_is_refused_before_any_work(tokenizer, tmp_path, capsys):
    # Taken as given, a budget of 0 translated a sentence a batch, and chunks of 0 lines wrote an empty translation.
    model = EchoModel()
    with pytest.raises(ValueError, match=r"^max_tokens must be positive, got 0\.$"):
        translate(model, tokenizer, ["a cat."], max_tokens=0)
    (tmp_path / "news.en").write_text("a cat.\n")
    with pytest.raises(ValueError, match=r"^chunk_lines must be positive, got 0\.$"):
        translate_file(model, tokenizer, tmp_path / "news.en", tmp_path / "news.de", chunk_lines=0)
    assert model.calls == [] and sorted(path.name for path in tmp_path.iterdir()) == ["news.en"]
    # The smallest allowed: a sentence a batch, a line a chunk.
    assert translate(model, tokenizer, ["a cat.", "the dog."], max_tokens=1) == ["a cat.", "the dog."]
    assert translate_file(model, tokenizer, tmp_path / "news.en", None, chunk_lines=1) == 1
    assert capsys.readouterr().out == "a cat.\n"


def test_real_model_translations_do_not_depend_on_batching(tokenizer):
    """Padding must not leak into results: one big batch and one sentence per batch agree exactly."""
    model = tiny_translator(len(tokenizer))
    sentences = [en for en, _ in synthetic_pairs(6, seed=2)]
    settings = {"num_beams": 2, "max_new_tokens": 6}
    together = translate(model, tokenizer, sentences, max_tokens=10_000, **settings)
    alone = translate(model, tokenizer, sentences, max_tokens=1, **settings)
    assert together == alone


def test_the_token_budget_counts_every_beam(tokenizer):
    """beam 1000 with a budget of 4096 tokens: one sentence at a time, not 4096 tokens × 1000 beams."""
    sentences = [en for en, _ in synthetic_pairs(12, seed=3)]
    model = EchoModel()
    translate(model, tokenizer, sentences, max_tokens=4096, num_beams=1000)
    assert [call["input_ids"].shape[0] for call in model.calls] == [1] * 12
    model = EchoModel()  # its generation config's beam 4: 60 source tokens per batch of a 240 budget
    translate(model, tokenizer, sentences, max_tokens=240)
    assert all(call["input_ids"].numel() <= 60 for call in model.calls) and len(model.calls) > 1


def test_a_generation_config_that_sets_no_beam_count_decodes_as_one_beam(tokenizer):
    """transformers 5's GenerationConfig() leaves num_beams None (generate() then takes 1): the budget counts one."""
    sentences = [en for en, _ in synthetic_pairs(12, seed=3)]
    model = EchoModel()
    model.generation_config = GenerationConfig()
    assert translate(model, tokenizer, sentences, max_tokens=4096) == [s.strip() for s in sentences]
    assert len(model.calls) == 1, "every sentence in one batch of a 4096 budget"
    width = max(len(ids) for ids in tokenizer(sentences)["input_ids"])
    model = EchoModel()
    model.generation_config = GenerationConfig()
    translate(model, tokenizer, sentences, max_tokens=12 * width)
    assert len(model.calls) == 1, "all 12, padded to the longest, fill the budget of one beam"


class SideBySideEchoModel(EchoModel):
    """An `EchoModel` whose calls wait for one another: it records how many run at once, on how many of torch's
    threads, on which named threads, and fails at call `fail_at`."""

    def __init__(self, fail_at: int | None = None):
        super().__init__()
        self.fail_at, self.started, self.running, self.most_at_once, self.threads = fail_at, 0, 0, 0, set()
        self.thread_names: set[str] = set()
        self.lock = threading.Lock()

    def generate(self, input_ids, attention_mask, **kwargs):
        with self.lock:
            self.started += 1
            if self.started - 1 == self.fail_at:
                raise RuntimeError("batch failed")
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.threads.add(torch.get_num_threads())
            self.thread_names.add(threading.current_thread().name)
            assert torch.is_inference_mode_enabled(), "each worker decodes in inference mode"
        time.sleep(0.05)  # long enough for the other worker to start its batch meanwhile
        with self.lock:
            self.running -= 1
        return super().generate(input_ids, attention_mask, **kwargs)


@pytest.fixture
def two_torch_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_two_workers_decode_two_batches_at_once_and_keep_the_order(tokenizer, two_torch_threads):
    sentences = [en for en, _ in synthetic_pairs(30, seed=1)]
    model = SideBySideEchoModel()

    outputs = translate(model, tokenizer, sentences, max_tokens=40, workers=2)

    assert outputs == [s.strip() for s in sentences]
    assert len(model.calls) > 4 and model.most_at_once == 2
    assert model.threads == {1}, "the two workers share torch's two threads"
    assert torch.get_num_threads() == 2, "and give them back"


def test_workers_share_the_thread_count_set_since_an_earlier_call(tokenizer, two_torch_threads):
    """A user who changes torch's thread count between two calls: the second divides the new count, and leaves it."""
    sentences = [en for en, _ in synthetic_pairs(30, seed=1)]
    translate(SideBySideEchoModel(), tokenizer, sentences, max_tokens=40, workers=2)
    torch.set_num_threads(4)
    model = SideBySideEchoModel()
    translate(model, tokenizer, sentences, max_tokens=40, workers=2)
    assert model.threads == {2} and torch.get_num_threads() == 4


@pytest.mark.parametrize("to_stdout", [True, False], ids=["to stdout", "to a file"])
def test_a_file_is_translated_with_the_workers_asked_for(
    tokenizer, two_torch_threads, tmp_path, capsys, monkeypatch, to_stdout
):
    monkeypatch.setattr(translation, "model_fingerprint", lambda model: "an echo")  # an echo holds no weights
    sentences = [en for en, _ in synthetic_pairs(30, seed=1)]
    source, destination = tmp_path / "news.en", tmp_path / "news.de"
    source.write_text("".join(sentence + "\n" for sentence in sentences))
    model = SideBySideEchoModel()

    translate_file(model, tokenizer, source, None if to_stdout else destination, max_tokens=40, workers=2)

    written = capsys.readouterr().out if to_stdout else destination.read_text()
    assert written.split("\n")[:-1] == [s.strip() for s in sentences]
    assert model.most_at_once == 2, "two batches decoded at once"


class WaitingEchoModel(EchoModel):
    """An echo whose first batch sets `started`, then waits for `go_on`, if given."""

    def __init__(self, go_on: threading.Event | None = None):
        super().__init__()
        self.started, self.go_on = threading.Event(), go_on

    def generate(self, input_ids, attention_mask, **kwargs):
        if not self.started.is_set():
            self.started.set()
            if self.go_on is not None:
                assert self.go_on.wait(10), "the other call never came"
        return super().generate(input_ids, attention_mask, **kwargs)


def test_overlapping_calls_with_workers_give_torchs_threads_back(tokenizer, two_torch_threads):
    """A service translating from several threads: the second call began while the first had halved torch's
    (process-wide) thread count, and put back the halved count when it ended, so every later thread ran on 1."""
    sentences = [en for en, _ in synthetic_pairs(12, seed=1)]
    first_done = threading.Event()
    second = WaitingEchoModel(go_on=first_done)  # decodes on only once the first call has ended
    first = WaitingEchoModel(go_on=second.started)  # decodes on only once the second call has begun

    first_thread_after = []

    def translate_first() -> None:
        translate(first, tokenizer, sentences, max_tokens=40, workers=2)
        first_done.set()
        first_thread_after.append(torch.get_num_threads())  # a service's thread, translating again later

    threads = [threading.Thread(target=translate_first)]
    threads.append(threading.Thread(target=translate, args=(second, tokenizer, sentences), kwargs={"workers": 2}))
    threads[0].start()
    assert first.started.wait(10), "the first call divides the threads, then decodes"
    threads[1].start()
    for thread in threads:
        thread.join(30)
    assert first_done.is_set() and len(second.calls) > 0, "first began, second began, first ended, second ended"
    seen = []
    later = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    later.start()
    later.join()
    assert seen == [2] and first_thread_after == [2] and torch.get_num_threads() == 2


class ModeRecordingEchoModel(EchoModel):
    """An echo that records, per thread, the mode each batch is decoded in (`EchoModel` would raise in a thread),
    and lets a test hold a thread's batch: `hold[thread name] = (event to set, event to wait for)`, once."""

    def __init__(self):
        super().__init__()
        self.modes: list[tuple[str, bool]] = []
        self.hold: dict[str, tuple[threading.Event, threading.Event]] = {}

    def generate(self, input_ids, attention_mask, **kwargs):
        name = threading.current_thread().name
        self.modes.append((name, self.training))
        if name in self.hold:
            reached, go_on = self.hold.pop(name)
            reached.set()
            assert go_on.wait(10), "the other call never came"
        return input_ids


def test_overlapping_calls_decode_in_evaluation_mode_and_give_the_mode_back(tokenizer):
    """A service translating from several threads with a model in training mode: the first call found training
    mode, the second (beginning while the first decoded) evaluation mode, and the first, ending, put training mode
    back while the second still decoded: its later batches decoded with dropout, and it left evaluation mode."""
    sentences = [en for en, _ in synthetic_pairs(12, seed=1)]
    model = ModeRecordingEchoModel()  # in training mode
    first_decoding, second_decoding, first_done = threading.Event(), threading.Event(), threading.Event()
    model.hold = {"first": (first_decoding, second_decoding), "second": (second_decoding, first_done)}

    def translate_first() -> None:
        translate(model, tokenizer, sentences[:2])
        first_done.set()

    threads = [
        threading.Thread(target=translate_first, name="first"),
        threading.Thread(
            target=translate, args=(model, tokenizer, sentences), kwargs={"max_tokens": 24}, name="second"
        ),
    ]
    threads[0].start()
    assert first_decoding.wait(10)
    threads[1].start()
    for thread in threads:
        thread.join(30)
    assert first_done.is_set() and [name for name, _ in model.modes].count("second") > 1, "several batches"
    assert model.modes == [(name, False) for name, _ in model.modes], "every batch in evaluation mode"
    assert model.training, "the mode the first call found, given back by the last"


def test_the_mode_is_given_back_when_the_last_of_three_overlapping_calls_ends():
    """Calls on three threads ending one after another: the model stays in evaluation mode until the third ends
    (the second to end must not give training mode back while the third still decodes)."""
    model = torch.nn.Linear(2, 2)  # in training mode
    calls = [translation._EVALUATION_MODE.of(model) for _ in range(3)]
    for call in calls:
        call.__enter__()
    for call in calls[:2]:
        call.__exit__(None, None, None)
        assert not model.training, "a call still decodes"
    calls[2].__exit__(None, None, None)
    assert model.training, "the mode the first call found, given back by the last"


def test_overlapping_calls_with_their_own_settings_translate_as_calls_one_at_a_time(tokenizer):
    """A service's threads sharing one model, each call with its own decoding, decoding at the same time (each
    thread's first batch waits for the other's): the static beam cache, the prepacked weights and the beam
    finalization belong to the call."""
    model = tiny_translator(len(tokenizer))
    sentences = [en for en, _ in synthetic_pairs(12, seed=2)]
    settings = [
        {"num_beams": 2, "max_new_tokens": 6, "max_tokens": 24},
        {"num_beams": 3, "length_penalty": 1.0, "beam_finalization": "first", "max_tokens": 36},
    ]
    alone = [translate(model, tokenizer, sentences, **setting) for setting in settings]
    both_decoding, generate, waited = threading.Barrier(2, timeout=10), model.generate, set()

    def meeting_generate(*args, **kwargs):
        if threading.current_thread().name not in waited:
            waited.add(threading.current_thread().name)
            both_decoding.wait()
        return generate(*args, **kwargs)

    model.generate = meeting_generate
    together = [None, None]

    def call(index: int) -> None:
        together[index] = translate(model, tokenizer, sentences, **settings[index])

    threads = [threading.Thread(target=call, args=(index,), name=str(index)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert together == alone and alone[0] != alone[1]


def test_workers_translate_as_one_batch_at_a_time_does(tokenizer):
    model = tiny_translator(len(tokenizer))
    sentences = [en for en, _ in synthetic_pairs(12, seed=2)]
    settings = {"num_beams": 2, "max_new_tokens": 6, "max_tokens": 24}
    assert translate(model, tokenizer, sentences, workers=3, **settings) == translate(
        model, tokenizer, sentences, **settings
    )


def test_workers_read_the_batches_at_most_twice_their_number_ahead(two_torch_threads):
    """A file's batches are made as they are read: workers reading all of them first hold them all in memory."""
    read = []

    def batches():
        for i in range(10):
            read.append(i)
            yield {"input_ids": torch.tensor([[i + 3]]), "attention_mask": torch.ones(1, 1, dtype=torch.long)}

    with closing(generate_batches(EchoModel().eval(), batches(), workers=2)) as generated:
        assert next(generated).tolist() == [[3]]
        assert read == [0, 1, 2, 3], "4 read ahead for 2 workers"
        assert [batch.item() for batch in generated] == list(range(4, 13))


def test_a_failing_batch_stops_the_workers_and_is_the_error(tokenizer, two_torch_threads):
    sentences = [en for en, _ in synthetic_pairs(30, seed=1)]
    model = SideBySideEchoModel(fail_at=2)
    with pytest.raises(RuntimeError, match="batch failed"):
        translate(model, tokenizer, sentences, max_tokens=40, workers=2)
    # the pool is shut down before the error comes out: no worker decodes on, its model given back its mode (the
    # workers are told by their name, in a stack dump as here)
    assert model.thread_names and all(name.startswith("generate") for name in model.thread_names)
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("generate")]
    one_by_one = EchoModel()
    translate(one_by_one, tokenizer, sentences, max_tokens=40)
    # submitted when the failure is met: the 4 read ahead, and one more for each of the 2 results taken
    assert model.started <= 6 < len(one_by_one.calls), "batches not yet begun are never decoded"
    assert model.training and torch.get_num_threads() == 2, "the model's mode and torch's threads given back"


def test_an_error_after_a_batch_is_decoded_stops_the_workers_while_its_traceback_is_held(
    tokenizer, two_torch_threads, monkeypatch
):
    """An error in `translate`'s own loop (turning a batch's ids into text), its traceback kept (a service logging
    it): the workers are stopped and torch's threads given back as it comes out, not when the
    traceback lets the generator go."""
    sentences = [en for en, _ in synthetic_pairs(30, seed=1)]

    def fails(*args, **kwargs):
        raise RuntimeError("decoding failed")

    monkeypatch.setattr(tokenizer, "batch_decode", fails)
    kept = None
    try:
        translate(SideBySideEchoModel(), tokenizer, sentences, max_tokens=40, workers=2)
    except RuntimeError as error:
        kept = error  # its traceback holds translate's frame, and the generator in it
    assert str(kept) == "decoding failed" and kept.__traceback__ is not None
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("generate")]
    assert torch.get_num_threads() == 2, "torch's threads given back"


def test_workers_stopped_early_never_decode_the_batches_read_but_not_begun(two_torch_threads, monkeypatch):
    """A reader that stops (an error on a batch's result, a closed generator) stops the workers: the batches read
    ahead that no worker has begun are dropped, not decoded while the error waits for the pool."""
    release, held, begun = threading.Event(), threading.Semaphore(0), []

    class HeldEchoModel(EchoModel):
        def generate(self, input_ids, attention_mask, **kwargs):
            begun.append(input_ids.item())
            if input_ids.item() > 0:  # both workers busy until the pool is shut down
                held.release()
                assert release.wait(10)
            return super().generate(input_ids, attention_mask, **kwargs)

    class ReleasingPool(translation.ThreadPoolExecutor):
        def shutdown(self, wait=True, *, cancel_futures=False):
            super().shutdown(wait=False, cancel_futures=cancel_futures)  # what is cancelled is cancelled now
            release.set()
            super().shutdown(wait=wait)

    monkeypatch.setattr(translation, "ThreadPoolExecutor", ReleasingPool)
    batches = (
        {"input_ids": torch.tensor([[i]]), "attention_mask": torch.ones(1, 1, dtype=torch.long)} for i in range(10)
    )
    generated = generate_batches(HeldEchoModel().eval(), batches, workers=2)
    assert next(generated).tolist() == [[0]]  # 4 read ahead: 0 done, 1 and 2 begun, 3 waiting for a worker
    assert held.acquire(timeout=10) and held.acquire(timeout=10)
    generated.close()
    assert sorted(begun) == [0, 1, 2], "batch 3, read but not begun, is never decoded"


@pytest.mark.parametrize("setting", [{"num_return_sequences": 2}, {"return_dict_in_generate": True}])
def test_settings_that_would_not_give_one_translation_per_line_are_refused_before_any_work(
    tokenizer, tmp_path, setting
):
    # They failed after decoding: zip() "argument 2 is longer than argument 1", KeyError 'input_ids'.
    model = EchoModel()
    ((name, value),) = setting.items()
    expected = f"^translate\\(\\) gives one translation per line, so {name}={value!r} cannot apply"
    with pytest.raises(ValueError, match=expected):
        translate(model, tokenizer, ["a cat."], **setting)
    (tmp_path / "news.en").write_text("a cat.\n")
    with pytest.raises(ValueError, match=expected):
        translate_file(model, tokenizer, tmp_path / "news.en", tmp_path / "news.de", **setting)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["news.en"] and model.calls == []
    model.generation_config.num_return_sequences = 3  # saved in the model's generation config
    with pytest.raises(ValueError, match="num_return_sequences=3 cannot apply"):
        translate(model, tokenizer, ["a cat."])
    assert translate(model, tokenizer, ["a cat."], num_return_sequences=1) == ["a cat."]
    model.generation_config.num_return_sequences = 1
    given = GenerationConfig(num_beams=2, num_return_sequences=2)  # in a generation config passed along
    with pytest.raises(ValueError, match="num_return_sequences=2 cannot apply"):
        translate(model, tokenizer, ["a cat."], generation_config=given)


def test_translations_do_not_depend_on_the_tokenizers_padding_side(file_to_translate, tokenizer):
    """Left padding would shift the sinusoidal positions of every shorter sentence of a batch."""
    _, lines, model, expected = file_to_translate
    left = copy.deepcopy(tokenizer)
    left.padding_side = "left"
    assert translate(model, left, lines, **SETTINGS) == expected


def test_workers_are_refused_where_they_cannot_help(tokenizer, tmp_path):
    on_gpu = EchoModel()
    on_gpu.device = torch.device("meta")  # stands for a GPU: not a CPU
    with pytest.raises(ValueError, match="the model is on meta.*use 1 worker"):
        translate(on_gpu, tokenizer, ["a cat."], workers=2)
    (tmp_path / "news.en").write_text("a cat.\n")
    with pytest.raises(ValueError, match="the model is on meta.*use 1 worker"):
        translate_file(on_gpu, tokenizer, tmp_path / "news.en", tmp_path / "news.de", workers=2)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["news.en"], "refused before any file is made"
    with pytest.raises(ValueError, match="workers must be positive, got 0"):
        list(generate_batches(EchoModel(), [], workers=0))
    assert on_gpu.calls == []
    assert list(generate_batches(on_gpu, [])) == [], "one worker by default, on any device"


def test_a_directory_not_saved_as_a_model_or_given_a_revision_is_refused_in_one_line(tmp_path):
    # a revision names a version of a Hub repo: a directory's model would be loaded as it is, the revision unused
    with pytest.raises(ValueError, match=r"is a local directory: a revision names a version of a Hub repo only\.$"):
        load_model_and_tokenizer(str(tmp_path), revision="main")
    with pytest.raises(
        FileNotFoundError, match=r"has no config\.json: it is not a model saved with save_pretrained\.$"
    ):
        load_model_and_tokenizer(str(tmp_path))
    # a path, not a Hub id: named as missing, never looked up on the Hub
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match=f"^Model directory {re.escape(repr(missing))} does not exist\\.$"):
        load_model_and_tokenizer(missing)


def test_a_checkpoint_loads_with_the_attention_asked_for(tiny_checkpoint):
    """`attn_implementation="eager"` returns attention weights; by default the model's own choice is kept."""
    directory = str(tiny_checkpoint[0])
    eager, _ = load_model_and_tokenizer(directory, attn_implementation="eager", device="cpu")
    default, _ = load_model_and_tokenizer(directory, device="cpu")
    assert eager.config._attn_implementation == "eager" != default.config._attn_implementation
    assert not eager.training and eager.device.type == "cpu"


def test_a_checkpoint_loads_onto_the_device_asked_for(tiny_checkpoint, monkeypatch):
    """A device given is used; none given, CUDA where there is one, else the CPU."""
    directory = str(tiny_checkpoint[0])
    model, _ = load_model_and_tokenizer(directory, device="meta")  # meta: a device other than the default, anywhere
    assert model.device.type == "meta"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model, _ = load_model_and_tokenizer(directory)
    assert model.device.type == "cpu"
    moved_to = []  # where a CUDA device would be taken: this machine may have none to move onto
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        TransformerForConditionalGeneration, "to", lambda model, device: moved_to.append(device) or model
    )
    load_model_and_tokenizer(directory)
    assert [str(device) for device in moved_to] == ["cuda"]


def test_truncated_weights_are_named_before_loading(tmp_path):
    save_tiny_checkpoint(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ValueError, match=r"holds incomplete weights: model\.safetensors is truncated \(\d+ bytes"):
        load_model_and_tokenizer(str(tmp_path))


def test_a_run_directory_without_its_final_model_yet_names_its_newest_checkpoint(tmp_path):
    """`--model runs/x` while x trains: it holds the tokenizer and checkpoints, config.json only once training ends.
    Before, only "it is not a model saved with save_pretrained"."""
    run = tmp_path / "x"
    save_tiny_checkpoint(run / "checkpoint-8")
    save_tiny_checkpoint(run / "checkpoint-10")
    tiny_tokenizer().save_pretrained(run)
    with pytest.raises(FileNotFoundError) as refused:
        load_model_and_tokenizer(str(run))
    assert str(refused.value) == (
        f"'{run}' has no config.json: it is not a model saved with save_pretrained (a training run's directory, its "
        f"final model not saved yet: load one of its checkpoints, {run / 'checkpoint-10'})."
    )


@pytest.mark.parametrize("removed_before", ["get_config_dict", "from_pretrained", "_load_tokenizer"])
def test_a_checkpoint_removed_while_it_loads_is_named_as_such(tmp_path, monkeypatch, removed_before):
    """A run still training rotated it out (save_total_limit) once its config.json was read: before, "Repo id must be
    in the form 'repo_name' or 'namespace/repo_name': '/.../checkpoint-2'" (its path looked up on the Hub)."""
    checkpoint = tmp_path / "run" / "checkpoint-2"
    save_tiny_checkpoint(checkpoint)
    owner = {"get_config_dict": translation.TransformerConfig, "from_pretrained": translation.AutoModelForSeq2SeqLM}
    target = owner.get(removed_before, translation)
    original = getattr(target, removed_before)

    def rotated_out_first(*args, **kwargs):
        os.replace(checkpoint, checkpoint.with_name(".checkpoint-2.deleting"))
        return original(*args, **kwargs)

    monkeypatch.setattr(target, removed_before, rotated_out_first)
    with pytest.raises(FileNotFoundError) as refused:
        load_model_and_tokenizer(str(checkpoint))
    assert str(refused.value) == (
        f"Model directory '{checkpoint}' was removed while it was loaded (by the save_total_limit rotation of a run "
        "still training there?): load it again, or a checkpoint the run keeps."
    )


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("no tokenizer", r"has no tokenizer \(tokenizer\.json or tokenizer_config\.json\): save it beside the model"),
        ("tokenizer.json cut short", r"The tokenizer in .* does not load \(Unterminated string"),
        # were "does not load (Couldn't instantiate the backend tokenizer from one of: )" and FSMT's "arg `langs`
        # needs to be a list of 2 langs": no file named
        ("no tokenizer.json", r"' holds a tokenizer without tokenizer\.json: copy the model directory whole"),
        ("no tokenizer_config.json", r"' holds a tokenizer without tokenizer_config\.json: copy the model directory"),
        ("config.json cut short", r"Could not read .*config\.json: .*not a valid JSON file"),
    ],
)
def test_a_missing_or_broken_tokenizer_or_config_is_named(tmp_path, damage, message):
    """transformers' own messages name other tokenizer classes (FSMT's `langs`), no file, or say that a local
    directory is not one."""
    save_tiny_checkpoint(tmp_path)
    if damage == "no tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (tmp_path / name).unlink()
    elif damage.startswith("no "):
        (tmp_path / damage.removeprefix("no ")).unlink()
    else:
        damaged = tmp_path / damage.split()[0]
        damaged.write_text(damaged.read_text()[:300])
    with pytest.raises((OSError, ValueError), match=message):
        load_model_and_tokenizer(str(tmp_path))


def test_a_model_saved_as_pytorch_model_bin_loads(tmp_path):
    """A checkpoint with its weights in pytorch_model.bin (older transformers) has no safetensors to check: it loads,
    not refused as holding "no weights"."""
    model, tokenizer = save_tiny_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    loaded, _ = load_model_and_tokenizer(str(tmp_path), device="cpu")
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in model.state_dict().items())


@pytest.mark.parametrize("name", ["sacremoses", "sacremoses.tokenize"])
def test_a_package_the_tokenizer_needs_is_named_with_how_to_install_it(tiny_checkpoint, monkeypatch, name):
    """A converted fairseq model's tokenizer imports sacremoses: a missing one is named by its package, a
    submodule's too (what pip installs)."""

    def needs(*args, **kwargs):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(translation.AutoTokenizer, "from_pretrained", needs)
    directory = str(tiny_checkpoint[0])
    with pytest.raises(ImportError) as error:
        load_model_and_tokenizer(directory, device="cpu")
    assert str(error.value) == f"The tokenizer of {directory!r} needs the package 'sacremoses': pip install sacremoses"


def test_a_tokenizer_failing_without_a_message_is_named_by_the_errors_type(tiny_checkpoint, monkeypatch):
    def fails(*args, **kwargs):
        raise KeyError  # no message: str() of it is empty

    monkeypatch.setattr(translation.AutoTokenizer, "from_pretrained", fails)
    directory = str(tiny_checkpoint[0])
    with pytest.raises(ValueError) as error:
        load_model_and_tokenizer(directory, device="cpu")
    assert str(error.value).startswith(f"The tokenizer in {directory!r} does not load (KeyError): a file cut short")


def test_an_import_error_naming_no_module_goes_through_as_it_is(tiny_checkpoint, monkeypatch):
    def fails(*args, **kwargs):
        raise ModuleNotFoundError("a loader's own message")

    monkeypatch.setattr(translation.AutoTokenizer, "from_pretrained", fails)
    with pytest.raises(ModuleNotFoundError, match=r"^a loader's own message$"):
        load_model_and_tokenizer(str(tiny_checkpoint[0]), device="cpu")


def test_a_converted_fairseq_model_without_a_file_of_its_tokenizer_names_the_file(converted_fairseq_dir, tmp_path):
    """Before: "does not load (expected str, bytes or os.PathLike object, not NoneType)", no file named."""
    copy = tmp_path / "converted"
    shutil.copytree(converted_fairseq_dir, copy)
    (copy / "merges.txt").unlink()
    with pytest.raises(FileNotFoundError) as refused:
        load_model_and_tokenizer(str(copy))
    assert str(refused.value).startswith(f"'{copy}' holds a tokenizer without merges.txt: copy the model directory")


@pytest.mark.parametrize(("to", "runtime"), [("marian", "MarianMTModel"), ("onnx", "onnxruntime")])
def test_an_export_directory_is_named_as_one_with_the_model_it_came_from(tmp_path, to, runtime):
    save_tiny_checkpoint(tmp_path / "model")
    model, tokenizer = load_model_and_tokenizer(str(tmp_path / "model"))
    export(model, tokenizer, tmp_path / to, to=to)  # a Marian export holds a config.json that transformers reads
    with pytest.raises(ValueError) as error:
        load_model_and_tokenizer(str(tmp_path / to))
    message = str(error.value)
    assert message.startswith(f"'{tmp_path / to}' is an export for {to} (export.json), not a model saved with")
    assert runtime in message and message.endswith(f"({tmp_path / 'model'}).") and "\n" not in message


def test_a_model_named_on_a_stalled_hub_fails_in_one_line_within_the_timeout(quick_hub, monkeypatch):
    # huggingface_hub retries a download five times itself; its 23 s of pauses between them are skipped here.
    monkeypatch.setattr(hf_http.time, "sleep", lambda seconds: None)
    with stalled_endpoint() as endpoint:
        quick_hub(endpoint)
        start = time.monotonic()
        with pytest.raises(HubError) as error:
            load_model_and_tokenizer("user/tiny")
        elapsed = time.monotonic() - start
    message = str(error.value)
    assert message.startswith(f"Could not load 'user/tiny' from the Hub: HEAD {endpoint}/user/tiny/resolve/main/")
    assert "no answer within 0.3 s" in message and "\n" not in message
    # Its first request (model_info, sent with `timeout=None`) waited forever before; now each waits 0.3 s.
    assert elapsed < 10, elapsed


# Loads argv[1] with huggingface_hub's pauses between retries skipped (23 s), logging to stderr.
STALLED_LOADER = """
import logging, sys
import huggingface_hub.utils._http as hf_http
from modeling.translation import load_model_and_tokenizer

hf_http.time.sleep = lambda seconds: None
logging.basicConfig(format="%(levelname)s: %(message)s")
model, tokenizer = load_model_and_tokenizer(sys.argv[1])
print(len(tokenizer))
"""


def test_a_model_in_the_cache_loads_when_the_hub_does_not_answer(hub, tiny_checkpoint, tmp_path):
    """A compute node whose firewall swallows traffic, HF_HUB_OFFLINE forgotten: transformers loads the config and
    the weights from the cache, but its tokenizer loading let the timeout through, a traceback. (A process of its
    own: transformers keeps a client of the first endpoint it met.)"""
    from huggingface_hub import HfApi, snapshot_download

    endpoint, _ = hub
    HfApi(endpoint=endpoint, token=HUB_TOKEN).create_repo("cached/tiny", exist_ok=True)
    HfApi(endpoint=endpoint, token=HUB_TOKEN).upload_folder(folder_path=tiny_checkpoint[0], repo_id="cached/tiny")
    snapshot_download("cached/tiny", cache_dir=tmp_path / "hub", endpoint=endpoint, token=HUB_TOKEN)
    with stalled_endpoint() as stalled:
        env = subprocess_env(HF_HOME=str(tmp_path), HF_ENDPOINT=stalled, **{HUB_TIMEOUT_ENV: "0.3"})
        env.pop("HF_HUB_OFFLINE", None)
        loaded = subprocess.run(
            [sys.executable, "-c", STALLED_LOADER, "cached/tiny"], env=env, capture_output=True, text=True, timeout=300
        )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split() == [str(len(tiny_checkpoint[2]))]
    assert "The Hub did not answer (timed out): the tokenizer of 'cached/tiny' comes from the cache" in loaded.stderr


def test_a_model_named_on_an_unreachable_hub_names_the_url(quick_hub, monkeypatch):
    monkeypatch.setattr(hf_http.time, "sleep", lambda seconds: None)
    endpoint = closed_port_endpoint()
    quick_hub(endpoint)
    expected = rf"^Could not load 'user/tiny' from the Hub: \w+ {endpoint}/.*: cannot connect"
    with pytest.raises(HubError, match=expected):
        load_model_and_tokenizer("user/tiny")


@pytest.mark.parametrize(
    ("loader", "method"),
    [("TransformerConfig", "get_config_dict"), ("AutoModelForSeq2SeqLM", "from_pretrained")],
    ids=["after the config", "after weights"],
)
def test_a_push_landing_during_a_load_does_not_mix_two_models(hub_here, tmp_path, monkeypatch, loader, method):
    """The tokenizer is fetched after the weights (minutes after, for a real model): each file followed the branch,
    so a push landing in between gave the first model's weights with the second one's tokenizer, without a word.
    The weights too come from the commit pinned when the load began, not one pushed after the config was read."""
    from modeling.hub import push_model_dir

    first, second = tmp_path / "first", tmp_path / "second"
    model, tokenizer = save_tiny_checkpoint(first)
    texts = [text for pair in synthetic_pairs(200, seed=9) for text in pair]
    other_tokenizer = train_shared_bpe(texts, vocab_size=len(tokenizer), min_frequency=1)
    tiny_translator(len(other_tokenizer), seed=1).save_pretrained(second)
    other_tokenizer.save_pretrained(second)
    sentence = "the small dog sees a red ball."
    assert other_tokenizer(sentence)["input_ids"] != tokenizer(sentence)["input_ids"]
    push_model_dir(first, "tester/race", token=HUB_TOKEN)
    load, pushed = getattr(getattr(translation, loader), method), []

    def load_then_a_push(*args, **kwargs):
        loaded = load(*args, **kwargs)
        if not pushed:  # once: the weights' loading reads the config again, and so does the push's check
            pushed.append(second)
            push_model_dir(second, "tester/race", token=HUB_TOKEN)
        return loaded

    monkeypatch.setattr(getattr(translation, loader), method, load_then_a_push)
    loaded, loaded_tokenizer = load_model_and_tokenizer("tester/race", device="cpu")
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in model.state_dict().items())
    assert loaded_tokenizer(sentence)["input_ids"] == tokenizer(sentence)["input_ids"], "the tokenizer of the weights"


def test_weights_cut_short_in_the_hub_cache_are_named_in_one_line(hub_here, tiny_checkpoint):
    """A cache copied to a node without internet, the copy cut short: from_pretrained used the cached file
    unchecked and failed with safetensors' "incomplete metadata", a traceback naming no file."""
    from huggingface_hub import HfApi, snapshot_download

    endpoint, _ = hub_here
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    api.create_repo("tester/cut")
    commit = api.upload_folder(folder_path=tiny_checkpoint[0], repo_id="tester/cut").oid
    weights = Path(snapshot_download("tester/cut")) / "model.safetensors"
    content = weights.resolve().read_bytes()
    weights.resolve().chmod(0o644)
    weights.resolve().write_bytes(content[: len(content) // 2])
    with pytest.raises(ValueError) as error:
        load_model_and_tokenizer("tester/cut", device="cpu")
    assert str(error.value) == (
        f"The Hub cache holds 'tester/cut' with incomplete weights in {weights.parent}: model.safetensors is "
        f"truncated ({len(content) // 2} bytes, expected {len(content)}) (a copy of the cache, or a download, cut "
        f"short): download them again with `hf download tester/cut --revision {commit} --force-download`."
    )


@pytest.mark.parametrize("revision", ["v2", "0123abc", "0" * 40])
def test_a_revision_the_repo_does_not_have_is_named_as_such(hub_here, tiny_checkpoint, revision):
    """A branch, tag or commit that the repo does not have was said to be "neither a local directory nor a
    reachable Hub repo id", as if the repo itself were not there."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_here[0], token=HUB_TOKEN)
    api.create_repo("tester/revisions", exist_ok=True)
    api.upload_folder(folder_path=tiny_checkpoint[0], repo_id="tester/revisions")
    with pytest.raises(OSError) as error:
        load_model_and_tokenizer("tester/revisions", revision=revision, device="cpu")
    assert str(error.value) == (
        f"'tester/revisions' has no revision {revision!r} (no branch, tag or commit of that name): name one that "
        "the repo has."
    )


def test_weights_cut_short_at_the_revision_asked_for_are_named_though_mains_are_whole(
    hub_here, tiny_checkpoint, tmp_path
):
    """The cache is checked at the commit loaded, not at main's: an older revision cut short is named too."""
    from huggingface_hub import HfApi, snapshot_download

    endpoint, _ = hub_here
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    api.create_repo("tester/older")
    first = api.upload_folder(folder_path=tiny_checkpoint[0], repo_id="tester/older").oid
    tiny_translator(len(tiny_checkpoint[2]), seed=1).save_pretrained(tmp_path / "retrained")
    api.upload_folder(folder_path=tmp_path / "retrained", repo_id="tester/older")  # main: other weights
    snapshot_download("tester/older")  # main's, whole
    weights = Path(snapshot_download("tester/older", revision=first)) / "model.safetensors"
    content = weights.resolve().read_bytes()
    weights.resolve().chmod(0o644)
    weights.resolve().write_bytes(content[: len(content) // 2])
    with pytest.raises(ValueError, match=r"^The Hub cache holds 'tester/older' with incomplete weights in ") as error:
        load_model_and_tokenizer("tester/older", revision=first, device="cpu")
    assert f"in {weights.parent}: model.safetensors is truncated" in str(error.value)


def test_a_hub_model_pushed_without_its_tokenizer_is_named(hub_here, tmp_path):
    """transformers would fall back to the tokenizer class registered for the model type, whose error is about
    its languages."""
    from huggingface_hub import HfApi

    endpoint, _ = hub_here
    save_tiny_checkpoint(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).unlink()
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    api.create_repo("tester/untokenized")
    api.upload_folder(folder_path=tmp_path, repo_id="tester/untokenized")
    expected = r"^'tester/untokenized' has no tokenizer \(tokenizer\.json or tokenizer_config\.json\): push it beside"
    with pytest.raises(FileNotFoundError, match=expected):
        load_model_and_tokenizer("tester/untokenized", device="cpu")


def test_a_hub_model_offline_and_not_in_the_cache_is_named_before_loading(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1 and a repo never downloaded: the cache named and how to fill it, before any load, not
    transformers' "couldn't connect", which blames the network."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError) as error:
        load_model_and_tokenizer("tester/never-downloaded", device="cpu")
    assert str(error.value) == (
        f"'tester/never-downloaded' is not in the Hub cache {tmp_path / 'cache'}, and offline mode (HF_HUB_OFFLINE) "
        "keeps it from the Hub: download it where the Hub can be reached, into the same HF_HOME (hf download "
        "tester/never-downloaded)"
    )


def test_a_name_that_is_no_directory_and_no_hub_repo_is_named(hub_here):
    """A typo in an owner/name id the Hub answers for: one OSError naming what was looked for, not an
    UnboundLocalError."""
    with pytest.raises(OSError, match=r"^Could not load a model config from 'tester/no-such-model': it is neither"):
        load_model_and_tokenizer("tester/no-such-model", device="cpu")


def test_a_hub_repo_without_a_config_or_of_a_model_type_transformers_lacks_is_named_in_one_line(hub_here, tmp_path):
    """transformers gives {} for a repo without config.json (a README pushed alone), then "Unrecognized model ...
    Should have a `model_type` key", and a model type it does not know in ten lines."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_here[0], token=HUB_TOKEN)
    (tmp_path / "README.md").write_text("A card pushed before its model.\n")
    cases = [
        ("tester/configless", None, FileNotFoundError, "has no config.json naming a model_type: it is not a model"),
        ("tester/newer", "a-newer-architecture", ValueError, "holds a 'a-newer-architecture' checkpoint, not a "),
    ]
    for repo_id, model_type, error, expected in cases:
        if model_type is not None:
            (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
        api.create_repo(repo_id)
        api.upload_folder(folder_path=tmp_path, repo_id=repo_id)
        with pytest.raises(error, match=f"^{re.escape(repr(repo_id) + ' ' + expected)}"):
            load_model_and_tokenizer(repo_id, device="cpu")


SETTINGS = {"num_beams": 2, "max_new_tokens": 5}


@pytest.fixture(scope="module")
def file_to_translate(tmp_path_factory, tokenizer):
    """(source file, its lines, a tiny model, its translations of them line by line)."""
    lines = [en for en, _ in synthetic_pairs(11, seed=5)]
    lines[4:4] = [""]
    source = tmp_path_factory.mktemp("text") / "news.en"
    source.write_text("".join(line + "\n" for line in lines))
    model = tiny_translator(len(tokenizer))
    return source, lines, model, translate(model, tokenizer, lines, **SETTINGS)


class Interrupt(Exception):
    pass


def counting_translate(monkeypatch, interrupt_at: int | None = None, given: list | None = None) -> list[int]:
    """Wrap `translate` where translate_file calls it: the chunk sizes it is given (and the lines, into `given`);
    `Interrupt` at call N."""
    sizes = []

    def wrapper(model, tokenizer, sentences, **kwargs):
        if len(sizes) == interrupt_at:
            raise Interrupt
        sizes.append(len(sentences))
        if given is not None:
            given.extend(sentences)
        return translate(model, tokenizer, sentences, **kwargs)  # the module's own, imported above

    monkeypatch.setattr(translation, "translate", wrapper)
    return sizes


def test_a_file_is_translated_a_chunk_at_a_time_as_translate_translates_it(
    file_to_translate, tokenizer, tmp_path, capsys
):
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "out" / "news.de"
    assert translate_file(model, tokenizer, source, destination, chunk_lines=4, **SETTINGS) == len(lines)
    assert destination.read_text().split("\n")[:-1] == expected
    assert sorted(path.name for path in destination.parent.iterdir()) == ["news.de"], "no partial file left"

    assert translate_file(model, tokenizer, source, None, chunk_lines=5, **SETTINGS) == len(lines)
    assert capsys.readouterr().out.split("\n")[:-1] == expected, "to stdout, chunk after chunk"


class FlushedStdout:
    """A stdout that tells what was written from what reached the reader (flushed)."""

    def __init__(self):
        self.written, self.flushed = "", ""

    def write(self, text):
        self.written += text
        return len(text)

    def flush(self):
        self.flushed = self.written


def test_to_stdout_each_chunk_reaches_the_reader_before_the_next_is_translated(tokenizer, tmp_path, monkeypatch):
    """A pipe's reader (`| sacrebleu`, a service) gets each chunk as it is done, not when a buffer fills."""
    lines = [en for en, _ in synthetic_pairs(5, seed=2)]
    source = tmp_path / "news.en"
    source.write_text("".join(line + "\n" for line in lines))
    stdout = FlushedStdout()
    monkeypatch.setattr(sys, "stdout", stdout)
    flushed_before_each_chunk = []

    def wrapper(model, tokenizer, sentences, **kwargs):
        flushed_before_each_chunk.append(stdout.flushed)
        return translate(model, tokenizer, sentences, **kwargs)

    monkeypatch.setattr(translation, "translate", wrapper)
    assert translate_file(EchoModel(), tokenizer, source, None, chunk_lines=2) == 5
    echoed = [line.strip() + "\n" for line in lines]
    assert flushed_before_each_chunk == ["", "".join(echoed[:2]), "".join(echoed[:4])]
    assert stdout.flushed == "".join(echoed)


@pytest.mark.parametrize("to_stdout", [True, False], ids=["to stdout", "to a file"])
def test_a_file_translation_counts_its_sentences_on_a_bar_only_when_asked_for(
    tokenizer, tmp_path, capsys, monkeypatch, to_stdout
):
    monkeypatch.setattr(translation, "model_fingerprint", lambda model: "an echo")  # an echo holds no weights
    source = tmp_path / "news.en"
    source.write_text("".join(en + "\n" for en, _ in synthetic_pairs(5, seed=2)))
    translate_file(EchoModel(), tokenizer, source, None if to_stdout else tmp_path / "quiet.de", chunk_lines=2)
    assert capsys.readouterr().err == "", "a library call is quiet"
    translate_file(
        EchoModel(), tokenizer, source, None if to_stdout else tmp_path / "news.de", chunk_lines=2, progress=True
    )
    assert "translated: 5sent " in capsys.readouterr().err, "every line of the file, chunk after chunk"


def test_standard_input_is_translated_into_a_file(tokenizer, tmp_path, monkeypatch):
    """`-` is standard input (`zcat news.gz | translate.py - --output-file news.de`), not a file named `-`."""
    monkeypatch.setattr(translation, "model_fingerprint", lambda model: "an echo")  # an echo holds no weights
    lines = [en for en, _ in synthetic_pairs(5, seed=2)]
    stdin = io.TextIOWrapper(io.BytesIO("".join(line + "\n" for line in lines).encode()), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.chdir(tmp_path)
    assert translate_file(EchoModel(), tokenizer, "-", tmp_path / "news.de", chunk_lines=2) == 5
    assert (tmp_path / "news.de").read_text() == "".join(line.strip() + "\n" for line in lines)


def test_a_translation_into_a_link_replaces_the_file_it_leads_to_and_the_link_stays(
    file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """`--output-file news.de`, a link to the file a service reads: the translation was renamed over the link, and
    the file it led to kept the earlier translation (the text arguments' path, `write_text`, replaced it)."""
    source, lines, model, expected = file_to_translate
    served = tmp_path / "served" / "news.de"
    served.parent.mkdir()
    served.write_text("an earlier translation\n")
    destination = tmp_path / "news.de"
    destination.symlink_to(served)
    counting_translate(monkeypatch, interrupt_at=2)
    with pytest.raises(Interrupt):
        translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert partial_translation_path(destination) == served.parent / ".news.de.partial"
    counting_translate(monkeypatch)
    assert translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS) == len(lines)
    assert destination.is_symlink() and served.read_text().split("\n")[:-1] == expected
    assert sorted(path.name for path in served.parent.iterdir()) == ["news.de"]


@pytest.mark.parametrize("workers", [1, 2], ids=["same command", "with 2 workers"])
def test_a_killed_translation_resumes_after_its_last_chunk(
    workers, file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """Resumed by the same command, or with another number of workers (not part of what was translated)."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    destination.write_text("an earlier translation\n")
    sizes = counting_translate(monkeypatch, interrupt_at=2)
    with pytest.raises(Interrupt):
        translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert sizes == [3, 3]
    assert destination.read_text() == "an earlier translation\n", "replaced only when complete"
    assert partial_translation_path(destination).read_text().split("\n")[:-1] == expected[:6]
    record = json.loads((tmp_path / f".{destination.name}.partial.json").read_text())
    assert (record["source"], record["lines"]) == (str(source), 6), "the record says what it is a translation of"

    sizes = counting_translate(monkeypatch)
    resumed = translate_file(model, tokenizer, source, destination, chunk_lines=3, workers=workers, **SETTINGS)
    assert resumed == len(lines)
    assert sizes == [3, 3], "only the 6 lines not yet translated"
    assert destination.read_text().split("\n")[:-1] == expected
    assert sorted(path.name for path in tmp_path.iterdir()) == ["news.de"]


def test_a_translation_killed_after_a_chunk_of_one_line_resumes(file_to_translate, tokenizer, tmp_path, monkeypatch):
    """The fewest a record can count: one line, in as many bytes as its translation and "\n" take."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    killed_translation(file_to_translate, tokenizer, destination, monkeypatch, chunk_lines=1, chunks=1)
    sizes = counting_translate(monkeypatch)
    assert translate_file(model, tokenizer, source, destination, chunk_lines=1, **SETTINGS) == len(lines)
    assert sum(sizes) == len(lines) - 1, "the line done is not translated again"
    assert destination.read_text().split("\n")[:-1] == expected


def test_a_translation_killed_after_a_chunk_of_empty_lines_resumes(
    file_to_translate, tokenizer, tmp_path, monkeypatch, caplog
):
    """A chunk of empty lines is one "\n" a line: a record of as many bytes as lines, which is resumed too."""
    _, lines, model, expected = file_to_translate
    source, destination = tmp_path / "news.en", tmp_path / "news.de"
    source.write_text("\n" * 3 + "".join(line + "\n" for line in lines))
    counting_translate(monkeypatch, interrupt_at=1)
    with pytest.raises(Interrupt):
        translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    sizes = counting_translate(monkeypatch)
    with caplog.at_level(logging.INFO, logger="modeling.translation"):
        assert translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS) == len(lines) + 3
    assert sum(sizes) == len(lines) and "Resuming the translation" in caplog.text, "the empty lines done are kept"
    assert destination.read_text().split("\n")[:-1] == ["", "", "", *expected]


def test_a_rerun_giving_the_same_generate_keywords_in_another_order_resumes(tokenizer, tmp_path, monkeypatch):
    """The decoding is known by its settings, not by the order a caller passes them in (`**vars(args)`)."""
    monkeypatch.setattr(translation, "model_fingerprint", lambda model: "an echo")  # an echo holds no weights
    lines = [en for en, _ in synthetic_pairs(6, seed=2)]
    source, destination = tmp_path / "news.en", tmp_path / "news.de"
    source.write_text("".join(line + "\n" for line in lines))
    counting_translate(monkeypatch, interrupt_at=1)
    with pytest.raises(Interrupt):  # two generate() keywords that are not fields of the generation config
        translate_file(EchoModel(), tokenizer, source, destination, chunk_lines=2, synced_gpus=False, streamer=None)
    sizes = counting_translate(monkeypatch)
    translate_file(EchoModel(), tokenizer, source, destination, chunk_lines=2, streamer=None, synced_gpus=False)
    assert sizes == [2, 2], "resumed after the chunk done"
    assert destination.read_text() == "".join(line.strip() + "\n" for line in lines)


@pytest.mark.parametrize("given_to", ["the killed run", "the rerun"])
def test_a_rerun_naming_the_generation_configs_own_beam_count_resumes(
    given_to, file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """`--num-beams 4` added (or left out) on resuming a model whose generation config says 4: the same decoding,
    which was started over as "another decoding", the chunks done thrown away."""
    source, lines, model, _ = file_to_translate
    destination = tmp_path / "news.de"
    beams = {"num_beams": model.generation_config.num_beams}
    killed, rerun = (beams, {}) if given_to == "the killed run" else ({}, beams)
    counting_translate(monkeypatch, interrupt_at=2)
    with pytest.raises(Interrupt):
        translate_file(model, tokenizer, source, destination, chunk_lines=3, max_new_tokens=5, **killed)
    sizes = counting_translate(monkeypatch)
    translate_file(model, tokenizer, source, destination, chunk_lines=3, max_new_tokens=5, **rerun)
    assert sizes == [3, 3], "resumed after the two chunks done"
    assert destination.read_text().split("\n")[:-1] == translate(model, tokenizer, lines, max_new_tokens=5)


def test_a_translation_started_over_for_another_text_resumes_after_a_second_kill(
    file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """The record of the text started over vouches for its own lines only: killed again, it goes on from there."""
    source, lines, model, expected = file_to_translate
    text, destination = tmp_path / "news.en", tmp_path / "news.de"
    text.write_text(source.read_text())
    counting_translate(monkeypatch, interrupt_at=2)
    with pytest.raises(Interrupt):
        translate_file(model, tokenizer, text, destination, chunk_lines=3, **SETTINGS)
    text.write_text("".join(line + "\n" for line in ["a red ball.", *lines[1:]]))  # another text now
    sizes = counting_translate(monkeypatch, interrupt_at=1)
    with pytest.raises(Interrupt):
        translate_file(model, tokenizer, text, destination, chunk_lines=3, **SETTINGS)
    assert sizes == [3], "started over"
    sizes = counting_translate(monkeypatch)
    assert translate_file(model, tokenizer, text, destination, chunk_lines=3, **SETTINGS) == len(lines)
    assert sizes == [3, 3, 3], "resumed after the 3 lines of the text started over"
    now = [translate(model, tokenizer, ["a red ball."], **SETTINGS)[0], *expected[1:]]
    assert destination.read_text().split("\n")[:-1] == now


def test_each_chunk_is_in_the_file_before_the_record_vouches_for_it(
    file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """Left in Python's buffer, a chunk the record counts is lost to a kill (SIGKILL, a node lost): the resumption
    finds the file shorter than its record and starts over."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    sizes, write_json = [], translation.write_json

    def recording(path, record):
        sizes.append((partial_translation_path(destination).stat().st_size, record["bytes"]))
        write_json(path, record)

    monkeypatch.setattr(translation, "write_json", recording)
    translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert len(sizes) == 4 and all(in_the_file == recorded for in_the_file, recorded in sizes)


def killed_translation(
    file_to_translate, tokenizer, destination, monkeypatch, *, chunk_lines: int = 3, chunks: int = 2
) -> Path:
    """The partial translation a `translate_file` into `destination` killed after `chunks` chunks leaves."""
    source, _, model, _ = file_to_translate
    counting_translate(monkeypatch, interrupt_at=chunks)
    with pytest.raises(Interrupt):
        translate_file(model, tokenizer, source, destination, chunk_lines=chunk_lines, **SETTINGS)
    return partial_translation_path(destination)


def test_another_users_partial_translation_is_refused_while_it_runs_and_resumed_once_killed(
    file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """A colleague's translation into a directory a group shares leaves its partial file 0644 (umask 022), which
    this user cannot append to: both a second translation beside theirs and the resumption of theirs, killed,
    were `Permission denied`."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    partial = killed_translation(file_to_translate, tokenizer, destination, monkeypatch)
    theirs = partial.stat().st_ino

    def as_another_user(file, mode="r", *args, **kwargs):  # tests run as root, whom no permission stops
        if Path(file) == partial and mode != "rb" and partial.stat().st_ino == theirs:
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(translation, "open", as_another_user, raising=False)
    with open(partial, "ab") as their_translation:  # theirs, still running
        fcntl.flock(their_translation.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(TranslationInProgressError, match="^another process is translating into "):
            translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    sizes = counting_translate(monkeypatch)
    assert translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS) == len(lines)
    assert sizes == [3, 3], "their 6 lines kept"
    assert destination.read_text().split("\n")[:-1] == expected
    assert sorted(path.name for path in tmp_path.iterdir()) == ["news.de"]


def test_another_users_partial_translation_in_a_sticky_directory_is_refused_in_one_line(
    file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """A colleague's killed translation in a directory with the sticky bit: their partial file can be neither
    appended to nor replaced by this user's copy. The copy's rename failed, naming its temporary file."""
    source, _, model, _ = file_to_translate
    destination = tmp_path / "news.de"
    partial = killed_translation(file_to_translate, tokenizer, destination, monkeypatch)
    theirs = partial.read_bytes()

    def as_another_user(file, mode="r", *args, **kwargs):  # tests run as root, whom no permission stops
        if Path(file) == partial and mode != "rb":
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return open(file, mode, *args, **kwargs)

    replace = os.replace

    def sticky(source, target):
        if Path(target) == partial:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(source), None, str(target))
        replace(source, target)

    monkeypatch.setattr(translation, "open", as_another_user, raising=False)
    monkeypatch.setattr(os, "replace", sticky)
    counting_translate(monkeypatch)
    with pytest.raises(UnwritableError) as refused:
        translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert str(refused.value) == (
        f"cannot resume {partial}, another user's partial translation of {destination}: this user may not replace it "
        "(a directory with the sticky bit); have its owner remove it, or translate into another file"
    )
    assert partial.read_bytes() == theirs
    assert sorted(path.name for path in tmp_path.iterdir()) == [partial.name, f"{partial.name}.json"]


@pytest.mark.parametrize("same_text", [True, False], ids=["the same text", "another text"])
def test_a_pipe_is_read_once_from_its_start_and_resumed_if_it_carries_the_same_text(
    same_text, file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """A pipe (`zcat news.gz | translate.py --output-file news.de`) cannot be read again from its start: the lines
    it gives to compare with the record of an earlier run are kept aside, translated if they are another text's.
    A killed piped translation was started over, all it had written lost."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    killed_translation(file_to_translate, tokenizer, destination, monkeypatch)  # a record of the first 6 lines
    piped = lines if same_text else [f"{line} again" for line in lines]
    given = []
    sizes = counting_translate(monkeypatch, given=given)
    # the lines kept aside lie beside the destination, not in TMPDIR (a small tmpfs on many compute nodes)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no TMPDIR"))
    with fed_pipe(tmp_path / "pipe", "".join(line + "\n" for line in piped)) as pipe:
        assert translate_file(model, tokenizer, pipe, destination, chunk_lines=3, **SETTINGS) == len(lines)
    if same_text:
        assert sizes == [3, 3] and given == lines[6:], "only the 6 lines not yet translated"
        assert destination.read_text().split("\n")[:-1] == expected
    else:
        assert given == piped, "every line, from the pipe's first, as it came"
        assert destination.read_text().split("\n")[:-1] == translate(model, tokenizer, piped, **SETTINGS)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["news.de", "pipe"], "nothing left beside"


def test_a_destination_name_too_long_for_the_hidden_record_beside_it_is_refused_before_any_work(
    file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """A name a few characters short of the file system's limit can be written, but not `.NAME.partial.json`'s
    temporary file: the translation failed after its first chunk (10,000 lines by default), and so did each rerun."""
    source, _, model, _ = file_to_translate
    # its own temporary name fits, with 5 characters to spare; the record's, 14 longer, does not
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    destination = tmp_path / ("x" * (name_max - len(f"..tmp-{os.getpid()}-12345678") - 5))
    sizes = counting_translate(monkeypatch)
    with pytest.raises(UnwritableError, match=r"^cannot write .*\.partial\.json: File name too long$"):
        translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert sizes == [], "before any work"


def test_a_destination_that_is_the_source_is_refused(file_to_translate, tokenizer, tmp_path):
    source, lines, model, _ = file_to_translate
    copy = tmp_path / "news.en"
    shutil.copy(source, copy)
    with pytest.raises(OSError, match="the destination .* is the source .*: writing it would destroy it"):
        translate_file(model, tokenizer, copy, tmp_path / "." / "news.en", **SETTINGS)
    assert copy.read_text() == source.read_text()


def test_a_chunk_written_after_the_last_record_is_written_again(file_to_translate, tokenizer, tmp_path, monkeypatch):
    """Killed between appending a chunk and recording it: the partial file holds more than its record says."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    partial = killed_translation(file_to_translate, tokenizer, destination, monkeypatch)
    with open(partial, "a", encoding="utf-8") as handle:
        # written by the earlier rule, which kept line breaks: cut off unread, it cannot make the rest start over
        handle.write("a\n" + "line\rbreak " * 10 + "\n")
        handle.write("a chunk the record does not know, longer than what is left to translate " * 100 + "\n")
    sizes = counting_translate(monkeypatch)
    translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert sizes == [3, 3] and destination.read_text().split("\n")[:-1] == expected


@pytest.mark.parametrize("in_first_line", [True, False], ids=["in the first line", "in the last line"])
def test_a_partial_translation_holding_a_line_break_inside_a_line_is_not_continued(
    file_to_translate, tokenizer, tmp_path, monkeypatch, caplog, in_first_line
):
    """Written before `translate` made "\r", U+2028, ... spaces: resumed, the file mixed lines holding them (which
    `sacrebleu REF < hypotheses` splits) with lines without, the record vouching for the same bytes."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    partial = killed_translation(file_to_translate, tokenizer, destination, monkeypatch)
    written = partial.read_text(encoding="utf-8")
    # as the earlier rule left one: the same bytes
    if in_first_line:
        as_left_before = written.replace(" ", "\r", 1)
    else:
        before, _, after = written.rpartition(" ")
        assert before.count("\n") == written.count("\n") - 1, "the last space is in the last line"
        as_left_before = f"{before}\r{after}"
    assert as_left_before != written
    partial.write_bytes(as_left_before.encode())

    sizes = counting_translate(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="modeling.translation"):
        translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert sum(sizes) == len(lines), "started over"
    assert destination.read_bytes().decode().split("\n")[:-1] == expected
    assert "holds a line break inside a translation" in caplog.text


def test_the_same_text_at_another_path_resumes(file_to_translate, tokenizer, tmp_path, monkeypatch, caplog):
    """A requeued job that sees its data elsewhere (another mount, a copy, gzipped): the lines decide, not the path."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    killed_translation(file_to_translate, tokenizer, destination, monkeypatch)
    elsewhere = tmp_path / "mounted elsewhere" / "news.en.gz"
    elsewhere.parent.mkdir()
    with gzip.open(elsewhere, "wt", encoding="utf-8") as handle:
        handle.write(source.read_text(encoding="utf-8"))
    sizes = counting_translate(monkeypatch)
    with caplog.at_level(logging.INFO, logger="modeling.translation"):
        translate_file(model, tokenizer, elsewhere, destination, chunk_lines=3, **SETTINGS)
    assert sum(sizes) == len(lines) - 6, "the two chunks done are not translated again"
    assert "Resuming the translation" in caplog.text
    assert destination.read_text().split("\n")[:-1] == expected


@pytest.mark.parametrize(
    "change",
    [
        "source",
        "model",
        "config",
        "decoding",
        "tokenizer",
        "cut record",
        "record without its hash",
        "cut partial",
        "more lines than bytes",
    ],
)
def test_a_partial_translation_of_another_text_model_or_decoding_is_never_continued(
    change, file_to_translate, tokenizer, tmp_path, monkeypatch, caplog
):
    source, lines, model, expected = file_to_translate
    text = tmp_path / "news.en"
    text.write_text(source.read_text())
    destination = tmp_path / "news.de"
    counting_translate(monkeypatch, interrupt_at=2)
    with pytest.raises(Interrupt):
        translate_file(model, tokenizer, text, destination, chunk_lines=3, **SETTINGS)

    settings, now = dict(SETTINGS), expected
    if change == "source":  # the first line, already translated, is another one now
        text.write_text("".join(line + "\n" for line in ["a red ball.", *lines[1:]]))
        now = [translate(model, tokenizer, ["a red ball."], **SETTINGS)[0], *expected[1:]]
    elif change == "model":
        model = tiny_translator(len(tokenizer), seed=1)
        now = translate(model, tokenizer, lines, **SETTINGS)
    elif change == "config":  # the same weights, their config.json edited: another function of the source
        model = reloaded_with_config(model, tmp_path / "model", scale_embedding=False)
        now = translate(model, tokenizer, lines, **SETTINGS)
        assert now != expected, "a config change the translations do not show tests nothing"
    elif change == "decoding":
        settings["num_beams"] = 3
        now = translate(model, tokenizer, lines, **settings)
    elif change == "tokenizer":  # reads "</s>" in text as the control token: other ids for such a line
        tokenizer = tiny_tokenizer()
        tokenizer.split_special_tokens = False
    elif change == "cut record":
        (tmp_path / f".{destination.name}.partial.json").write_text("{cut sh")
    elif change == "cut partial":  # a copy of the partial file cut short: the record vouches for more than it holds
        partial = partial_translation_path(destination)
        partial.write_bytes(partial.read_bytes()[:-3])
    elif change == "more lines than bytes":  # a record edited or damaged: each line translated is one "\n" at least
        record = tmp_path / f".{destination.name}.partial.json"
        record.write_text(json.dumps({**json.loads(record.read_text()), "bytes": 0}))
    else:
        record = tmp_path / f".{destination.name}.partial.json"
        fields = json.loads(record.read_text())
        del fields["source_sha256"]
        record.write_text(json.dumps(fields))
    sizes = counting_translate(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="modeling.translation"):
        translate_file(model, tokenizer, text, destination, chunk_lines=3, **settings)
    assert sum(sizes) == len(lines), "started over"
    assert destination.read_text().split("\n")[:-1] == now
    expected_reason = {"source": "another text", "model": "(another model)", "decoding": "(another decoding)"}
    expected_reason["config"] = "(another config)"
    expected_reason["tokenizer"] = "(another tokenizer)"
    expected_reason["cut partial"] = "shorter than its record says"
    expected_reason["more lines than bytes"] = "counts 6 lines in 0 bytes"
    assert expected_reason.get(change, "unreadable") in caplog.text


@pytest.mark.parametrize(
    ("code", "strerror", "refusal"),
    [(errno.ENOSPC, "No space left on device", DiskFullError), (errno.EIO, "Input/output error", UnwritableError)],
)
def test_a_failed_write_is_one_line_naming_the_destination_and_the_rerun_goes_on_from_the_chunks_kept(
    code, strerror, refusal, file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """A full disk, or an NFS server's EIO on the partial file hours in: the EIO was "[Errno 5] Input/output error",
    naming no file."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    destination.write_text("an earlier translation\n")
    real_fsync, calls = os.fsync, []

    def failing_at_the_third_chunk(fd):
        calls.append(fd)
        if len(calls) == 7:  # each chunk: the partial file, then its record and the record's directory
            raise OSError(code, strerror)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_at_the_third_chunk)
    with pytest.raises(refusal, match=rf"^{strerror} while writing {destination}"):
        translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert destination.read_text() == "an earlier translation\n"
    monkeypatch.setattr(os, "fsync", real_fsync)
    sizes = counting_translate(monkeypatch)
    translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert destination.read_text().split("\n")[:-1] == expected and sizes == [3, 3], "not the chunks written before"


def test_a_tokenizer_is_known_by_its_definition_wherever_it_lies(tmp_path, tokenizer):
    """Fast tokenizers by their JSON; fairseq's (a Python tokenizer) by vocabulary, arguments and file contents."""
    assert tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(tiny_tokenizer())
    assert tokenizer_fingerprint(tokenizer) != tokenizer_fingerprint(word_tokenizer())
    reading_tags = tiny_tokenizer()
    reading_tags.split_special_tokens = False  # "</s>" in text as the control token: other ids for such a line
    assert tokenizer_fingerprint(reading_tags) != tokenizer_fingerprint(tokenizer)
    _, fairseq_tokenizer = convert_fairseq_fixture("transformer_wmt_en_de")
    fairseq_tokenizer.save_pretrained(tmp_path / "here")
    shutil.copytree(tmp_path / "here", tmp_path / "there")
    here, there = (AutoTokenizer.from_pretrained(tmp_path / name) for name in ("here", "there"))
    assert tokenizer_fingerprint(here) == tokenizer_fingerprint(there)
    offline = AutoTokenizer.from_pretrained(tmp_path / "here", local_files_only=True)  # as HF_HUB_OFFLINE=1 loads
    assert tokenizer_fingerprint(offline) == tokenizer_fingerprint(here)
    reordered = copy.deepcopy(here)  # as another way of loading it may order them
    reordered.init_kwargs = dict(reversed(here.init_kwargs.items()))
    assert tokenizer_fingerprint(reordered) == tokenizer_fingerprint(here), "the arguments' order is none of it"
    with open(tmp_path / "there" / "merges.txt", "a", encoding="utf-8") as handle:
        handle.write("x y\n")
    assert tokenizer_fingerprint(here) != tokenizer_fingerprint(AutoTokenizer.from_pretrained(tmp_path / "there"))


def test_a_second_translation_into_the_same_file_is_refused_while_the_first_runs(
    file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """A job requeued while the first still runs: its chunks must not interleave with the first one's."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    refusals = []

    def a_second_run_starts_meanwhile(model, tokenizer, sentences, **kwargs):
        if not refusals:
            with pytest.raises(TranslationInProgressError) as error:
                translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
            refusals.append(str(error.value))
        return translate(model, tokenizer, sentences, **kwargs)

    monkeypatch.setattr(translation, "translate", a_second_run_starts_meanwhile)
    translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert refusals == [
        f"another process is translating into {destination} (it holds {partial_translation_path(destination)}): "
        "wait for it or stop it"
    ]
    assert destination.read_text().split("\n")[:-1] == expected, "the first run's translation, whole"


def test_a_translation_finishing_as_a_second_one_opens_its_file_is_left_as_it_wrote_it(
    file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """The second run opened the partial file, the first renamed it into place and let go of it, the second locked
    it: before, the second truncated the first's finished output and wrote its own into it."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"
    lock = translation.fcntl.flock

    def the_first_run_finishes_between_open_and_lock(fd, operation):
        monkeypatch.setattr(translation.fcntl, "flock", lock)
        translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
        return lock(fd, operation)

    monkeypatch.setattr(translation.fcntl, "flock", the_first_run_finishes_between_open_and_lock)
    other_source = tmp_path / "other.en"
    other_source.write_text("a small dog\n")
    with pytest.raises(TranslationInProgressError) as error:
        translate_file(model, tokenizer, other_source, destination, chunk_lines=3, **SETTINGS)
    assert str(error.value).startswith(f"another process finished translating into {destination} as this one")
    assert destination.read_text().split("\n")[:-1] == expected, "the first run's translation, whole"


def test_a_file_system_without_locks_still_translates_saying_what_it_cannot_guard(
    file_to_translate, tokenizer, tmp_path, monkeypatch, caplog
):
    source, lines, model, expected = file_to_translate

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(translation.fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="modeling.translation"):
        translate_file(model, tokenizer, source, tmp_path / "news.de", chunk_lines=5, **SETTINGS)
    assert (tmp_path / "news.de").read_text().split("\n")[:-1] == expected
    assert "No locks available" in caplog.text and "is refused only once it writes into the same file" in caplog.text


def test_a_second_run_where_the_file_system_gives_no_locks_leaves_no_mix_of_both_runs(
    file_to_translate, tokenizer, tmp_path, monkeypatch
):
    """A job requeued while the first still runs, on NFS without locks: the second resumed the first's chunks and
    finished; the first appended its next chunks to the file, by then the output, which held 18 lines for 12."""
    source, lines, model, expected = file_to_translate
    destination = tmp_path / "news.de"

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    def a_second_run_starts_and_ends_meanwhile(model, tokenizer, sentences, **kwargs):
        if sentences == lines[6:9]:
            monkeypatch.setattr(translation, "translate", translate)
            translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
        return translate(model, tokenizer, sentences, **kwargs)

    monkeypatch.setattr(translation.fcntl, "flock", no_locks)
    monkeypatch.setattr(translation, "translate", a_second_run_starts_and_ends_meanwhile)
    with pytest.raises(TranslationInProgressError) as error:
        translate_file(model, tokenizer, source, destination, chunk_lines=3, **SETTINGS)
    assert str(error.value) == (
        f"another process wrote into {partial_translation_path(destination)} while this one translated into "
        f"{destination} (two runs at once where the file system gives no locks): stop it, then run this command again"
    )
    assert destination.read_text().split("\n")[:-1] == expected, "the second run's translation, whole"


def test_an_empty_file_translates_into_an_empty_file(tokenizer, tmp_path):
    (tmp_path / "empty.en").write_text("")
    model = tiny_translator(len(tokenizer))
    assert translate_file(model, tokenizer, tmp_path / "empty.en", tmp_path / "empty.de") == 0
    assert (tmp_path / "empty.de").read_text() == ""
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty.de", "empty.en"]


def test_an_int8_model_translates_into_a_file_known_from_its_float_original(file_to_translate, tokenizer, tmp_path):
    # Its state dict holds packed int8 weights as tuples and dtypes, not tensors: the fingerprint leaves them out.
    source, lines, model, _ = file_to_translate
    int8 = quantize_int8(model)
    assert model_fingerprint(int8) == model_fingerprint(quantize_int8(model)) != model_fingerprint(model)
    destination = tmp_path / "news.de"
    assert translate_file(int8, tokenizer, source, destination, **SETTINGS) == len(lines)
    # one chunk, so the same batches: int8 activations are scaled by each batch's range, so batching changes them
    assert destination.read_text().split("\n")[:-1] == translate(int8, tokenizer, lines, **SETTINGS)


def test_a_model_directorys_own_files_are_named_and_a_translation_beside_them_is_not(tmp_path):
    own = ["README.md", "config.json", "model.safetensors", "modeling_custom.py", "pytorch_model.bin"]
    own += ["source.spm", "spm.model"]  # sentencepiece models of a converted tokenizer
    for name in [*own, "test.de", "notes.txt"]:
        (tmp_path / name).write_text("x")
    (tmp_path / "runs").mkdir()
    assert model_files(tmp_path) == {f"the model's {name}": tmp_path / name for name in own}
    assert model_files(str(tmp_path)) == model_files(tmp_path)
    # a Hub id or a path that is no directory holds none of them: an empty mapping, which a caller spreads as it is
    assert model_files("owner/name") == {} and model_files(tmp_path / "test.de") == {}
    assert partial_translation_path(str(tmp_path / "news.de")) == tmp_path / ".news.de.partial"
