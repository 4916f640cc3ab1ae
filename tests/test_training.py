"""Tests of modeling/training.py: `train()` end to end, learning, fine-tuning, and what a run records."""

import copy
import dataclasses
import errno
import fcntl
import importlib.util
import io
import json
import logging
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy
import pytest
import torch
import transformers
from helpers import (
    HUB_TOKEN,
    WORDS,
    convert_fairseq_fixture,
    copy_dataset,
    hub_cache_snapshot,
    losses,
    make_trainer,
    push_translation_dataset,
    save_tiny_checkpoint,
    seeded_marian,
    subprocess_env,
    synthetic_pairs,
    tiny_config,
    tiny_model,
    tiny_translator,
    training_args,
    training_run_holding,
    word_for_word,
    word_level_tokenizer,
    word_tokenizer,
    write_corpus,
)
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

import modeling.files as files_module
import modeling.hub as hub_module
from modeling import TransformerConfig, TransformerForConditionalGeneration, training
from modeling.arguments import DataArguments, ModelArguments, TranslationTrainingArguments
from modeling.averaging import AVERAGING_RECORD_NAME, last_checkpoints
from modeling.checkpoints import (
    CONVERSION_FILE,
    RUN_IDENTITY_FILE,
    IncompleteCheckpointError,
    RunMismatchError,
    identity_differences,
    model_card_files,
    read_run_identity,
    write_completeness_marker,
)
from modeling.files import DiskFullError, UnwritableError, write_json
from modeling.generation_transformer import FAIRSEQ_DECODING_FIELDS
from modeling.hub_client import HubError, pinned_commit
from modeling.model_card import write_model_card
from modeling.presets import get_preset
from modeling.tokenization import train_shared_bpe
from modeling.trainer import TokenBudgetSeq2SeqTrainer
from modeling.training import (
    TRAINING_LOCK_FILE,
    OutputDirectoryInUseError,
    TrainingPreempted,
    _check_earlier_bpe,
    _conversion_record,
    _earlier_run_paths,
    _model,
    _without_hub_push,
    _write_run_records,
    check_fine_tuning_source,
    prepare_output_dir,
    train,
)
from modeling.translation import load_model_and_tokenizer, model_fingerprint, tokenizer_fingerprint, translate


def test_tiny_preset_loss_falls_over_50_steps(tmp_path):
    preset = get_preset("tiny")
    tokenizer = word_tokenizer()
    vocab_size = len(tokenizer)
    torch.manual_seed(0)
    shrunk = {"d_model": 64, "encoder_layers": 1, "decoder_layers": 1, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128}
    model = TransformerForConditionalGeneration(preset.model_config(vocab_size, **shrunk))
    defaults = preset.training_defaults() | {
        "output_dir": str(tmp_path),
        "max_steps": 50,
        "warmup_steps": 25,  # the preset's warmup, shrunk with the run
        "max_tokens_per_device": 128,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "logging_steps": 1,
    }
    lengths = random.Random(4).choices(range(4, 9), k=200)
    args = TranslationTrainingArguments(**defaults)
    trainer = make_trainer(args, copy_dataset(lengths, vocab_size), tokenizer, model)
    trainer.train()
    curve = list(losses(trainer.state.log_history).values())
    assert len(curve) == 50
    assert sum(curve[-5:]) / 5 < 0.75 * sum(curve[:5]) / 5, curve


def test_fine_tuning_starts_from_the_saved_model(tmp_path):
    tokenizer = word_tokenizer()
    pretrained = tmp_path / "pretrained"
    tiny_model(len(tokenizer), dropout=0.0).save_pretrained(pretrained)
    tokenizer.save_pretrained(pretrained)
    # A different corpus: German words in reverse order.
    data_dir = write_corpus(tmp_path / "reversed", 100, lambda words: word_for_word(reversed(words)), seed=5)

    output_dir = train(
        ModelArguments(preset="tiny", model_name_or_path=str(pretrained), dropout=0.0),
        DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de"),
        training_args(
            tmp_path / "fine-tuned", max_steps=20, warmup_steps=5, learning_rate=0.2, max_tokens_per_device=128
        ),
    )
    state = json.loads((Path(output_dir) / "trainer_state.json").read_text())
    curve = list(losses(state["log_history"]).values())
    assert sum(curve[-5:]) / 5 < 0.8 * curve[0], curve
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    assert model.config.d_model == 32, "the saved model's architecture, not the preset's"
    assert AutoTokenizer.from_pretrained(output_dir).get_vocab() == tokenizer.get_vocab()


def test_fine_tuning_a_model_directory_without_its_tokenizer_is_refused_before_the_data_is_read(tmp_path):
    """Before, transformers' "arg `langs` needs to be a list of 2 langs" (another tokenizer class's), once the
    training text had been read and cleaned (minutes on WMT)."""
    weights_only = tmp_path / "weights_only"
    tiny_model(len(word_tokenizer())).save_pretrained(weights_only)
    with pytest.raises(ValueError) as refused:
        check_fine_tuning_source(ModelArguments(model_name_or_path=str(weights_only)))
    assert str(refused.value) == (
        f"Cannot fine-tune {weights_only}: it holds no tokenizer (tokenizer.json or tokenizer_config.json); give the "
        "model's tokenizer with --tokenizer_name_or_path"
    )
    word_tokenizer().save_pretrained(tmp_path / "tokenizer")
    given = ModelArguments(model_name_or_path=str(weights_only), tokenizer_name_or_path=str(tmp_path / "tokenizer"))
    assert check_fine_tuning_source(given) == TransformerConfig.model_type


def saved_tiny_model(directory: Path) -> Path:
    """A tiny model and its word tokenizer saved into `directory`, as a model to fine-tune."""
    tiny_model(len(word_tokenizer())).save_pretrained(directory)
    word_tokenizer().save_pretrained(directory)
    return directory


@pytest.mark.parametrize("lost", ["tokenizer.json", "tokenizer_config.json"])
def test_fine_tuning_a_model_directory_whose_tokenizer_lacks_a_file_names_it_before_the_data_is_read(lost, tmp_path):
    """Before, once the training text had been read: "You need to have sentencepiece or tiktoken installed" without
    tokenizer.json, and another tokenizer class's "arg `langs` needs to be a list of 2 langs" without
    tokenizer_config.json."""
    pretrained = saved_tiny_model(tmp_path / "pretrained")
    (pretrained / lost).unlink()
    with pytest.raises(ValueError) as refused:
        check_fine_tuning_source(ModelArguments(model_name_or_path=str(pretrained)))
    assert str(refused.value) == (
        f"Cannot fine-tune {pretrained}: it holds a tokenizer without {lost}; copy the model directory whole, or give "
        "the model's tokenizer with --tokenizer_name_or_path"
    )


def test_fine_tuning_a_model_directory_with_cut_short_weights_is_refused_before_the_data_is_read(tmp_path):
    """Before: safetensors' traceback, "Error while deserializing header: header too small", after the data."""
    pretrained = saved_tiny_model(tmp_path / "pretrained")
    (pretrained / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError) as refused:
        check_fine_tuning_source(ModelArguments(model_name_or_path=str(pretrained)))
    assert str(refused.value) == (
        f"Cannot fine-tune {pretrained}: its weights are incomplete: model.safetensors is truncated (0 bytes, not "
        "even a header)"
    )


def test_fine_tuning_a_model_directory_whose_config_does_not_load_is_refused_in_one_line(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{not json")  # a copy cut short, or edited by hand
    with pytest.raises(ValueError, match=rf"^Cannot fine-tune {tmp_path / 'model'}: its config does not load \("):
        check_fine_tuning_source(ModelArguments(model_name_or_path=str(tmp_path / "model")))


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # transformers 5 reads a Hub repo without config.json as {}: its "Unrecognized model ... Should have a
        # `model_type` key" before
        ({"d_model": 8}, "it has no config.json naming a model_type (not a model saved with save_pretrained)"),
        # a type transformers does not know: the first of its ten lines before
        ({"model_type": "a-newer-architecture"}, "it is a 'a-newer-architecture' model; only this project's"),
    ],
)
def test_fine_tuning_a_config_of_no_model_type_or_one_transformers_lacks_is_refused_naming_it(
    tmp_path, config, expected
):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"^{re.escape(f'Cannot fine-tune {model}: {expected}')}"):
        check_fine_tuning_source(ModelArguments(model_name_or_path=str(model)))


@pytest.mark.parametrize("record", [CONVERSION_FILE, RUN_IDENTITY_FILE])
def test_a_conversion_record_of_the_model_fine_tuned_that_does_not_parse_is_named(tmp_path, record):
    """Which fairseq model a fine-tune comes from is read of the model's records: one cut short is named."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / record).write_text('{"fairseq_conversion": ')
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'model' / record))} does not parse \\("):
        _conversion_record(ModelArguments(model_name_or_path=str(tmp_path / "model")))


def test_a_dropout_the_model_refuses_is_refused_before_the_data_is_read_when_fine_tuning(tmp_path):
    """The config refused it as the model loaded, once the training text had been read and cleaned."""
    pretrained = saved_tiny_model(tmp_path / "pretrained")
    nowhere = DataArguments(data_dir=str(tmp_path / "no-data"), source_lang="en", target_lang="de")
    with pytest.raises(
        ValueError, match=r"^dropout must be a probability in \[0, 1\) \(1 drops everything\), got 1.5"
    ):
        train(ModelArguments(model_name_or_path=str(pretrained), dropout=1.5), nowhere, tiny_run_args(tmp_path / "ft"))
    assert not (tmp_path / "ft").exists(), "refused before anything else"


def test_fine_tuning_with_an_extended_tokenizer_grows_the_vocabulary_and_a_foreign_one_is_refused(
    tmp_path, datasets_cache
):
    tokenizer = word_tokenizer()
    pretrained = tmp_path / "pretrained"
    tiny_model(len(tokenizer)).save_pretrained(pretrained)
    tokenizer.save_pretrained(pretrained)
    extended = word_tokenizer()
    extended.add_tokens(["<2de>", "<2fr>"])
    extended.save_pretrained(tmp_path / "extended")
    data = DataArguments(
        data_dir=str(write_corpus(tmp_path / "data", 40, word_for_word)), source_lang="en", target_lang="de"
    )
    fine_tune = ModelArguments(model_name_or_path=str(pretrained), tokenizer_name_or_path=str(tmp_path / "extended"))
    train(fine_tune, data, tiny_run_args(tmp_path / "ft"))
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "ft")
    assert model.config.vocab_size >= len(extended) > len(tokenizer) and model.config.vocab_size % 8 == 0
    assert model.lm_head.weight is model.model.shared.weight, "the three-way tie kept"

    foreign = train_shared_bpe(["the small dog sees a cat", "der kleine Hund sieht eine Katze"], 48, min_frequency=1)
    foreign.save_pretrained(tmp_path / "foreign")
    assert len(foreign) <= len(tokenizer)
    other = ModelArguments(model_name_or_path=str(pretrained), tokenizer_name_or_path=str(tmp_path / "foreign"))
    with pytest.raises(ValueError, match=r"is not the vocabulary .*pretrained was trained with: \d+ of its"):
        train(other, data, tiny_run_args(tmp_path / "refused"))


REPO_ID = "user/tiny"


def write_run_records(
    args: TranslationTrainingArguments,
    data_args: DataArguments | None = None,
    *,
    train_pairs: int = 0,
    max_tokens_limit: int | None = None,
    model_args: ModelArguments | None = None,
    **kwargs,
) -> None:
    """`_write_run_records` of a run by a trainer of `args` (a 64-token vocabulary; of a tiny preset unless
    `model_args` say), into its output_dir; `max_tokens_limit`: the batch size given, where tokens_per_update made
    `args`' smaller."""
    limit = args.max_tokens_per_device if max_tokens_limit is None else max_tokens_limit
    trainer = SimpleNamespace(args=args, processing_class=[None] * 64, max_tokens_limit=limit)
    data_args = data_args or DataArguments(data_dir="d")
    model_args = model_args or ModelArguments(preset="tiny")
    _write_run_records(trainer, model_args, data_args, {"train": [None] * train_pairs}, {}, {}, **kwargs)


def test_a_hub_token_argument_stays_out_of_records_and_checkpoints(tmp_path):
    """`--hub_token` puts the token in the arguments: training_args.json masks it, the Trainer never gets it."""
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path), push_to_hub=True, hub_token=HUB_TOKEN, report_to="none", use_cpu=True
    )
    trainer_args = _without_hub_push(args)
    assert (trainer_args.push_to_hub, trainer_args.hub_token) == (False, None)
    assert (args.push_to_hub, args.hub_token) == (True, HUB_TOKEN), "the caller's arguments stay as given"
    saved = io.BytesIO()
    torch.save(trainer_args, saved)  # what the Trainer writes as training_args.bin, in every checkpoint too
    assert HUB_TOKEN.encode() not in saved.getvalue()
    assert HUB_TOKEN not in str(args)

    # the token-holding original: to_dict masks
    write_run_records(args, train_pairs=3, hub_model_id=REPO_ID)
    text = (tmp_path / "training_args.json").read_text()
    assert HUB_TOKEN not in text
    records = json.loads(text)
    assert (records["hub_token"], records["push_to_hub"], records["hub_model_id"]) == ("<HUB_TOKEN>", True, REPO_ID)
    assert "max_tokens_per_device_given" not in records


def test_the_trainer_never_pushes_on_its_own_with_the_token_of_the_environment(tmp_path):
    """--push_to_hub without --hub_token (the token from HF_TOKEN or `hf auth login`): the Trainer's copy does not
    push either (its card has no translation task and drops BLEU); this run pushes at the end."""
    args = TranslationTrainingArguments(output_dir=str(tmp_path), push_to_hub=True, report_to="none", use_cpu=True)
    assert (_without_hub_push(args).push_to_hub, args.push_to_hub) == (False, True)


def test_the_records_keep_the_batch_size_given_where_tokens_per_update_made_batches_smaller(tmp_path):
    given = TranslationTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    derived = dataclasses.replace(given, max_tokens_per_device=3323)
    write_run_records(derived, max_tokens_limit=4096)
    records = json.loads((tmp_path / "training_args.json").read_text())
    assert (records["max_tokens_per_device"], records["max_tokens_per_device_given"]) == (3323, 4096)


def test_the_records_name_the_library_versions_that_made_the_weights(tmp_path):
    """The same seed gives other weights under another torch (initialisation, kernels), numpy (the data order)
    or tokenizers (the BPE): a reviewer reproducing a run needs them."""
    write_run_records(TranslationTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True))
    versions = json.loads((tmp_path / "training_args.json").read_text())["library_versions"]
    assert (versions["torch"], versions["transformers"]) == (torch.__version__, transformers.__version__)
    assert (versions["numpy"], versions["python"]) == (numpy.__version__, platform.python_version())
    records = json.loads((tmp_path / "training_args.json").read_text())
    assert (records["preset"], records["model_name_or_path"], records["world_size"]) == ("tiny", None, 1)
    assert "model_revision" not in records and "base_model" not in records


def test_the_records_of_a_fine_tuned_hub_model_name_it_and_the_revision_given(tmp_path):
    """The card's model tree link (`base_model`), and the version of the repo a reviewer reproducing the run
    fine-tunes again."""
    fine_tuning = ModelArguments(model_name_or_path="owner/base", model_revision="v1")
    write_run_records(
        TranslationTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True), model_args=fine_tuning
    )
    records = json.loads((tmp_path / "training_args.json").read_text())
    assert records["model_name_or_path"] == records["base_model"] == "owner/base"
    assert records["model_revision"] == "v1"


# --- long runs: one output directory, one run -----------------------------------------------------------------


def tiny_run_args(output_dir: Path, **overrides) -> TranslationTrainingArguments:
    settings = {"max_steps": 2, "warmup_steps": 1, "max_tokens_per_device": 128, "save_strategy": "steps"}
    settings["predict_with_generate"] = True  # as the presets: an evaluation scores BLEU on a sample
    return training_args(output_dir, **{"save_steps": 2, **settings, **overrides})


TINY = {"d_model": 32, "num_layers": 1, "num_heads": 2, "ffn_dim": 64}


def draws() -> tuple[float, float, float]:
    return random.random(), numpy.random.random(), torch.rand(1).item()


def test_a_run_leaves_the_callers_random_generators_as_they_were(tmp_path, datasets_cache):
    """A run seeds Python's, NumPy's and torch's global generators (`set_seed`, then the Trainer again): a notebook
    drew the same numbers after every `train()` whatever it had seeded (here, seed 0's first: 0.8444218515250481
    from `random.random()`)."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    random.seed(999), numpy.random.seed(999), torch.manual_seed(999)
    expected = draws()
    random.seed(999), numpy.random.seed(999), torch.manual_seed(999)
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(tmp_path / "run", max_steps=1, save_steps=1))
    assert draws() == expected


def test_cudas_random_generators_are_put_back_where_cuda_was_started_before_the_run(monkeypatch):
    """A run seeds every device's generator too (`set_seed`): a notebook's later draws on the GPU repeated."""
    restored = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["the caller's states"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    with training._callers_random_state():
        pass
    assert restored == [["the caller's states"]]


def test_a_run_with_full_determinism_leaves_the_callers_settings_as_they_were(tmp_path, datasets_cache, monkeypatch):
    """`full_determinism` (transformers' `enable_full_determinism`) switched torch's deterministic algorithms on and
    set CUDA_LAUNCH_BLOCKING=1 and four other variables, for the rest of the caller's process: a notebook's later
    work raised on every operation without a deterministic implementation."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # the caller's own
    for name in (
        "CUDA_LAUNCH_BLOCKING",
        "ASCEND_LAUNCH_BLOCKING",
        "HCCL_DETERMINISTIC",
        "FLASH_ATTENTION_DETERMINISTIC",
    ):
        monkeypatch.delenv(name, raising=False)
    environment = dict(os.environ)
    benchmark = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        assert not torch.are_deterministic_algorithms_enabled()
        run_args = tiny_run_args(tmp_path / "run", max_steps=1, save_steps=1, full_determinism=True)
        train(ModelArguments(preset="tiny", **TINY), data, run_args)
        assert not torch.are_deterministic_algorithms_enabled()
        assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == (False, True)
        assert dict(os.environ) == environment
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, benchmark


@pytest.mark.parametrize("warn_only", [True, False])
def test_a_callers_deterministic_algorithms_are_put_back_raising_or_only_warning_as_they_were(warn_only):
    """A notebook that asked torch to warn of nondeterministic operations, not to raise: `full_determinism` makes
    them raise, and the run put back "deterministic" without "warn only", so that its later work raised. One that
    asked torch to raise keeps them raising."""
    try:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        with training._callers_determinism():
            torch.use_deterministic_algorithms(True)  # what full_determinism sets
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled() == warn_only
    finally:
        torch.use_deterministic_algorithms(False)


def test_one_output_directory_holds_one_run(tmp_path, datasets_cache, caplog):
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    model_args = ModelArguments(preset="tiny", **TINY)
    run = tmp_path / "run"
    train(model_args, data, tiny_run_args(run))
    identity = json.loads((run / "run_identity.json").read_text())
    assert identity["config"]["d_model"] == 32 and identity["data"]["files"][0]["name"] == "train.de"
    assert json.loads((run / "checkpoint-2" / "run_identity.json").read_text()) == identity, "in every checkpoint"
    assert not (run / "preempted.json").exists()
    # Everything the run wrote is what --overwrite_output_dir removes (or refuses to), its lock aside.
    assert set(run.iterdir()) - set(training._earlier_run_paths(run)) == {run / TRAINING_LOCK_FILE}

    with pytest.raises(OutputDirectoryInUseError, match="--resume_from_checkpoint last.*--overwrite_output_dir"):
        train(model_args, data, tiny_run_args(run))  # a new run: refused before anything is read or written
    with pytest.raises(RunMismatchError, match=r"different run: seed: 0 vs 1"):
        train(model_args, data, tiny_run_args(run, seed=1, resume_from_checkpoint="last"))
    with pytest.raises(RunMismatchError, match=r"different run: data_seed: null vs 1"):  # another data order
        train(model_args, data, tiny_run_args(run, data_seed=1, resume_from_checkpoint="last"))
    with pytest.raises(RunMismatchError, match=r"different run: data\.max_length: 256 vs 50"):
        train(
            model_args,
            DataArguments(**{**vars(data), "max_length": 50}),
            tiny_run_args(run, resume_from_checkpoint="last"),
        )
    other_data = DataArguments(**{**vars(data), "vocab_size": 128})
    contradiction = rf"{run / 'tokenizer.json'} is the BPE of --vocab_size 64 .*--vocab_size 128"
    with pytest.raises(ValueError, match=contradiction):
        train(model_args, other_data, tiny_run_args(run, resume_from_checkpoint="last"))

    with pytest.raises(ValueError, match="not both"):
        tiny_run_args(run, overwrite_output_dir=True, resume_from_checkpoint="last")
    for fresh in ("none", "FALSE", ""):  # what prepare_output_dir reads as a fresh run (refused as both, before)
        assert tiny_run_args(run, overwrite_output_dir=True, resume_from_checkpoint=fresh).overwrite_output_dir
    with caplog.at_level(logging.WARNING, logger="modeling.training"):
        smaller = ModelArguments(preset="tiny", **{**TINY, "d_model": 16})
        train(smaller, data, tiny_run_args(run, overwrite_output_dir=True))
    assert "removed the earlier run's checkpoint-2/" in caplog.text
    assert json.loads((run / "run_identity.json").read_text())["config"]["d_model"] == 16
    assert json.loads((run / "checkpoint-2" / "config.json").read_text())["d_model"] == 16, "started over"


def test_a_resumed_run_saves_the_tokenizer_files_of_the_uninterrupted_run(tmp_path, datasets_cache, caplog):
    """transformers' from_pretrained adds how it loaded a tokenizer (`is_local`, `local_files_only`) to what
    save_pretrained writes: the resumed run's later checkpoints and final model had another tokenizer_config.json."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    model_args = ModelArguments(preset="tiny", **TINY)
    run = tmp_path / "run"
    train(model_args, data, tiny_run_args(run, max_steps=1, save_steps=1))
    with caplog.at_level(logging.INFO):
        train(model_args, data, tiny_run_args(run, max_steps=2, save_steps=1, resume_from_checkpoint="last"))
    assert f"Resuming from {run / 'checkpoint-1'}" in caplog.text  # the log says where the run went on from
    uninterrupted = (run / "checkpoint-1" / "tokenizer_config.json").read_text()
    assert (run / "checkpoint-2" / "tokenizer_config.json").read_text() == uninterrupted
    assert (run / "tokenizer_config.json").read_text() == uninterrupted


def test_with_load_best_model_at_end_the_average_is_of_the_newest_checkpoints_not_of_an_old_best(
    tmp_path, datasets_cache
):
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64, bleu_sample_size=0)
    # The highest validation loss is the best: the first checkpoint stays the best, and rotation keeps it.
    best_is_first = {"eval_strategy": "steps", "eval_steps": 1, "save_steps": 1, "max_steps": 6}
    best_is_first |= {"load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "greater_is_better": True}
    with pytest.raises(ValueError, match="keeps the best checkpoint and only the 2 newest, fewer than .* 3 averages"):
        tiny_run_args(tmp_path / "refused", **best_is_first, save_total_limit=3, average_last_checkpoints=3)
    tracked_only = {**best_is_first, "load_best_model_at_end": False}  # the best is recorded, and kept, all the same
    with pytest.raises(ValueError, match="with metric_for_best_model keeps the best checkpoint and only the 2 newest"):
        tiny_run_args(tmp_path / "refused", **tracked_only, save_total_limit=3, average_last_checkpoints=3)
    run = tmp_path / "run"
    train(
        ModelArguments(preset="tiny", **TINY),
        data,
        tiny_run_args(run, **best_is_first, save_total_limit=4, average_last_checkpoints=3),
    )
    assert sorted(path.name for path in run.glob("checkpoint-*")) == [f"checkpoint-{step}" for step in (1, 4, 5, 6)]
    averaged = json.loads((run / "averaged" / AVERAGING_RECORD_NAME).read_text())["checkpoints"]
    assert [Path(path).name for path in averaged] == ["checkpoint-4", "checkpoint-5", "checkpoint-6"]
    # average_checkpoints.py --last 4 on this run would take the best in place of the deleted checkpoint-3.
    with pytest.raises(ValueError, match="checkpoint-1 is not one of the last 4 saves"):
        last_checkpoints(run, 4)


def test_the_average_leaves_out_a_checkpoint_of_another_run(tmp_path, datasets_cache):
    """A checkpoint among the last whose run identity is another run's is not averaged into this run's model."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, max_steps=4))
    path = run / "checkpoint-2" / "run_identity.json"
    assert '"seed": 0,' in path.read_text()
    path.write_text(path.read_text().replace('"seed": 0,', '"seed": 1,'))  # another run's, of the same size
    args = tiny_run_args(run, max_steps=4, average_last_checkpoints=2, resume_from_checkpoint="last")
    train(ModelArguments(preset="tiny", **TINY), data, args)  # training done: the final save and the average
    averaged = json.loads((run / "averaged" / AVERAGING_RECORD_NAME).read_text())["checkpoints"]
    assert [Path(path).name for path in averaged] == ["checkpoint-4"]


def test_the_preemption_record_says_when_in_iso_8601_with_its_utc_offset(tmp_path):
    """preempted.json's time was "2026-12-05T14:31:59+0100": extended ISO 8601 with a basic offset, which RFC 3339
    parsers (Go's time.RFC3339) and Python before 3.11 (`datetime.fromisoformat`) refuse."""
    training._stop_preempted(training_args(tmp_path), "SIGTERM", 3, None, together=False)
    recorded = json.loads((tmp_path / "preempted.json").read_text())["time"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", recorded), recorded
    assert abs(datetime.now(UTC) - datetime.fromisoformat(recorded)) < timedelta(minutes=1)


def test_a_signal_after_the_last_update_stops_before_the_push_and_the_rerun_trains_nothing(
    tmp_path, datasets_cache, monkeypatch, caplog
):
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    args = tiny_run_args(run, max_steps=4, average_last_checkpoints=2, resume_from_checkpoint="last")
    average = training.average_checkpoints

    def signalled_while_averaging(*arguments, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's notice, after the last update
        return average(*arguments, **kwargs)

    monkeypatch.setattr(training, "average_checkpoints", signalled_while_averaging)
    with pytest.raises(TrainingPreempted, match="at update 4, with the checkpoint .*checkpoint-4") as stopped:
        train(ModelArguments(preset="tiny", **TINY), data, args)
    # What a caller of train() (a notebook, a scheduler's wrapper) reads of it, besides the message.
    assert (stopped.value.signal_name, stopped.value.step, stopped.value.checkpoint) == (
        "SIGTERM",
        4,
        str(run / "checkpoint-4"),
    )
    assert json.loads((run / "preempted.json").read_text())["step"] == 4
    assert (run / "averaged" / AVERAGING_RECORD_NAME).is_file() and (run / "model.safetensors").is_file()
    final = (run / "model.safetensors").read_bytes()

    monkeypatch.setattr(training, "average_checkpoints", average)
    train(ModelArguments(preset="tiny", **TINY), data, args)  # the requeued command: nothing left to train
    assert sorted(path.name for path in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert (run / "model.safetensors").read_bytes() == final, "the same weights, not one update more"
    assert not (run / "preempted.json").exists()

    # Without a checkpoint of the last update there is nothing to resume from: the run finishes instead.
    save_final_model = TokenBudgetSeq2SeqTrainer.save_final_model

    def signalled_while_saving(self, *arguments, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return save_final_model(self, *arguments, **kwargs)

    monkeypatch.setattr(TokenBudgetSeq2SeqTrainer, "save_final_model", signalled_while_saving)
    unsaved = tmp_path / "unsaved"
    with caplog.at_level(logging.WARNING, logger="modeling.training"):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(unsaved, save_strategy="no", max_steps=4))
    assert "Got SIGTERM after the last update, which no checkpoint holds: finishing the run" in caplog.text
    assert (unsaved / "model.safetensors").is_file() and not (unsaved / "preempted.json").exists()


def test_a_signal_during_the_push_stops_it_with_75_and_the_requeue_pushes_again(tmp_path, datasets_cache, monkeypatch):
    """A scheduler's notice while the model uploads (minutes for the big model), training done and checkpointed: the
    default action of SIGTERM ended the run by it (143), which README's requeue loop reports as a failure."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    args = tiny_run_args(run, max_steps=4, resume_from_checkpoint="last", push_to_hub=True, hub_token=HUB_TOKEN)
    monkeypatch.setattr(hub_module, "prepare_push", lambda training_args: hub_module.HubTarget(REPO_ID, HUB_TOKEN))
    pushed = []

    def signalled_while_pushing(target, model_dir, *arguments, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        pushed.append(model_dir)  # the rest of the upload

    monkeypatch.setattr(hub_module, "push_trained_model", signalled_while_pushing)
    with pytest.raises(TrainingPreempted, match="at update 4, with the checkpoint .*checkpoint-4"):
        train(ModelArguments(preset="tiny", **TINY), data, args)
    assert pushed == [], "the push stopped at the signal"
    assert json.loads((run / "preempted.json").read_text())["step"] == 4

    def hub_down(target, model_dir, *rest, **kw):
        raise HubError("POST http://hub/api/repos/create: cannot connect")

    monkeypatch.setattr(hub_module, "push_trained_model", hub_down)
    with pytest.raises(HubError, match="cannot connect"):  # without a signal, the push's own error
        train(ModelArguments(preset="tiny", **TINY), data, args)

    monkeypatch.setattr(
        hub_module, "push_trained_model", lambda target, model_dir, *rest, **kw: pushed.append(model_dir)
    )
    train(ModelArguments(preset="tiny", **TINY), data, args)  # the requeued command: nothing to train, the push
    assert pushed == [run] and not (run / "preempted.json").exists()
    assert sorted(path.name for path in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


def test_a_final_model_the_disk_refused_is_saved_by_the_requeue_and_the_training_metrics_stay(
    tmp_path, datasets_cache, monkeypatch
):
    """The launch that trained wrote its metrics (train_runtime, train_loss) after the final model: a full disk
    there lost them, as the requeue trains nothing and has none."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    args = tiny_run_args(run, resume_from_checkpoint="last")
    save_final_model = TokenBudgetSeq2SeqTrainer.save_final_model

    def refused(self):
        raise DiskFullError(run, 0)

    monkeypatch.setattr(TokenBudgetSeq2SeqTrainer, "save_final_model", refused)
    with pytest.raises(DiskFullError):
        train(ModelArguments(preset="tiny", **TINY), data, args)
    monkeypatch.setattr(TokenBudgetSeq2SeqTrainer, "save_final_model", save_final_model)
    train(ModelArguments(preset="tiny", **TINY), data, args)  # requeued with room: nothing left to train
    assert (run / "model.safetensors").is_file()
    assert json.loads((run / "train_results.json").read_text())["train_runtime"] > 0


def test_a_signal_while_the_data_is_prepared_stops_with_the_update_of_a_checkpoint_of_any_name(
    tmp_path, datasets_cache, monkeypatch
):
    """A checkpoint given by a path not named checkpoint-N (accepted) made this stop a ValueError: exit 1, no
    preempted.json, and README's requeue loop gave up."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, max_steps=4))
    kept = shutil.copytree(run / "checkpoint-2", tmp_path / "kept")
    load_text, tokenised = training._load_text, []

    def signalled_while_loading(*arguments, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return load_text(*arguments, **kwargs)

    monkeypatch.setattr(training, "_load_text", signalled_while_loading)
    monkeypatch.setattr(training, "tokenize_counting_truncations", lambda *arguments, **kwargs: tokenised.append(1))
    with pytest.raises(TrainingPreempted, match=r"at update 2, with the checkpoint .*kept"):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, resume_from_checkpoint=str(kept)))
    assert json.loads((run / "preempted.json").read_text())["step"] == 2
    # At once: the data was still prepared to the end (WMT's tokenisation: longer than a scheduler's grace period).
    assert not tokenised


def test_a_requeue_onto_a_changed_corpus_is_refused_before_reading_it_naming_the_file(
    tmp_path, datasets_cache, monkeypatch
):
    """Refused only after loading and cleaning it (English-French WMT: about 13 minutes), in a message cut at 80
    characters inside the unchanged file's record."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run))
    with open(data_dir / "train.en", "a") as corpus:
        corpus.write("one more line\n")
    with open(data_dir / "train.de", "a") as corpus:
        corpus.write("noch eine zeile\n")
    read = []
    monkeypatch.setattr(training, "_load_text", lambda *arguments, **kwargs: read.append(1))
    with pytest.raises(RunMismatchError, match=r"different run: data\.files: train\.de changed, train\.en changed \("):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, resume_from_checkpoint="last"))
    assert not read


@pytest.mark.parametrize("refused", [{"learning_rate": 2.0, "max_steps": 4}, {"max_steps": 1}])
def test_a_requeue_refused_before_its_first_update_leaves_the_records_of_the_run_as_they_were(
    tmp_path, datasets_cache, refused
):
    """The records were written before the trainer refused the settings: training_args.json then said
    --learning_rate 2 (or --max_steps 1) of a run whose every update was made at 1 (or that holds 2), and so did a
    card pushed from it."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run))
    records = {name: (run / name).read_text() for name in ("training_args.json", "data_stats.json")}
    requeue = tiny_run_args(run, resume_from_checkpoint="last", **refused)
    with pytest.raises(ValueError, match="Cannot resume from .*checkpoint-2"):
        train(ModelArguments(preset="tiny", **TINY), data, requeue)
    assert {name: (run / name).read_text() for name in records} == records


LOST_PROCESS_WORKER = """
import os, sys
from types import SimpleNamespace
import torch, torch.distributed as dist
from modeling.training import lost_process_message
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    os._exit(1)  # as the OOM killer ends a process
try:
    dist.all_reduce(torch.zeros(1))
except RuntimeError as error:
    print(lost_process_message(error, SimpleNamespace(process_index=0, world_size=2, output_dir=sys.argv[1])))
    os._exit(0)
"""


def test_a_process_left_by_another_that_died_says_so_naming_the_checkpoint_to_resume(tmp_path):
    """gloo's "Connection reset by peer", raised in the collective that the survivor was in (a save's agreement, the
    gradients' sum), ended its log in a traceback from deep inside torch.distributed, naming neither the run, nor
    that another process had stopped, nor the checkpoint that the requeue resumes."""
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    write_completeness_marker(run / "checkpoint-2", step=2)
    worker = tmp_path / "worker.py"
    worker.write_text(LOST_PROCESS_WORKER)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(worker), str(run)],
            env=subprocess_env(**env, RANK=str(rank)),
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    survivor = ranks[0].communicate(timeout=120)[0]
    ranks[1].wait(timeout=120)
    assert survivor == (
        f"error: A collective operation of process 0 with the other 1 of the run in {run} failed (the RuntimeError "
        "above), most likely because one of them stopped or hung (its own log says why); the newest complete "
        f"checkpoint is {run / 'checkpoint-2'}, which --resume_from_checkpoint last resumes.\n"
    )
    args = SimpleNamespace(process_index=0, world_size=2, output_dir=str(run))
    assert training.lost_process_message(RuntimeError("CUDA out of memory"), args) is None, "not a collective's"
    assert training.lost_process_message(torch.distributed.DistBackendError("NCCL error"), args) is not None


def test_a_process_that_stops_alone_while_the_data_is_prepared_records_the_preemption(tmp_path, monkeypatch):
    """Under torchrun, a rank still preparing its data stops at once while the main one, done, waits at the next
    collective and then fails: without the record from the rank that stopped, README's requeue loop gave up."""
    monkeypatch.setattr(TranslationTrainingArguments, "should_save", property(lambda self: False))
    preempted = training._stop_preempted(tiny_run_args(tmp_path), "SIGTERM", 0, None, together=False)
    assert isinstance(preempted, TrainingPreempted)
    assert json.loads((tmp_path / "preempted.json").read_text())["signal"] == "SIGTERM"


def test_a_process_that_does_not_save_records_the_preemption_when_signalled_while_the_data_is_prepared(
    tmp_path, datasets_cache, monkeypatch
):
    """The rank of `_stop_preempted`'s test above, stopped by `train()` itself: it stops alone, so it writes the
    record that the main process, waiting at the next collective, never will."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    run.mkdir()
    load_text = training._load_text

    def signalled_while_loading(*arguments, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return load_text(*arguments, **kwargs)

    monkeypatch.setattr(training, "_load_text", signalled_while_loading)
    monkeypatch.setattr(TranslationTrainingArguments, "should_save", property(lambda self: False))
    with pytest.raises(TrainingPreempted, match="at update 0"):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run))
    assert json.loads((run / "preempted.json").read_text())["step"] == 0


def test_a_launch_reads_the_corpus_sha256_once(tmp_path, datasets_cache, monkeypatch):
    """A second pass between saving the BPE and recording the run (English-French: about 15 s) left a window where
    a signal stopped the run with a BPE the requeue would train again to check (20-33 minutes)."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    described, describe = [], training._data_description
    monkeypatch.setattr(training, "_data_description", lambda *args: described.append(1) or describe(*args))
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(tmp_path / "run"))
    assert len(described) == 1


def test_a_second_run_into_a_directory_in_use_is_refused_before_it_deletes_anything(tmp_path, datasets_cache):
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run))
    before = sorted(path.name for path in run.iterdir())
    # The first run, still going (a job requeued while it runs), holding its lock at the path README names (a run of
    # another version locks it too).
    with training_run_holding(run) as holder:
        for args in (tiny_run_args(run, overwrite_output_dir=True), tiny_run_args(run, resume_from_checkpoint="last")):
            with pytest.raises(OutputDirectoryInUseError, match=re.escape(f"another training run ({holder})")):
                train(ModelArguments(preset="tiny", **TINY), data, args)
        assert sorted(path.name for path in run.iterdir()) == before, "nothing deleted or written"
    # Released when the holder ends, and by a run that ends (here in an error) as by one that finishes.
    with pytest.raises(OutputDirectoryInUseError, match="holds an earlier run"):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, max_steps=4, save_steps=3, seed=1))
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, overwrite_output_dir=True))
    with open(run / TRAINING_LOCK_FILE) as after:
        fcntl.flock(after.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
        assert after.read().startswith(f"pid {os.getpid()} on ")


def test_a_process_forked_while_training_does_not_keep_the_directory_locked(tmp_path):
    """A DataLoader worker forked during training shared the lock: kept alive by an interrupted run's traceback (a
    notebook holds the last one), it made the rerun of the cell refuse its own directory, naming its own process."""
    run = tmp_path / "run"
    run.mkdir()
    started, ready = os.pipe()
    with training.training_lock(tiny_run_args(run)):
        child = os.fork()
        if child == 0:  # a worker that outlives the run
            os.write(ready, b"1")  # its fork handlers have run
            time.sleep(30)
            os._exit(0)
        os.read(started, 1)
    os.close(started), os.close(ready)
    try:
        with training.training_lock(tiny_run_args(run)):
            assert (run / TRAINING_LOCK_FILE).read_text().startswith(f"pid {os.getpid()} on ")
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def assert_locked_by_this_process(lock: Path) -> None:
    """The lock file names this process, and no other opening of it can take the lock."""
    assert lock.read_text().startswith(f"pid {os.getpid()} on ")
    with open(lock) as another_run, pytest.raises(BlockingIOError):
        fcntl.flock(another_run.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_another_users_training_lock_names_their_run_and_is_replaced_once_it_ends(tmp_path, monkeypatch):
    """A colleague's run in a directory a group shares left `.training.lock` 0644 (umask 022): opening it to write
    failed, so a second run beside theirs was refused as `Permission denied` (not naming it), and so was a resume
    of their finished run, which the directory let this user write."""
    run = tmp_path / "run"
    run.mkdir()
    lock = run / TRAINING_LOCK_FILE

    def as_another_user(file, mode="r", *args, **kwargs):  # tests run as root, whom no permission stops
        if file == lock and mode != "r" and lock.exists() and lock.read_text().startswith(theirs):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return open(file, mode, *args, **kwargs)

    theirs = "pid 4242 on node-7, since 2026-12-03 09:00:00 +0000\n"
    with open(lock, "a+") as their_run:
        fcntl.flock(their_run.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        their_run.write(theirs)
        their_run.flush()
        monkeypatch.setattr(files_module, "open", as_another_user, raising=False)  # where the lock is opened
        with pytest.raises(OutputDirectoryInUseError, match=r"in use by another training run \(pid 4242 on node-7"):
            with training.training_lock(tiny_run_args(run)):
                pass
        assert lock.read_text() == theirs, "their lock file kept while they run"
    with training.training_lock(tiny_run_args(run)):
        assert_locked_by_this_process(lock)  # theirs replaced by one of this run's own


def their_finished_runs_lock(tmp_path: Path) -> Path:
    """The `.training.lock` another user's finished run left in `tmp_path/run`."""
    run = tmp_path / "run"
    run.mkdir()
    lock = run / TRAINING_LOCK_FILE
    lock.write_text("pid 4242 on node-7, since 2026-12-03 09:00:00 +0000\n")
    return lock


def test_another_users_training_lock_in_a_sticky_directory_is_held_read_only(tmp_path, monkeypatch, caplog):
    """A colleague's finished run in a directory with the sticky bit: their `.training.lock` (0644, umask 022) can
    be neither written nor removed by this user, and the resume was refused as "Operation not permitted" naming
    the lock file, not why."""
    lock = their_finished_runs_lock(tmp_path)
    run, theirs = lock.parent, lock.read_text()
    unlink = Path.unlink

    def as_another_user(file, mode="r", *args, **kwargs):  # tests run as root, whom no permission stops
        if file == lock and mode != "r":
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return open(file, mode, *args, **kwargs)

    def sticky(path, missing_ok=False):
        if path == lock:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(files_module, "open", as_another_user, raising=False)  # where the lock is opened
    monkeypatch.setattr(Path, "unlink", sticky)
    with caplog.at_level(logging.WARNING, logger="modeling.training"):
        with training.training_lock(tiny_run_args(run)):
            assert lock.read_text() == theirs
            with open(lock) as third, pytest.raises(BlockingIOError):
                fcntl.flock(third.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert f"Locking {lock} read-only: another user's, in a sticky directory" in caplog.text


def test_a_lock_file_removed_between_its_opening_and_its_locking_is_not_taken_for_the_lock(tmp_path, monkeypatch):
    """Another user's lock file, removed by a third run taking its place while this one opened it: a lock on the
    removed file guards nothing (the next run creates and locks a file of its own at the path), so the one at the
    path is opened and locked instead."""
    run = tmp_path / "run"
    run.mkdir()
    lock = run / TRAINING_LOCK_FILE
    opened = []
    open_lock_file = training.open_lock_file

    def removed_once_opened(path, mode="a"):
        handle = open_lock_file(path, mode)
        if not opened:
            path.unlink()  # the third run, meanwhile
        opened.append(handle)
        return handle

    monkeypatch.setattr(training, "open_lock_file", removed_once_opened)
    with training.training_lock(tiny_run_args(run)):
        assert len(opened) == 2
        assert_locked_by_this_process(lock)


def test_a_lock_file_removed_before_it_could_be_opened_is_created_afresh_and_taken(tmp_path, monkeypatch):
    """Another user's lock file, unwritable, removed by a third run taking its place between this one's attempt to
    open it for writing and its attempt to open it for reading: the opening fails as absent, and the lock file is
    opened again, this time created by this run."""
    run = tmp_path / "run"
    run.mkdir()
    lock = run / TRAINING_LOCK_FILE
    opened = []
    open_lock_file = training.open_lock_file

    def removed_before_opened(path, mode="a"):
        opened.append(path)
        if len(opened) == 1:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return open_lock_file(path, mode)

    monkeypatch.setattr(training, "open_lock_file", removed_before_opened)
    with training.training_lock(tiny_run_args(run)):
        assert len(opened) == 2
        assert_locked_by_this_process(lock)


def test_another_users_lock_file_removed_by_a_third_run_before_this_one_removes_it_is_replaced(tmp_path, monkeypatch):
    """Another user's finished run's lock file, locked read-only by this run and by a third one at once: the third
    removed it first, and this run's removal found nothing to remove; it goes on to create and lock its own."""
    lock = their_finished_runs_lock(tmp_path)
    run, theirs = lock.parent, lock.read_text()
    unlink = Path.unlink

    def as_another_user(file, mode="r", *args, **kwargs):  # tests run as root, whom no permission stops
        if file == lock and mode != "r" and lock.exists() and lock.read_text() == theirs:
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return open(file, mode, *args, **kwargs)

    def removed_first_by_a_third_run(path, missing_ok=False):
        if path == lock and lock.exists() and lock.read_text() == theirs:
            unlink(path)
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(files_module, "open", as_another_user, raising=False)  # where the lock is opened
    monkeypatch.setattr(Path, "unlink", removed_first_by_a_third_run)
    with training.training_lock(tiny_run_args(run)):
        assert_locked_by_this_process(lock)


def test_overwrite_removes_a_model_card_but_not_a_users_readme(tmp_path):
    (tmp_path / "run_identity.json").write_text("{}")
    (tmp_path / "README.md").write_text("My notes on this run\n")
    assert tmp_path / "README.md" not in _earlier_run_paths(tmp_path)
    (tmp_path / "README.md").write_text("---\nlanguage: [en, de]\n---\n\n# run\n")  # a card, as a push renders it
    assert tmp_path / "README.md" in _earlier_run_paths(tmp_path)
    # A tokenizer saved by a transformers that still writes special_tokens_map.json: the run's too.
    (tmp_path / "special_tokens_map.json").write_text("{}")
    assert tmp_path / "special_tokens_map.json" in _earlier_run_paths(tmp_path)

    # Files named like a fairseq tokenizer's: a user's own, unless the fairseq tokenizer's code says whose they are.
    (tmp_path / "merges.txt").write_text("my merges\n")
    assert tmp_path / "merges.txt" not in _earlier_run_paths(tmp_path)
    (tmp_path / "tokenization_fairseq.py").write_text("# the fine-tuned fairseq model's tokenizer\n")
    assert {tmp_path / "merges.txt", tmp_path / "tokenization_fairseq.py"} <= set(_earlier_run_paths(tmp_path))


def test_a_run_trained_on_removes_the_card_of_its_earlier_final_model_and_keeps_a_users_notes(
    tmp_path, datasets_cache
):
    """A run pushed at its end (its card rendered into output_dir), then resumed with more updates: the card of the
    earlier model ("steps: 2", its loss and curves) stayed beside the new final model, and a push without
    --card-from uploaded it as the card of those weights."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run))
    card = write_model_card(run, repo_id="someone/run")  # as the push at the end of the run renders it
    assert card.read_text().startswith("---\n")
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, max_steps=4, resume_from_checkpoint="last"))
    assert model_card_files(run) == [] and not (run / "README.md").exists()
    notes = run / "README.md"
    notes.write_text("My notes on this run\n")
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, max_steps=6, resume_from_checkpoint="last"))
    assert notes.read_text() == "My notes on this run\n"


def test_an_output_directory_that_cannot_be_written_is_refused_before_the_data_is_read(tmp_path, monkeypatch):
    def not_reached(*args, **kwargs):
        raise AssertionError("the data was read although no checkpoint could be written")

    monkeypatch.setattr(training, "load_parallel_dataset", not_reached)
    (tmp_path / "runs").write_text("")  # a file where the directory should be
    data = DataArguments(data_dir=str(tmp_path), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "runs" / "base"
    with pytest.raises(UnwritableError, match=rf"^cannot write {run / 'run_identity.json'}: .*runs is a file"):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run))


def test_resume_last_without_a_complete_checkpoint_starts_fresh(tmp_path, datasets_cache, caplog):
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    (run / "checkpoint-1").mkdir(parents=True)  # a save killed before this project wrote markers
    with caplog.at_level(logging.INFO):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, resume_from_checkpoint="last"))
    assert "Skipping the incomplete checkpoint" in caplog.text and "starting a fresh run" in caplog.text
    state = json.loads((run / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and sorted(losses(state["log_history"])) == [1, 2]
    explicit = tiny_run_args(run, resume_from_checkpoint=str(run / "checkpoint-1"))
    with pytest.raises(IncompleteCheckpointError, match=r"checkpoint-1 is incomplete: no checkpoint_complete\.json"):
        train(ModelArguments(preset="tiny", **TINY), data, explicit)


def test_a_run_directory_given_as_the_checkpoint_to_resume_is_refused_naming_its_newest_checkpoint(tmp_path):
    """The run's directory passed for a complete checkpoint (final model, trainer_state.json): the run resumed at its
    last update with a new optimizer and the learning rate back at the warmup's first update, and said nothing."""
    run = tmp_path / "run"
    for step in (2, 4):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        write_completeness_marker(run / f"checkpoint-{step}", step=step)
    write_completeness_marker(run, step=4)
    args = tiny_run_args(tmp_path / "next", resume_from_checkpoint=str(run))
    with pytest.raises(ValueError) as refused:
        prepare_output_dir(args)
    assert str(refused.value) == (
        f"--resume_from_checkpoint {run} is a run's directory, not one of its checkpoints: give "
        f"{run / 'checkpoint-4'}, or --output_dir {run} --resume_from_checkpoint last"
    )


@pytest.mark.parametrize("resume", [None, "last"])
def test_a_checkpoint_given_as_the_output_directory_is_refused_naming_the_runs(resume, tmp_path):
    """The refusal of an earlier run there said to resume it with "last", which found no checkpoint inside the
    checkpoint and trained a fresh run over its files: the checkpoint was lost."""
    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    write_completeness_marker(checkpoint, step=2)
    with pytest.raises(ValueError) as refused:
        prepare_output_dir(tiny_run_args(checkpoint, resume_from_checkpoint=resume))
    assert str(refused.value) == (
        f"--output_dir {checkpoint} is a checkpoint of the run in {tmp_path / 'run'}: give the run's directory "
        f"(--output_dir {tmp_path / 'run'}), whose newest checkpoint --resume_from_checkpoint last resumes from"
    )
    # A run's directory merely named like a checkpoint (no completeness marker) is a run's.
    assert prepare_output_dir(tiny_run_args(tmp_path / "checkpoint-7", resume_from_checkpoint=resume)) is None


def test_a_directory_left_with_only_a_killed_first_save_holds_an_earlier_run_that_overwrite_removes(tmp_path):
    """A run killed during its first save leaves only `.checkpoint-N.partial`: a new run there without
    --resume_from_checkpoint or --overwrite_output_dir would train over it as if the directory were empty."""
    run = tmp_path / "run"
    (run / ".checkpoint-2.partial" / "checkpoint-2").mkdir(parents=True)
    with pytest.raises(OutputDirectoryInUseError, match=r"holds an earlier run \(\.checkpoint-2\.partial\)"):
        prepare_output_dir(tiny_run_args(run))
    assert prepare_output_dir(tiny_run_args(run, overwrite_output_dir=True)) is None
    assert not (run / ".checkpoint-2.partial").exists()


def test_processes_that_see_different_checkpoints_stop_naming_them(tmp_path, monkeypatch):
    """Two nodes without a shared file system (each its own output_dir): rank 0 resumed from checkpoint-15, rank 1
    from its checkpoint-10, which held no weights, and the run failed at every requeue. Here one process, told by
    the collective that another sees checkpoint-12 where it sees none."""
    monkeypatch.setattr(TranslationTrainingArguments, "world_size", property(lambda self: 2))
    monkeypatch.setattr(training, "lowest_and_highest_over_ranks", lambda step, device: (min(step, 12), 12))
    kept = tmp_path / "kept"  # a path given is the same for every process, which each checks: no name asked of it
    kept.mkdir()
    write_completeness_marker(kept, step=3)
    assert prepare_output_dir(tiny_run_args(tmp_path / "run", resume_from_checkpoint=str(kept))) == str(kept)
    args = tiny_run_args(tmp_path / "run", resume_from_checkpoint="last")
    with pytest.raises(
        ValueError,
        match=r"run: the processes do not see the same checkpoints \(one resumes from no "
        r"checkpoint, another from checkpoint-12\): output_dir must be on a file system every node",
    ):
        prepare_output_dir(args)


def test_fine_tuning_a_marian_model_converts_it_exactly_and_others_are_refused(tmp_path, datasets_cache):
    from transformers import MarianMTModel

    tokenizer = word_tokenizer()
    marian_dir = tmp_path / "marian"
    seeded_marian(len(tokenizer)).save_pretrained(marian_dir)
    tokenizer.save_pretrained(marian_dir)  # its tokenizer is kept
    model_args = ModelArguments(model_name_or_path=str(marian_dir), dropout=0.0)
    converted = _model(model_args, get_preset("tiny"), tokenizer, check_fine_tuning_source(model_args))
    marian = MarianMTModel.from_pretrained(marian_dir).eval()
    batch = {"input_ids": torch.tensor([[5, 6, 7, 2]]), "decoder_input_ids": torch.tensor([[0, 8, 9]])}
    assert converted.config.positional_encoding_layout == "concatenated"
    torch.testing.assert_close(converted.eval()(**batch).logits, marian(**batch).logits, atol=1e-5, rtol=0)

    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de")
    output_dir = train(ModelArguments(model_name_or_path=str(marian_dir)), data, tiny_run_args(tmp_path / "ft"))
    assert AutoModelForSeq2SeqLM.from_pretrained(output_dir).config.model_type == "vaswani_transformer"

    bart = tmp_path / "bart"
    bart.mkdir()
    (bart / "config.json").write_text(json.dumps({"model_type": "bart", "vocab_size": 64}))
    nowhere = DataArguments(data_dir=str(tmp_path / "no-data"), source_lang="en", target_lang="de")
    with pytest.raises(ValueError, match=r"it is a 'bart' model; only this project's"):
        train(ModelArguments(model_name_or_path=str(bart)), nowhere, tiny_run_args(tmp_path / "bart-run"))
    assert not (tmp_path / "bart-run").exists(), "refused before anything else"


def test_fine_tuning_a_converted_fairseq_model_keeps_its_tokenizer_and_decoding(
    tmp_path, datasets_cache, converted_fairseq_dir
):
    """The path of a user with fairseq's WMT weights and data of their own: convert, fine-tune, translate."""
    shutil.copytree(converted_fairseq_dir, tmp_path / "converted")  # as scripts/convert_fairseq.py writes it
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "converted")
    data = DataArguments(
        data_dir=str(write_corpus(tmp_path / "data", 40, word_for_word)), source_lang="en", target_lang="de"
    )
    output_dir = train(
        ModelArguments(model_name_or_path=str(tmp_path / "converted")), data, tiny_run_args(tmp_path / "ft")
    )

    fine_tuned, its_tokenizer = load_model_and_tokenizer(output_dir)
    saved = AutoTokenizer.from_pretrained(tmp_path / "converted")
    assert type(its_tokenizer).__name__ == "FairseqTokenizer"
    assert tokenizer_fingerprint(its_tokenizer) == tokenizer_fingerprint(saved), "fairseq's BPE, not a new one"
    for field in FAIRSEQ_DECODING_FIELDS:
        assert getattr(fine_tuned.generation_config, field) == getattr(model.generation_config, field), field
    assert model_fingerprint(fine_tuned) != model_fingerprint(model), "trained"
    assert len(translate(fine_tuned, its_tokenizer, ["the small dog .", ""], max_new_tokens=4)) == 2

    # Its card describes fairseq's decoding and tokenizer, and the fine-tuning (not "trained with fairseq").
    card = write_model_card(output_dir, repo_id="someone/fine-tuned", card_from=[output_dir]).read_text()
    assert "This model was fine-tuned from `converted`, which comes from weights trained with" in card
    assert "## Converted from fairseq" in card and "beam search as fairseq's" in card and "sacremoses" in card
    assert "Trained with fairseq; what this project records" not in card and "| max_steps | 2 |" in card
    assert "fairseq_conversion" not in card and "base_model" not in card, "a local path: no model tree link"

    # A fine-tune of that fine-tune's checkpoint (or average, or its pushed repo), which holds no conversion record
    # of its own: its card said "the paper's decoding: beam 4, GNMT", a plain tokenizer and Apache-2.0.
    again = train(
        ModelArguments(model_name_or_path=str(Path(output_dir) / "checkpoint-2")),
        data,
        tiny_run_args(tmp_path / "ft2"),
    )
    card = write_model_card(again, repo_id="someone/fine-tuned-again", card_from=[again]).read_text()
    assert "This model was fine-tuned from `checkpoint-2`, which comes from weights trained with" in card
    assert "license: mit" in card and "beam search as fairseq's" in card and "sacremoses" in card
    assert "GNMT length penalty 0.6" not in card

    # Another run in its place: fairseq's tokenizer files go with the run they belonged to (they were pushed with
    # the next model).
    fairseq_files = ["merges.txt", "tokenization_fairseq.py", "vocab-src.json", "vocab-tgt.json"]
    assert all((Path(output_dir) / name).is_file() for name in fairseq_files)
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(tmp_path / "ft", overwrite_output_dir=True))
    assert [name for name in fairseq_files if (Path(output_dir) / name).exists()] == []


def test_fine_tuning_a_converted_fairseq_model_on_another_pair_tokenises_by_the_new_languages(
    tmp_path, datasets_cache
):
    _, tokenizer = convert_fairseq_fixture("transformer_wmt_en_de")
    model, _ = convert_fairseq_fixture("transformer_wmt_en_de")
    model.save_pretrained(tmp_path / "converted")
    tokenizer.save_pretrained(tmp_path / "converted")
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    for split in ("train", "val"):
        (data_dir / f"{split}.de").rename(data_dir / f"{split}.fr")
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="fr")
    train(ModelArguments(model_name_or_path=str(tmp_path / "converted")), data, tiny_run_args(tmp_path / "ft"))

    assert json.loads((tmp_path / "ft" / "tokenizer_config.json").read_text())["langs"] == ["en", "fr"]
    fine_tuned = AutoTokenizer.from_pretrained(tmp_path / "ft")
    french = "L'homme qu'il a vu n'est pas là."
    # French Moses rules keep the elision with its article (`L'` `homme`); the German ones split it (`L` `'homme`).
    assert fine_tuned(text_target=french)["input_ids"] != tokenizer(text_target=french)["input_ids"]
    assert fine_tuned(text_target=french)["input_ids"] == [
        fine_tuned.convert_tokens_to_ids(piece)
        for word in fine_tuned.moses_tokenize(french, "fr")
        for piece in fine_tuned.bpe(word).split(" ")
    ] + [fine_tuned.eos_token_id]
    with pytest.raises(ValueError, match="cannot add 'Zebrastreifen': fairseq's Moses \\+ BPE pipeline would never"):
        fine_tuned.add_tokens(["Zebrastreifen"])


def test_a_converted_fairseq_tokenizer_with_a_dictionary_for_each_side_keeps_its_own_pair_only(converted_fairseq):
    """Two dictionaries belong to their sides: fine-tuning on the pair they were made for goes on, another pair is
    refused in one line naming the model."""
    tokenizer = copy.deepcopy(converted_fairseq["transformer_wmt_en_de"][1])
    # The target dictionary with two ids swapped: another than the source's.
    first, second = list(tokenizer.decoder)[4:6]
    tokenizer.decoder[first], tokenizer.decoder[second] = tokenizer.decoder[second], tokenizer.decoder[first]
    training._take_the_run_languages(tokenizer, "converted", SimpleNamespace(source_lang="en", target_lang="de"))
    assert [tokenizer.src_lang, tokenizer.tgt_lang] == ["en", "de"]
    with pytest.raises(ValueError, match=r"^converted: its tokenizer is for en-de with a dictionary for each side; "):
        training._take_the_run_languages(tokenizer, "converted", SimpleNamespace(source_lang="en", target_lang="fr"))


def test_an_empty_split_names_its_files_and_cleaning_that_empties_one_says_so(tmp_path, datasets_cache):
    data_dir = write_corpus(tmp_path / "data", 10, word_for_word)
    (data_dir / "val.en").write_text("")
    (data_dir / "val.de").write_text("")
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de")
    with pytest.raises(ValueError, match=r"split 'val' is empty: .*val\.en \+ .*val\.de hold"):
        train(
            ModelArguments(preset="tiny", **TINY),
            data,
            tiny_run_args(tmp_path / "a", eval_strategy="steps"),
        )
    (data_dir / "train.de").write_text("".join("ein zwei drei vier fünf sechs\n" for _ in range(10)))
    (data_dir / "train.en").write_text("".join("one\n" for _ in range(10)))  # every pair fails the ratio rule
    with pytest.raises(ValueError, match=r"cleaning removed every one of the 10 pairs of split 'train'.*10 with a"):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(tmp_path / "b"))
    for language in ("en", "de"):  # uncleaned, blank lines reach the BPE, which names their files, not "the input"
        (data_dir / f"train.{language}").write_text("\n \n\u200b\n")
    uncleaned = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", clean=False)
    with pytest.raises(
        ValueError, match=rf"^no text to train the BPE on: {re.escape(str(data_dir / 'train.en'))} \+ .*train\.de hold"
    ):
        train(ModelArguments(preset="tiny", **TINY), uncleaned, tiny_run_args(tmp_path / "c"))


def test_a_bpe_larger_than_vocab_size_resumes_and_a_foreign_one_is_refused(tmp_path, datasets_cache, caplog):
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=16)
    model_args = ModelArguments(preset="tiny", **TINY)
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="modeling.tokenization"):
        train(model_args, data, tiny_run_args(run, resume_from_checkpoint="last"))
    assert "more than vocab_size=16: the corpus has 24 distinct characters, all kept by BPE" in caplog.text
    assert len(AutoTokenizer.from_pretrained(run)) == 32

    train(model_args, data, tiny_run_args(run, max_steps=4, resume_from_checkpoint="last"))  # the same command
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 4

    word_tokenizer().save_pretrained(run)  # not the BPE this run recorded, and larger than --vocab_size 16 allows
    with pytest.raises(ValueError, match=rf"^{run / 'tokenizer.json'} has 64 tokens, more than --vocab_size 16"):
        train(model_args, data, tiny_run_args(run, max_steps=6, resume_from_checkpoint="last"))


@pytest.mark.parametrize("vocab_size", [57, 64])
def test_a_foreign_tokenizer_as_large_as_the_padded_vocab_size_is_taken(tmp_path, vocab_size):
    """The embedding is --vocab_size rounded up to a multiple of 8: a tokenizer that fills it fits, one more token
    does not."""
    tokenizer = word_tokenizer()  # 64 tokens, no run identity beside it
    _check_earlier_bpe(tokenizer, tmp_path / "tokenizer.json", vocab_size)
    with pytest.raises(ValueError, match=f"has 64 tokens, more than --vocab_size {vocab_size - 8} allows"):
        _check_earlier_bpe(tokenizer, tmp_path / "tokenizer.json", vocab_size - 8)


def test_a_tokenizer_left_without_a_run_identity_is_not_reused_for_other_data(
    tmp_path, datasets_cache, monkeypatch, caplog
):
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    model_args = ModelArguments(preset="tiny", **TINY)
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=r"divisible by encoder_attention_heads \(3\)"):
        train(ModelArguments(preset="tiny", **{**TINY, "num_heads": 3}), data, tiny_run_args(run))
    assert not run.exists(), "the model config is checked before the BPE is trained"

    def killed(*args, **kwargs):
        raise RuntimeError("killed")

    with monkeypatch.context() as patch:  # a run killed between saving its BPE and recording its identity
        patch.setattr(training, "run_identity", killed)
        with pytest.raises(RuntimeError, match="killed"):
            train(model_args, data, tiny_run_args(run))
    ours = (run / "tokenizer.json").read_text()
    with pytest.raises(OutputDirectoryInUseError, match=r"holds an earlier run \(tokenizer\.json\)"):
        train(model_args, data, tiny_run_args(run))
    train(model_args, data, tiny_run_args(run, resume_from_checkpoint="last"))  # the requeue: its own BPE, checked
    assert (run / "tokenizer.json").read_text() == ours

    def shouted(words):
        return " ".join(words).upper()

    other = tmp_path / "other"  # the same left over BPE, and a run on other data
    other.mkdir()
    (other / "tokenizer.json").write_text(ours)
    other_data = DataArguments(**{**vars(data), "data_dir": str(write_corpus(tmp_path / "upper", 40, shouted))})
    with pytest.raises(ValueError, match=rf"^{other / 'tokenizer.json'} was left by a run .* not the BPE of this"):
        train(model_args, other_data, tiny_run_args(other, resume_from_checkpoint="last"))
    with caplog.at_level(logging.WARNING, logger="modeling.training"):
        train(model_args, other_data, tiny_run_args(other, overwrite_output_dir=True))
    assert "removed the earlier run's tokenizer.json" in caplog.text
    assert (other / "tokenizer.json").read_text() != ours


def test_a_new_model_takes_the_special_token_ids_of_the_given_tokenizer(tmp_path, datasets_cache):
    """T5's order, </s> at 1 and <unk> at 2: the decoder started from <unk> and generate() stopped at it too (the
    Trainer made the generation config's eos [1, 2])."""
    tokenizer = word_level_tokenizer(
        ["<pad>", "</s>", "<unk>"], pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de")
    model_args = ModelArguments(preset="tiny", tokenizer_name_or_path=str(tmp_path / "tokenizer"), **TINY)
    output_dir = train(model_args, data, tiny_run_args(tmp_path / "run", save_strategy="no"))
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    config = model.config
    assert (config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (0, 1, 1)
    assert model.generation_config.eos_token_id == 1, "stops at </s> alone, not at <unk>"
    assert model.model.shared.padding_idx == 0


def test_a_new_model_with_a_given_tokenizer_loads_that_tokenizer_alone(tmp_path, datasets_cache, monkeypatch):
    """No model is fine-tuned, so there is no vocabulary of its own to compare the tokenizer with: a request for one
    (of a Hub repo named None) waits on the Hub's timeouts offline."""
    word_tokenizer().save_pretrained(tmp_path / "tokenizer")
    load, loaded = AutoTokenizer.from_pretrained, []

    def recorded(cls, name, *args, **kwargs):
        loaded.append(name)
        if name is None:
            raise OSError("None is not a Hub repo")  # what the Hub answers, after its timeouts offline
        return load(name, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(recorded))
    data = DataArguments(
        data_dir=str(write_corpus(tmp_path / "data", 40, word_for_word)), source_lang="en", target_lang="de"
    )
    model_args = ModelArguments(preset="tiny", tokenizer_name_or_path=str(tmp_path / "tokenizer"), **TINY)
    train(model_args, data, tiny_run_args(tmp_path / "run", save_strategy="no"))
    assert loaded == [str(tmp_path / "tokenizer")]


def test_a_run_begun_before_new_models_took_the_tokenizers_pad_and_bos_resumes(tmp_path, datasets_cache):
    """A run with fairseq's order (<s>, <pad>, </s>) begun before recorded pad 0 and no bos, whatever the tokenizer,
    and ended sentences at its </s> as now: it was refused ('config.bos_token_id: null vs 0; config.pad_token_id: 0
    vs 1'), its checkpoints lost, for ids that change nothing it learned."""
    special_tokens = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>", "bos_token": "<s>"}
    word_level_tokenizer(["<s>", "<pad>", "</s>", "<unk>"], **special_tokens).save_pretrained(tmp_path / "tokenizer")
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de")
    model_args = ModelArguments(preset="tiny", tokenizer_name_or_path=str(tmp_path / "tokenizer"), **TINY)
    run = tmp_path / "run"
    train(model_args, data, tiny_run_args(run, eval_strategy="no"))
    for identity_file in (run / "run_identity.json", run / "checkpoint-2" / "run_identity.json"):
        identity = json.loads(identity_file.read_text())
        assert (identity["config"]["pad_token_id"], identity["config"]["bos_token_id"]) == (1, 0)
        identity["config"].update(pad_token_id=0, bos_token_id=None)  # as such a run recorded them
        identity_file.write_text(json.dumps(identity))
    train(model_args, data, tiny_run_args(run, eval_strategy="no", max_steps=4, resume_from_checkpoint="last"))
    assert (run / "checkpoint-4").is_dir()
    assert json.loads((run / "checkpoint-4" / "run_identity.json").read_text())["config"]["pad_token_id"] == 0


REFUSED_TOKENIZERS = {
    "no pad token": (["<unk>", "</s>"], "$A </s>", {"unk_token": "<unk>", "eos_token": "</s>"}, "has no pad_token"),
    "no eos token": (
        ["[PAD]", "[UNK]", "[SEP]"],
        "$A [SEP]",
        {"pad_token": "[PAD]", "unk_token": "[UNK]", "sep_token": "[SEP]"},
        "has no eos",
    ),
    "no eos appended": (
        ["<pad>", "<unk>", "</s>"],
        None,
        {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "</s>"},
        "does not end",
    ),
}


@pytest.mark.parametrize("case", REFUSED_TOKENIZERS)
def test_a_given_tokenizer_that_cannot_pad_or_end_targets_is_refused_before_the_run_is_recorded(
    case, tmp_path, datasets_cache
):
    """Before, a tokenizer without a pad token failed at the first batch with transformers' message, the run
    already recorded; without an eos token, or one not appended, a model trained that never learned to stop."""
    special_tokens, template, tokens, message = REFUSED_TOKENIZERS[case]
    word_level_tokenizer(special_tokens, template, **tokens).save_pretrained(tmp_path / "tokenizer")
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de")
    model_args = ModelArguments(preset="tiny", tokenizer_name_or_path=str(tmp_path / "tokenizer"), **TINY)
    with pytest.raises(ValueError, match=rf"^The tokenizer {tmp_path / 'tokenizer'} {message}"):
        train(model_args, data, tiny_run_args(tmp_path / "run"))
    assert not (tmp_path / "run" / "run_identity.json").exists()


def test_a_given_tokenizer_that_reads_a_side_as_unknown_tokens_is_warned_of(tmp_path, datasets_cache, caplog):
    """A BPE trained on the English files alone, for an English-Russian run: every Cyrillic letter was <unk>, and the
    model learnt to write rows of <unk> without a word."""
    train_shared_bpe([" ".join(WORDS)] * 3, vocab_size=64, min_frequency=1).save_pretrained(tmp_path / "tokenizer")
    cyrillic = str.maketrans("abcdefghijklmnopqrstuvwxyz", "абцдефгхийклмнопярстужвхыз")
    data_dir = write_corpus(tmp_path / "data", 40, lambda words: " ".join(words).translate(cyrillic))
    for split in ("train", "val"):
        (data_dir / f"{split}.de").rename(data_dir / f"{split}.ru")
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="ru")
    model_args = ModelArguments(preset="tiny", tokenizer_name_or_path=str(tmp_path / "tokenizer"), **TINY)
    with caplog.at_level(logging.WARNING, logger="modeling.training"):
        train(model_args, data, tiny_run_args(tmp_path / "run", save_strategy="no"))
    warned = [record.getMessage() for record in caplog.records if "never saw" in record.getMessage()]
    assert len(warned) == 1, "the English side, which it knows, is not warned of"
    assert re.match(
        rf"The tokenizer {re.escape(str(tmp_path / 'tokenizer'))} reads \d+% of the 'ru' tokens", warned[0]
    )


def test_special_token_text_in_the_training_data_that_a_given_tokenizer_reads_as_the_token_is_warned_of(
    tmp_path, datasets_cache, caplog
):
    """A tokenizer built with 🤗 tokenizers reads "</s>" written in a sentence as its end-of-sentence token: training
    targets holding it taught the model to stop there, without a word. This project's BPE reads it as text."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    german = (data_dir / "train.de").read_text(encoding="utf-8").splitlines()
    german[:2] = [f"{german[0]} </s> Katze", f"</s> {german[1]}"]
    (data_dir / "train.de").write_text("\n".join(german) + "\n", encoding="utf-8")
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de")
    bpe = word_tokenizer()
    bpe.save_pretrained(tmp_path / "bpe")
    special_tokens = {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "</s>"}
    # The same BPE, wrapped as a user wraps one built with 🤗 tokenizers
    PreTrainedTokenizerFast(tokenizer_object=bpe.backend_tokenizer, **special_tokens).save_pretrained(tmp_path / "own")
    warned = {}
    for tokenizer in ("own", "bpe"):
        model_args = ModelArguments(preset="tiny", tokenizer_name_or_path=str(tmp_path / tokenizer), **TINY)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="modeling.training"):
            train(model_args, data, tiny_run_args(tmp_path / f"run-{tokenizer}", save_strategy="no"))
        warned[tokenizer] = [
            record.getMessage() for record in caplog.records if "special token" in record.getMessage()
        ]
    assert warned["own"] == [
        f"2 'de' sentences of the training data hold '</s>', which the tokenizer {tmp_path / 'own'} reads as its "
        "special token (id 2), not as text: a target holding '</s>' teaches the model to stop there. To read them as "
        f"text, save it so: AutoTokenizer.from_pretrained('{tmp_path / 'own'}', split_special_tokens=True)"
        ".save_pretrained(...)"
    ]
    assert warned["bpe"] == []


def test_training_pairs_with_the_same_text_on_both_sides_are_warned_of(tmp_path, datasets_cache, caplog):
    """The English file copied under the German name: a model trained to copy its input, without a word."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    lines = (data_dir / "train.en").read_text(encoding="utf-8").splitlines()
    german = (data_dir / "train.de").read_text(encoding="utf-8").splitlines()
    (data_dir / "train.de").write_text("\n".join(lines[:35] + german[35:]) + "\n", encoding="utf-8")
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    with caplog.at_level(logging.WARNING, logger="modeling.training"):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(tmp_path / "run", save_strategy="no"))
    warned = [record.getMessage() for record in caplog.records if "same text on both sides" in record.getMessage()]
    assert warned == [
        f"35 of the 40 training pairs ({data_dir / 'train.en'} + {data_dir / 'train.de'}) have the same text on both "
        "sides: a model learns to copy its input. Copy noise, or one language's text given for both?"
    ]


def test_validation_pairs_that_are_training_pairs_too_are_warned_of(tmp_path, datasets_cache, caplog):
    """A validation set sampled from the corpus and left in it: the validation loss and BLEU measured what the model
    learnt by heart, without a word."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    model_args = ModelArguments(preset="tiny", **TINY)
    for language in ("en", "de"):  # 4 of the 16 validation pairs, the last a source with another target
        lines = (data_dir / f"train.{language}").read_text(encoding="utf-8").splitlines()
        held = (data_dir / f"val.{language}").read_text(encoding="utf-8").splitlines()
        copied = lines[:3] + [lines[3] if language == "en" else "anders"]
        (data_dir / f"val.{language}").write_text("\n".join(copied + held[4:]) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="modeling.training"):
        train(model_args, data, tiny_run_args(tmp_path / "run", eval_strategy="steps", eval_steps=2))
    warned = [record.getMessage() for record in caplog.records if "training pairs too" in record.getMessage()]
    assert warned == [
        f"3 of the 16 validation pairs ({data_dir / 'val.en'} + {data_dir / 'val.de'}) are training pairs too "
        f"({data_dir / 'train.en'} + {data_dir / 'train.de'}): the validation loss and BLEU, and the checkpoint they "
        "pick, measure what the model learnt by heart; take them out of the training data"
    ]


def test_a_tokenizer_that_pads_on_the_left_trains_as_one_that_pads_on_the_right(tmp_path, datasets_cache):
    """The collator pads on the tokenizer's side: left padding shifted the sources' positions and put padding
    between the decoder's start token and the target, which generate() never does."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de")
    curves = []
    for side in ("right", "left"):
        word_tokenizer().save_pretrained(tmp_path / side)
        settings = tmp_path / side / "tokenizer_config.json"  # where a tokenizer says it pads on the left
        settings.write_text(json.dumps(json.loads(settings.read_text()) | {"padding_side": side}))
        model_args = ModelArguments(preset="tiny", tokenizer_name_or_path=str(tmp_path / side), **TINY)
        args = tiny_run_args(tmp_path / f"run-{side}", max_steps=4, save_strategy="no")
        state = json.loads((Path(train(model_args, data, args)) / "trainer_state.json").read_text())
        curves.append(list(losses(state["log_history"]).values()))
    assert curves[0] == curves[1]


def test_a_run_with_a_given_tokenizer_is_resumed_whatever_vocab_size_says(tmp_path, datasets_cache):
    """--vocab_size sizes the BPE a run trains: a run with a given tokenizer trains none, and its requeue with another
    --vocab_size (a config file shared with runs that train one) is the same run."""
    word_tokenizer().save_pretrained(tmp_path / "tokenizer")
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    model_args = ModelArguments(preset="tiny", tokenizer_name_or_path=str(tmp_path / "tokenizer"), **TINY)
    run = tmp_path / "run"
    for vocab_size, max_steps in ((64, 2), (128, 4)):
        data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=vocab_size)
        train(model_args, data, tiny_run_args(run, max_steps=max_steps, resume_from_checkpoint="last"))
    assert sorted(path.name for path in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


def test_overwrite_output_dir_refuses_to_delete_the_model_or_tokenizer_the_run_starts_from(tmp_path):
    tokenizer = word_tokenizer()
    run = tmp_path / "ft"
    (run / "averaged").mkdir(parents=True)
    tiny_model(len(tokenizer)).save_pretrained(run / "averaged")
    tokenizer.save_pretrained(run / "averaged")
    (run / "averaged" / AVERAGING_RECORD_NAME).write_text("{}")  # the earlier run's average
    tokenizer.save_pretrained(run)
    (run / "run_identity.json").write_text("{}")  # an earlier run, that --overwrite_output_dir removes
    data = DataArguments(data_dir=str(tmp_path / "no-data"), source_lang="en", target_lang="de")
    overwrite = tiny_run_args(run, overwrite_output_dir=True)
    fine_tune = ModelArguments(model_name_or_path=str(run / "averaged"))
    with pytest.raises(ValueError, match=rf"^--overwrite_output_dir would delete {run / 'averaged'}, the model"):
        train(fine_tune, data, overwrite)
    own_tokenizer = ModelArguments(preset="tiny", tokenizer_name_or_path=str(run), **TINY)
    with pytest.raises(ValueError, match=rf"^--overwrite_output_dir would delete {run}, the tokenizer"):
        train(own_tokenizer, data, overwrite)
    assert {path.name for path in run.iterdir()} >= {"averaged", "run_identity.json", "tokenizer.json"}
    assert (run / "averaged" / "model.safetensors").is_file(), "nothing deleted"
    # A model outside output_dir is no obstacle: the earlier run is removed.
    elsewhere = ModelArguments(model_name_or_path=str(saved_tiny_model(tmp_path / "pretrained")))
    assert prepare_output_dir(overwrite, elsewhere) is None
    assert not (run / "averaged").exists() and not (run / "run_identity.json").exists()


def test_training_reads_only_the_splits_it_uses(tmp_path, datasets_cache):
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    (data_dir / "test.en").write_text("a blind test set\n")  # no German side
    (data_dir / "val.de").write_text("ein\n")  # 1 line against val.en's 16
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(tmp_path / "run"))
    evaluating = tiny_run_args(tmp_path / "evaluated", eval_strategy="steps", eval_steps=2)
    with pytest.raises(ValueError, match=r"not line-aligned: .*val\.en has 16 lines"):
        train(ModelArguments(preset="tiny", **TINY), data, evaluating)


def test_overwrite_output_dir_removes_the_earlier_runs_logs_and_leaves_what_is_not_a_runs(tmp_path, datasets_cache):
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run))
    (run / "averaged").mkdir()
    (run / "averaged" / "notes.txt").write_text("mine")  # the user's, not a run's
    earlier_logs = run / "runs" / "Dec01_10-00-00_host"  # the Trainer's TensorBoard logs of the earlier run
    earlier_logs.mkdir(parents=True)
    (earlier_logs / "events.out.tfevents.1.host").write_bytes(b"")
    (run / "runs" / "notes").mkdir()
    (run / "training_curves.png").write_bytes(b"\x89PNG")  # rendered with the earlier run's card: its curves
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, overwrite_output_dir=True))
    assert (run / "averaged" / "notes.txt").read_text() == "mine"
    assert not earlier_logs.exists() and (run / "runs" / "notes").is_dir()
    assert not (run / "training_curves.png").exists()


@pytest.mark.parametrize(("name", "value"), [("max_train_samples", 0), ("max_train_samples", -3), ("max_length", 1)])
def test_counts_that_leave_nothing_to_train_are_refused_before_any_work(tmp_path, name, value):
    data = DataArguments(data_dir=str(tmp_path), source_lang="en", target_lang="de", **{name: value})
    with pytest.raises(ValueError, match=rf"^--{name} must be at least \d\b.*got {value}\.$"):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_negative_bleu_sample_size_is_refused_before_any_work(tmp_path):
    data = DataArguments(data_dir=str(tmp_path), source_lang="en", target_lang="de", bleu_sample_size=-1)
    with pytest.raises(ValueError, match=r"^--bleu_sample_size must not be negative, got -1\.$"):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_paper_schedule_without_warmup_is_refused_before_any_work(tmp_path):
    """The Trainer refuses it too, but only once the BPE is trained and the run recorded: the corrected command
    then found an earlier run in the directory."""
    data = DataArguments(data_dir=str(tmp_path), source_lang="en", target_lang="de")
    with pytest.raises(
        ValueError, match=r"^The schedule of Sec\. 5\.3 needs a warmup of at least one update .*got 0\.$"
    ):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(tmp_path / "run", warmup_steps=0))
    assert not (tmp_path / "run").exists()


def test_max_train_samples_trains_on_the_first_pairs_of_the_training_split_only(tmp_path, datasets_cache):
    data_dir = write_corpus(tmp_path / "data", 12, word_for_word)
    first = (data_dir / "train.en").read_text(encoding="utf-8").splitlines()
    for limit, kept in ((5, first[:5]), (50, first)):
        data = DataArguments(
            data_dir=str(data_dir), source_lang="en", target_lang="de", max_train_samples=limit, clean=False
        )
        text, _ = training._load_text(data, evaluate=True)
        assert [pair["en"] for pair in text["train"]["translation"]] == kept
        assert len(text["validation"]) == 16, "the validation split is not cut"


def test_a_resized_fine_tuning_is_refused_before_overwrite_output_dir_deletes_the_earlier_run(tmp_path):
    tokenizer = word_tokenizer()
    pretrained = tmp_path / "pretrained"
    tiny_model(len(tokenizer)).save_pretrained(pretrained)
    tokenizer.save_pretrained(pretrained)
    run = tmp_path / "run"
    earlier = run / "checkpoint-7"
    earlier.mkdir(parents=True)
    model_args = ModelArguments(model_name_or_path=str(pretrained), num_layers=3, d_model=64)
    with pytest.raises(ValueError, match=r"^--d_model, --num_layers: the architecture of .*pretrained cannot change"):
        train(model_args, DataArguments(data_dir=str(tmp_path)), tiny_run_args(run, overwrite_output_dir=True))
    assert earlier.is_dir()


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"predict_with_generate": False}, r"^BLEU on 200 validation sentences .*--bleu_sample_size 0 to evaluate"),
        ({"metric_for_best_model": "sampel_bleu"}, r"^--metric_for_best_model sampel_bleu: .*eval_sample_bleu"),
        ({"bleu_sample_size": 0, "metric_for_best_model": "sample_bleu"}, r"eval_loss, .*BLEU needs a --bleu_s"),
        ({"accelerator_config": {"even_batches": False}, "world_size": 2}, r"sharded whole"),
    ],
)
def test_evaluation_and_sharding_settings_that_would_fail_later_are_refused_before_any_work(
    tmp_path, monkeypatch, settings, refusal
):
    """Each failed only at the first evaluation or the first batch, after the BPE was trained and the run recorded
    (so that the corrected command found an earlier run in the directory)."""
    settings = dict(settings)  # popped from below: the parametrize list's dict must stay whole for a rerun
    bleu_sample = {"bleu_sample_size": settings.pop("bleu_sample_size")} if "bleu_sample_size" in settings else {}
    if settings.pop("world_size", 1) > 1:
        monkeypatch.setattr(TranslationTrainingArguments, "world_size", property(lambda self: 2))
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64, **bleu_sample)
    run_args = tiny_run_args(tmp_path / "run", eval_strategy="steps", eval_steps=2, **settings)
    with pytest.raises(ValueError, match=refusal):
        train(ModelArguments(preset="tiny", **TINY), data, run_args)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("target_lang", "settings", "refusal"),
    [
        ("zh-CN", {"metric_for_best_model": "sample_paper_bleu"}, r"^--metric_for_best_model sample_paper_bleu: "),
        *(
            pytest.param(
                "ja",
                settings,
                r"^BLEU into 'ja' uses sacreBLEU's 'ja-mecab' tokeniser.*sacrebleu\[ja\]'; "
                r"or give --bleu_sample_size 0",
                marks=pytest.mark.skipif(importlib.util.find_spec("MeCab") is not None, reason="MeCab is installed"),
            )
            for settings in ({}, {"bleu_sample_size": 1})
        ),
    ],
)
def test_bleu_a_target_language_cannot_have_is_refused_before_any_work(tmp_path, target_lang, settings, refusal):
    """No tokenised BLEU into Chinese (`corpus_scores`), no BLEU into Japanese without MeCab, even of one sentence:
    the first evaluation failed on them, after the BPE was trained."""
    settings = dict(settings)  # popped from below: the parametrize list's dict must stay whole for a rerun
    bleu_sample = {"bleu_sample_size": settings.pop("bleu_sample_size")} if "bleu_sample_size" in settings else {}
    data = DataArguments(
        data_dir=str(tmp_path / "data"), source_lang="en", target_lang=target_lang, vocab_size=64, **bleu_sample
    )
    run_args = tiny_run_args(tmp_path / "run", eval_strategy="steps", eval_steps=2, **settings)
    with pytest.raises(ValueError, match=refusal):
        train(ModelArguments(preset="tiny", **TINY), data, run_args)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("MeCab") is not None, reason="MeCab is installed")
def test_a_run_into_japanese_that_scores_no_bleu_needs_no_mecab(tmp_path):
    """The refusal of BLEU into Japanese without MeCab offers --bleu_sample_size 0: that run, the loss alone, is
    taken."""
    data = DataArguments(
        data_dir=str(tmp_path / "data"), source_lang="en", target_lang="ja", vocab_size=64, bleu_sample_size=0
    )
    run_args = tiny_run_args(tmp_path / "run", eval_strategy="steps", eval_steps=2)
    training._check_run_arguments(ModelArguments(preset="tiny", **TINY), data, run_args)


@pytest.mark.parametrize("factor", [1.5, -0.5])
def test_a_label_smoothing_factor_outside_0_to_1_is_refused_when_the_arguments_are_made(tmp_path, factor):
    """1.5 trained on CPU (the fused loss took any ε) and failed on a GPU at the first step (the plain loss)."""
    with pytest.raises(ValueError, match=rf"^label_smoothing_factor must be between 0 and 1, got {factor}\.$"):
        tiny_run_args(tmp_path / "run", label_smoothing_factor=factor)


@pytest.mark.parametrize(
    "name", ["data_dir", "dataset", "dataset_revision", "language_pair", "source_lang", "target_lang"]
)
def test_an_empty_data_setting_is_refused_naming_it(name):
    """`--data_dir $DATA` with DATA unset gives `--data_dir ""`: the current directory was searched for the corpus,
    even beside --dataset."""
    with pytest.raises(ValueError, match=rf"^--{name} is empty \(a shell variable not set\?\): give its value"):
        DataArguments(**{"dataset": "wmt/wmt14", name: " " if name == "source_lang" else ""})


@pytest.mark.parametrize("name", ["model_name_or_path", "model_revision", "tokenizer_name_or_path"])
def test_an_empty_model_setting_is_refused_naming_it(name):
    """`--model_revision ""` asked the Hub for `x/y/resolve//config.json`, and `--model_name_or_path ""` was
    refused by huggingface_hub as a repo id naming no setting."""
    with pytest.raises(ValueError, match=rf"^--{name} is empty \(a shell variable not set\?\): give its value"):
        ModelArguments(**{"model_name_or_path": "user/model", name: ""})


def test_max_steps_0_is_refused_rather_than_read_as_unset(tmp_path):
    """transformers reads a step count below 1 as unset: `--max_steps 0` trained num_train_epochs epochs (3 by
    default) and saved a checkpoint, exit 0. -1, transformers' own "unset", still trains by epochs."""
    with pytest.raises(ValueError, match=r"^max_steps 0 would train num_train_epochs epochs .* or -1 to train by"):
        tiny_run_args(tmp_path / "run", max_steps=0)
    assert tiny_run_args(tmp_path / "run", max_steps=-1).max_steps == -1


def test_an_averaged_directory_that_cannot_be_replaced_is_refused_before_training(tmp_path, monkeypatch):
    def not_reached(*args, **kwargs):
        raise AssertionError("the data was read although the average could not be written")

    monkeypatch.setattr(training, "load_parallel_dataset", not_reached)
    run = tmp_path / "run"
    (run / "averaged").mkdir(parents=True)
    (run / "averaged" / "notes.txt").write_text("hi")
    (run / "run_identity.json").write_text("{}")
    data = DataArguments(data_dir=str(tmp_path), source_lang="en", target_lang="de", vocab_size=64)
    for args in (
        tiny_run_args(run, average_last_checkpoints=2, resume_from_checkpoint="last"),
        tiny_run_args(run, average_last_checkpoints=2, overwrite_output_dir=True),
    ):
        with pytest.raises(FileExistsError, match=rf"^{run / 'averaged'} exists and is not an average of checkpoints"):
            train(ModelArguments(preset="tiny", **TINY), data, args)
        assert (run / "averaged" / "notes.txt").is_file() and (run / "run_identity.json").is_file()
    # A run that averages nothing (1 checkpoint is no average) leaves it alone.
    assert prepare_output_dir(tiny_run_args(run, average_last_checkpoints=1, resume_from_checkpoint="last")) is None


def test_fine_tuning_offline_names_what_the_hub_cache_lacks_and_a_revision_needs_a_hub_repo(tmp_path, monkeypatch):
    import huggingface_hub

    from modeling.training import check_fine_tuning_source

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError) as error:
        check_fine_tuning_source(ModelArguments(model_name_or_path="owner/absent"))
    assert str(error.value) == (
        f"'owner/absent' is not in the Hub cache {tmp_path / 'hub'}, and offline mode (HF_HUB_OFFLINE) keeps it "
        "from the Hub: download it where the Hub can be reached, into the same HF_HOME (hf download owner/absent)"
    )
    # A download that left out the weights (its main is there): named as such, not as a cache of other revisions.
    tiny_config().save_pretrained(hub_cache_snapshot(tmp_path / "hub", "owner/partial", "abc123", {}))
    with pytest.raises(FileNotFoundError) as error:
        check_fine_tuning_source(ModelArguments(model_name_or_path="owner/partial"))
    assert str(error.value).startswith(
        f"The Hub cache {tmp_path / 'hub'} holds 'owner/partial' without model.safetensors or "
        "model.safetensors.index.json, tokenizer.json or tokenizer_config.json, and offline mode"
    )
    # a path, not an id: named as one (it was "Repo id must be in the form 'repo_name' or 'namespace/repo_name'")
    with pytest.raises(ValueError, match=r"^--model_name_or_path \./no/such/checkpoint does not exist$"):
        check_fine_tuning_source(ModelArguments(model_name_or_path="./no/such/checkpoint"))
    with pytest.raises(ValueError, match=r"^--model_revision names a version of --model_name_or_path's Hub repo"):
        check_fine_tuning_source(ModelArguments(model_revision="v1"))
    with pytest.raises(ValueError, match=r"is a local directory: --model_revision names a version of a Hub repo"):
        check_fine_tuning_source(ModelArguments(model_name_or_path=str(tmp_path), model_revision="v1"))


def test_the_conversion_record_of_a_hub_model_is_read_at_the_revision_fine_tuned(tmp_path, monkeypatch):
    """Before, `main`'s record was read whatever --model_revision said, and the card named the wrong origin."""
    import huggingface_hub

    from modeling.training import _conversion_record

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    for commit, checkpoint, main in (("a" * 40, "model_v1.pt", False), ("b" * 40, "model_v2.pt", True)):
        record = json.dumps({"checkpoint": checkpoint})
        hub_cache_snapshot(tmp_path / "hub", "owner/converted", commit, {"fairseq_conversion.json": record}, main)
    pinned = ModelArguments(model_name_or_path="owner/converted", model_revision="a" * 40)
    assert _conversion_record(pinned) == {"checkpoint": "model_v1.pt"}
    assert _conversion_record(ModelArguments(model_name_or_path="owner/converted")) == {"checkpoint": "model_v2.pt"}


def test_a_missing_split_is_named_by_its_role_and_another_key_error_is_not_taken_for_one(tmp_path, monkeypatch):
    data_dir = write_corpus(tmp_path / "data", 10, word_for_word)
    (data_dir / "val.en").unlink()
    (data_dir / "val.de").unlink()
    data_args = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de")
    with pytest.raises(ValueError, match=r"^Evaluation needs a validation split \(no split 'validation'"):
        training._load_text(data_args, evaluate=True)
    (data_dir / "train.en").rename(data_dir / "other.en")
    (data_dir / "train.de").rename(data_dir / "other.de")
    with pytest.raises(ValueError, match=r"^Training needs a training split \(no split 'train'"):
        training._load_text(data_args, evaluate=True)

    def broken_rows(**kwargs):  # a KeyError of the loading itself, not of a split's name: not reported as one
        raise KeyError("translation")

    monkeypatch.setattr(training, "load_parallel_dataset", broken_rows)
    with pytest.raises(KeyError, match="^'translation'$"):
        training._load_text(data_args, evaluate=True)


def test_resuming_on_a_training_split_cleaned_to_another_size_says_so(tmp_path, datasets_cache, caplog, monkeypatch):
    """The same files cleaned by another version of this code (one that kept pairs of zero-width spaces): the run
    identity, which compares the files, saw no difference, and the resumed run trained on other batches unsaid."""
    monkeypatch.setattr(logging.getLogger("modeling"), "propagate", True)
    data = DataArguments(
        data_dir=str(write_corpus(tmp_path / "data", 40, word_for_word)),
        source_lang="en",
        target_lang="de",
        vocab_size=64,
    )
    run = tmp_path / "run"
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, save_steps=1))
    stats = json.loads((run / "data_stats.json").read_text())
    assert stats["sentence_pairs"]["train"] == 40
    assert (stats["source_lang"], stats["target_lang"]) == ("en", "de"), "each by itself, for the card's languages"
    with caplog.at_level(logging.WARNING, logger="modeling.training"):
        train(
            ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, max_steps=3, resume_from_checkpoint="last")
        )
    assert "cleaned training split" not in caplog.text, "the same training set: nothing to say"
    stats["sentence_pairs"]["train"] = 46  # as the earlier version recorded it
    write_json(run / "data_stats.json", stats)
    with caplog.at_level(logging.WARNING, logger="modeling.training"):
        train(
            ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, max_steps=4, resume_from_checkpoint="last")
        )
    assert (
        f"The cleaned training split has 40 pairs, the run's earlier launch trained on 46 ({run / 'data_stats.json'})"
        in caplog.text
    )


def test_a_fine_tuning_resumed_with_its_model_directory_moved_is_the_same_run_and_other_weights_are_not(tmp_path):
    """A run fine-tuning `ck8` was refused as another run once `ck8` was moved, or named by its absolute path (a
    requeue from another working directory): a directory is identified by its weights, not its path."""
    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer))
    model.save_pretrained(tmp_path / "ck8")

    def identity(name: str | None) -> dict:
        model_args = ModelArguments(model_name_or_path=name)
        data_args = DataArguments(data_dir=str(tmp_path), source_lang="en", target_lang="de")
        return training.run_identity(model, tokenizer, model_args, data_args, tiny_run_args(tmp_path), None, data={})

    recorded = identity(str(tmp_path / "ck8"))
    write_json(tmp_path / "run_identity.json", recorded)
    (tmp_path / "ck8").rename(tmp_path / "moved")
    for name in (str(tmp_path / "moved"), os.path.relpath(tmp_path / "moved")):
        training._check_same_run(identity(name), tmp_path, None)
        assert not identity_differences(recorded, identity(name)), "averaged as one run"
    tiny_model(len(tokenizer), seed=1).save_pretrained(tmp_path / "other")  # another model under another path
    both = r'model_name_or_path: ".*ck8" vs ".*other"; model_weights: model\.safetensors changed \(recorded vs now\)'
    with pytest.raises(RunMismatchError, match=both):
        training._check_same_run(identity(str(tmp_path / "other")), tmp_path, None)
    for name, shown in ((None, "null"), ("owner/ck8", '"owner/ck8"')):  # from scratch, or a Hub repo: another run
        with pytest.raises(RunMismatchError, match=rf'model_name_or_path: ".*ck8" vs {shown}'):
            training._check_same_run(identity(name), tmp_path, None)
    # The base averaged again in place (its fine-tune's checkpoints hold their own weights): the same directory,
    # as before the field; once refused, offering only --overwrite_output_dir, which deletes the run's checkpoints.
    write_json(tmp_path / "run_identity.json", identity(str(tmp_path / "moved")))
    tiny_model(len(tokenizer), seed=2).save_pretrained(tmp_path / "moved")
    training._check_same_run(identity(str(tmp_path / "moved")), tmp_path, None)
    recorded_before = {key: value for key, value in recorded.items() if key != "model_weights"}
    write_json(tmp_path / "run_identity.json", recorded_before)  # recorded before the field: compared by path
    with pytest.raises(RunMismatchError, match=r'model_name_or_path: ".*ck8" vs ".*moved"'):
        training._check_same_run(identity(str(tmp_path / "moved")), tmp_path, None)


def test_a_requeue_at_another_model_revision_is_another_run_and_an_identity_recorded_before_the_field_is_not(
    tmp_path,
):
    def identity(revision: str | None) -> dict:
        model_args = ModelArguments(model_name_or_path="owner/model", model_revision=revision)
        data_args = DataArguments(data_dir=str(tmp_path), source_lang="en", target_lang="de")
        tokenizer = word_tokenizer()
        model = tiny_model(len(tokenizer))
        return training.run_identity(model, tokenizer, model_args, data_args, tiny_run_args(tmp_path), None, data={})

    write_json(tmp_path / "run_identity.json", identity("v1"))
    with pytest.raises(RunMismatchError, match=r'model_revision: "v1" vs "v2" \(recorded vs now\)'):
        training._check_same_run(identity("v2"), tmp_path, None)
    recorded_before = {key: value for key, value in identity(None).items() if key != "model_revision"}
    write_json(tmp_path / "run_identity.json", recorded_before)
    for revision in (None, "v2"):  # a run recorded before the field existed, pinned or not: the same run
        training._check_same_run(identity(revision), tmp_path, None)
        assert not identity_differences(recorded_before, identity(revision)), "averaged as one run"


def test_fine_tuning_a_hub_repo_reads_it_at_the_commit_of_its_first_read(hub_here, tmp_path):
    """Its config, tokenizer, weights and conversion record are read minutes apart (the data is read in between):
    each followed the branch, so a push landing in between fine-tuned one model's weights with the next one's
    tokenizer, or recorded the next one's origin."""
    from modeling.hub import push_model_dir
    from modeling.training import _revision_of, check_fine_tuning_source

    model, tokenizer = save_tiny_checkpoint(tmp_path / "first")
    tiny_translator(len(tokenizer), seed=1).save_pretrained(tmp_path / "second")
    tokenizer.save_pretrained(tmp_path / "second")
    push_model_dir(tmp_path / "first", "tester/base", token=HUB_TOKEN)
    model_args = ModelArguments(model_name_or_path="tester/base")
    assert check_fine_tuning_source(model_args) == TransformerConfig.model_type
    push_model_dir(tmp_path / "second", "tester/base", token=HUB_TOKEN)
    loaded = AutoModelForSeq2SeqLM.from_pretrained("tester/base", **_revision_of("tester/base", model_args))
    assert all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in model.state_dict().items())


def test_a_requeue_reads_the_hub_dataset_at_the_commit_its_launch_read(hub_here, tmp_path, datasets_cache, caplog):
    """Each launch read the dataset's main branch: a push to the dataset between a run's launch and its requeue
    trained the rest of the run on the new data, without a word (the identity recorded the dataset's name only)."""
    first = push_translation_dataset(hub_here[0], "tester/corpus", {"train": synthetic_pairs(40)})
    data = DataArguments(dataset="tester/corpus", language_pair="de-en", source_lang="en", target_lang="de")
    data.vocab_size = 64
    run = tmp_path / "run"
    settings = {"eval_strategy": "no"}
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, **settings))
    assert read_run_identity(run)["dataset_commit"] == first
    assert json.loads((run / "data_stats.json").read_text())["dataset_commit"] == first  # for the card's data table
    second = push_translation_dataset(hub_here[0], "tester/corpus", {"train": synthetic_pairs(40, seed=1)})
    with caplog.at_level(logging.INFO, logger="modeling.training"):
        train(
            ModelArguments(preset="tiny", **TINY),
            data,
            tiny_run_args(run, max_steps=4, resume_from_checkpoint="last", **settings),
        )
    assert f"Reading tester/corpus at commit {first}, as the run's launch did" in caplog.text
    assert read_run_identity(run / "checkpoint-4")["dataset_commit"] == first
    with pytest.raises(ValueError, match=r"^--dataset_revision names a version of --dataset's Hub repo: give that"):
        DataArguments(data_dir=str(tmp_path), dataset_revision=first)
    data.dataset_revision = "main"  # asked for by name: another run's data
    with pytest.raises(RunMismatchError, match=rf'different run: dataset_commit: "{first}" vs "{second}" \(recorded'):
        train(
            ModelArguments(preset="tiny", **TINY),
            data,
            tiny_run_args(run, max_steps=6, resume_from_checkpoint="last", **settings),
        )


def test_a_requeue_reads_the_hub_model_fine_tuned_at_the_commit_its_launch_read(
    hub_here, tmp_path, datasets_cache, caplog
):
    """Each launch read the model repo's main branch: a push to it between a run's launch and its requeue gave the
    rest of the run's checkpoints and its final model the new commit's generation config (and tokenizer), without
    a word (the identity recorded the repo's name only)."""
    from modeling.hub import push_model_dir

    model, tokenizer = save_tiny_checkpoint(tmp_path / "first")
    model.generation_config.num_beams = 4
    model.generation_config.save_pretrained(tmp_path / "first")
    other = tiny_translator(len(tokenizer), seed=1)
    other.generation_config.num_beams = 2
    other.save_pretrained(tmp_path / "second")
    tokenizer.save_pretrained(tmp_path / "second")
    push_model_dir(tmp_path / "first", "tester/base", token=HUB_TOKEN)
    first = pinned_commit("tester/base", None)
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de")
    run = tmp_path / "run"
    settings = {"eval_strategy": "no", "resume_from_checkpoint": "last"}
    train(ModelArguments(model_name_or_path="tester/base"), data, tiny_run_args(run, **settings))
    push_model_dir(tmp_path / "second", "tester/base", token=HUB_TOKEN)
    with caplog.at_level(logging.INFO, logger="modeling.training"):
        train(ModelArguments(model_name_or_path="tester/base"), data, tiny_run_args(run, max_steps=4, **settings))
    assert json.loads((run / "generation_config.json").read_text())["num_beams"] == 4
    assert f"Reading tester/base at commit {first}, as the run's launch did" in caplog.text
    assert read_run_identity(run / "checkpoint-4")["model_commit"] == first


def test_a_hub_tokenizer_that_cannot_be_loaded_is_named_in_one_line_before_the_data_is_read(
    hub_here, tmp_path, monkeypatch
):
    """Before, it failed once the data was read and cleaned, in transformers' two lines: "We couldn't connect to
    'https://huggingface.co' to load the files ... Check your internet connection ...", for a repo without a
    tokenizer, one that does not exist, a typo'd local path and an offline cache without it alike."""
    import huggingface_hub
    from huggingface_hub import HfApi

    from modeling.hub import push_model_dir

    save_tiny_checkpoint(tmp_path / "model")
    push_model_dir(tmp_path / "model", "tester/with_tokenizer", token=HUB_TOKEN)
    api = HfApi(endpoint=hub_here[0], token=HUB_TOKEN)
    api.create_repo("tester/without_tokenizer")
    api.upload_file(
        path_or_fileobj=tmp_path / "model" / "config.json",
        path_in_repo="config.json",
        repo_id="tester/without_tokenizer",
    )
    training._check_tokenizer_path("tester/with_tokenizer")
    for repo in ("tester/without_tokenizer", "tester/absent"):
        with pytest.raises(ValueError) as error:
            training._check_tokenizer_path(repo)
        assert str(error.value) == (
            f"--tokenizer_name_or_path {repo} is no local directory, and no Hub repo you can read holds a tokenizer "
            "(tokenizer.json or tokenizer_config.json) there"
        )
    with pytest.raises(ValueError, match=r"^--tokenizer_name_or_path \./bpe does not exist$"):
        training._check_tokenizer_path("./bpe")
    # The model's repo at the model's revision, as the tokenizer is then loaded: not at main, which has one now.
    without = api.model_info("tester/without_tokenizer").sha
    for name in ("tokenizer.json", "tokenizer_config.json"):
        api.upload_file(
            path_or_fileobj=tmp_path / "model" / name, path_in_repo=name, repo_id="tester/without_tokenizer"
        )
    training._check_tokenizer_path("tester/without_tokenizer")
    pinned = ModelArguments(
        model_name_or_path="tester/without_tokenizer",
        model_revision=without,
        tokenizer_name_or_path="tester/without_tokenizer",
    )
    with pytest.raises(
        ValueError,
        match=rf"holds a tokenizer \(tokenizer.json or tokenizer_config.json\) there at revision {without}$",
    ):
        training._check_run_arguments(pinned, DataArguments(), tiny_run_args(tmp_path / "run"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match=r"^'tester/absent' is not in the Hub cache .*keeps it from the Hub"):
        training._check_tokenizer_path("tester/absent")


def test_the_sequences_truncated_to_max_length_are_counted_in_data_stats(tmp_path, datasets_cache):
    """Pairs over --max_length tokens are cut (their </s> kept: a cut target teaches the model to stop there); the
    count was only logged, and the run's records, which the card shows, said nothing of it."""
    data = DataArguments(
        data_dir=str(write_corpus(tmp_path / "data", 40, word_for_word)),
        source_lang="en",
        target_lang="de",
        vocab_size=64,
        max_length=4,
    )
    run = tmp_path / "run"
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, eval_strategy="no"))
    stats = json.loads((run / "data_stats.json").read_text())["truncated_to_max_length"]
    tokenizer = AutoTokenizer.from_pretrained(run)
    lines = [(tmp_path / "data" / f"train.{lang}").read_text().splitlines() for lang in ("en", "de")]
    over = sum(len(ids) > 4 for side in lines for ids in tokenizer(side)["input_ids"])
    assert over > 0 and stats == {"max_length": 4, "sequences": {"train": over}}


def test_the_records_of_a_paper_schedule_run_name_its_schedule_not_the_trainers(tmp_path):
    """With the paper's schedule (the default) the Trainer's `lr_scheduler_type` ("linear") is not what ran: the
    card read from training_args.json would show a linear decay."""
    for paper in (True, False):
        args = TranslationTrainingArguments(
            output_dir=str(tmp_path / str(paper)), report_to="none", use_cpu=True, paper_schedule=paper
        )
        write_run_records(args)
    paper = json.loads((tmp_path / "True" / "training_args.json").read_text())
    assert "lr_scheduler_type" not in paper and "warmup^-1.5" in paper["learning_rate_schedule"]
    linear = json.loads((tmp_path / "False" / "training_args.json").read_text())
    assert linear["lr_scheduler_type"] == "linear" and "learning_rate_schedule" not in linear


def test_a_requeue_that_fails_leaves_no_preemption_record_of_the_launch_it_resumes(tmp_path, monkeypatch):
    """preempted.json is the launch's: a requeue removes it as it starts, so that one failing after that (a bug, a
    full disk) is not read by the requeue loop as preempted again, and requeued for ever."""
    run = tmp_path / "run"
    training._stop_preempted(training_args(run), "SIGTERM", 2, None, together=False)

    def failed(*args, **kwargs):
        raise RuntimeError("the requeue failed")

    monkeypatch.setattr(training, "_prepare_run", failed)
    data = DataArguments(data_dir=str(tmp_path / "data"), source_lang="en", target_lang="de", vocab_size=64)
    with pytest.raises(RuntimeError, match="the requeue failed"):
        train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, resume_from_checkpoint="last"))
    assert not (run / "preempted.json").exists()


def test_a_local_model_directory_named_without_a_slash_is_read_from_disk_not_asked_of_the_hub(tmp_path, monkeypatch):
    """`--model_name_or_path pretrained`, a directory in the working directory, is also a well-formed Hub repo id:
    the directory is what is meant."""
    saved_tiny_model(tmp_path / "pretrained")
    monkeypatch.chdir(tmp_path)

    def asked(*args, **kwargs):
        raise AssertionError("the Hub was asked for a local directory")

    monkeypatch.setattr(training, "pinned_commit", asked)
    monkeypatch.setattr(training, "offline_cache_error", asked)
    model_args = ModelArguments(model_name_or_path="pretrained")
    assert check_fine_tuning_source(model_args) == TransformerConfig.model_type
    assert model_args.model_commit is None


def test_the_data_stats_name_the_corpus_a_local_directory_or_a_hub_dataset(tmp_path):
    """The card's data table and its `datasets` metadata come from data_stats.json's `dataset`."""
    local = DataArguments(data_dir="corpus/wmt14")
    hub = DataArguments(dataset="wmt/wmt14", language_pair="de-en")
    for data_args, directory in ((local, tmp_path / "local"), (hub, tmp_path / "hub")):
        args = TranslationTrainingArguments(output_dir=str(directory), report_to="none", use_cpu=True)
        write_run_records(args, data_args, train_pairs=3)
    assert json.loads((tmp_path / "local" / "data_stats.json").read_text())["dataset"] == "corpus/wmt14"
    assert json.loads((tmp_path / "hub" / "data_stats.json").read_text())["dataset"] == "wmt/wmt14"


def test_a_process_whose_main_process_cannot_train_there_stops_with_a_line_naming_the_directory(tmp_path, monkeypatch):
    """Another rank than the main one holds no refusal of its own: it stops with one naming output_dir (once, a
    TypeError from raising None)."""
    monkeypatch.setattr(TranslationTrainingArguments, "process_index", property(lambda self: 1))
    monkeypatch.setattr(training, "any_rank", lambda flag, device: True)  # the main process refused
    with pytest.raises(OutputDirectoryInUseError) as refused:
        with training.training_lock(training_args(tmp_path / "run")):
            pass
    assert str(refused.value) == f"{tmp_path / 'run'}: the main process cannot train there (it says why)"


@pytest.mark.parametrize("save_strategy", ["no", "steps"])
def test_a_push_to_a_private_repo_stays_private(save_strategy, tmp_path, datasets_cache, monkeypatch):
    """With a checkpoint of the last update the push runs under the preemption handlers, without one not: both
    push with --hub_private_repo."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    monkeypatch.setattr(hub_module, "prepare_push", lambda training_args: hub_module.HubTarget(REPO_ID, HUB_TOKEN))
    pushes = []
    monkeypatch.setattr(hub_module, "push_trained_model", lambda *args, **kwargs: pushes.append(kwargs))
    args = tiny_run_args(
        tmp_path / "run", save_strategy=save_strategy, push_to_hub=True, hub_token=HUB_TOKEN, hub_private_repo=True
    )
    train(ModelArguments(preset="tiny", **TINY), data, args)
    assert pushes == [{"private": True}]


def test_a_push_after_averaging_uploads_the_average(tmp_path, datasets_cache, monkeypatch):
    """The model of Sec. 6.1 is the average of the last checkpoints: --push_to_hub uploads it, not the final model."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    monkeypatch.setattr(hub_module, "prepare_push", lambda training_args: hub_module.HubTarget(REPO_ID, HUB_TOKEN))
    pushes = []
    monkeypatch.setattr(
        hub_module,
        "push_trained_model",
        lambda target, model_dir, output_dir, what, **kw: pushes.append((model_dir, what)),
    )
    run = tmp_path / "run"
    args = tiny_run_args(run, max_steps=4, average_last_checkpoints=2, push_to_hub=True, hub_token=HUB_TOKEN)
    train(ModelArguments(preset="tiny", **TINY), data, args)
    assert [(Path(model_dir), what) for model_dir, what in pushes] == [(run / "averaged", "the averaged model")]


def test_without_a_checkpoint_of_the_last_update_a_signal_during_the_push_is_the_callers(
    tmp_path, datasets_cache, monkeypatch
):
    """Stopped there, the requeue would train every update again (no checkpoint holds them) to push: the push goes
    on under the handlers from before the run, and the run ends as finished."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    monkeypatch.setattr(hub_module, "prepare_push", lambda training_args: hub_module.HubTarget(REPO_ID, HUB_TOKEN))
    pushed, received = [], []

    def signalled_while_pushing(target, model_dir, *arguments, **kwargs):
        signal.raise_signal(signal.SIGUSR1)
        pushed.append(model_dir)  # the rest of the upload

    monkeypatch.setattr(hub_module, "push_trained_model", signalled_while_pushing)
    run = tmp_path / "run"
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))  # the caller's handler
    try:
        train(
            ModelArguments(preset="tiny", **TINY),
            data,
            tiny_run_args(run, save_strategy="no", push_to_hub=True, hub_token=HUB_TOKEN),
        )
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert received == [signal.SIGUSR1] and pushed == [run]
    assert not (run / "preempted.json").exists()


def test_a_given_tokenizer_is_checked_on_the_first_pair_even_of_a_one_pair_corpus(tmp_path):
    """The check encodes one training pair: a corpus of one (a smoke test of a fine-tuning) has only the first."""
    word_tokenizer().save_pretrained(tmp_path / "tokenizer")
    text = datasets.Dataset.from_dict({"translation": [{"en": "the small dog", "de": "der kleine Hund"}]})
    model_args = ModelArguments(tokenizer_name_or_path=str(tmp_path / "tokenizer"))
    data = DataArguments(source_lang="en", target_lang="de")
    tokenizer = training._tokenizer(model_args, data, training_args(tmp_path / "run"), text, 64)
    assert tokenizer.get_vocab() == word_tokenizer().get_vocab()


def test_a_requeue_records_the_batches_of_its_checkpoint_where_it_adopts_them(tmp_path, datasets_cache):
    """training_args.json, which the card shows, must say how the run trains: with tokens_per_update, the resumed
    checkpoint's batches per update (here, as if trained by 2 processes), not those derived for this launch."""
    data_dir = write_corpus(tmp_path / "data", 40, word_for_word)
    data = DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de", vocab_size=64)
    run = tmp_path / "run"
    settings = {"save_steps": 1, "tokens_per_update": 200, "max_tokens_per_device": 1000}
    train(ModelArguments(preset="tiny", **TINY), data, tiny_run_args(run, max_steps=1, **settings))
    first = json.loads((run / "training_args.json").read_text())
    assert (first["gradient_accumulation_steps"], first["max_tokens_per_device"]) == (1, 345)
    marker = run / "checkpoint-1" / "checkpoint_complete.json"
    record = json.loads(marker.read_text())
    marker.write_text(json.dumps({**record, "batching": {**record["batching"], "processes": 2}}))
    resumed = tiny_run_args(run, max_steps=2, resume_from_checkpoint="last", **settings)
    train(ModelArguments(preset="tiny", **TINY), data, resumed)
    records = json.loads((run / "training_args.json").read_text())
    assert (records["gradient_accumulation_steps"], records["max_tokens_per_device"]) == (2, 345)


def test_a_bpe_whose_save_stops_midway_leaves_no_tokenizer_json_for_the_requeue_to_take_for_whole(
    tmp_path, monkeypatch
):
    """tokenizer.json is what tells a requeue that the BPE is there: it is moved into output_dir last."""
    text = datasets.Dataset.from_dict({"translation": [{"en": "the small dog", "de": "der kleine Hund"}] * 4})
    replace = os.replace

    def stopped_at_the_config(source, target):
        if Path(target).name == "tokenizer_config.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(files_module.os, "replace", stopped_at_the_config)
    data = DataArguments(source_lang="en", target_lang="de")
    with pytest.raises(OSError):
        training._tokenizer(ModelArguments(), data, training_args(tmp_path / "run"), text, 64)
    assert not (tmp_path / "run" / "tokenizer.json").exists()


def test_the_bleu_sample_is_the_same_sorted_subset_whatever_the_seed():
    """Every run, whatever its seed, scores BLEU on the same validation sentences, in the split's order; a sample as
    large as the split is the split."""
    validation = datasets.Dataset.from_dict({"row": list(range(20))})
    samples = []
    for seed in (0, 1):
        transformers.set_seed(seed)  # the run's seed, set before the sample is drawn
        samples.append(training.bleu_sample(validation, 5)["row"])
    assert samples[0] == samples[1] == sorted(set(samples[0])) and len(samples[0]) == 5
    assert training.bleu_sample(validation, 20) is validation
