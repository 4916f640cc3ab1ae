"""Tests of modeling/trainer.py: token budgets through the Trainer, the step-1 learning rate, gradient accumulation,
several processes, label smoothing in the fused loss, resuming. Everything is synthetic and tiny."""

import errno
import json
import logging
import math
import multiprocessing
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    copy_dataset,
    equal_length_halves,
    losses,
    make_trainer,
    seeded_marian,
    subprocess_env,
    tiny_model,
    training_args,
    word_tokenizer,
)
from safetensors.torch import load_file, save_file
from torch.nn.modules.module import _IncompatibleKeys
from torch.utils.tensorboard import SummaryWriter
from transformers import EvalPrediction, TrainerCallback, modeling_utils, set_seed
from transformers.trainer_pt_utils import LabelSmoother

import modeling.trainer as trainer_module
from modeling.averaging import average_checkpoints, last_checkpoints
from modeling.callbacks import PREEMPTION_SIGNALS
from modeling.checkpoints import (
    COMPLETE_MARKER,
    checkpoint_problems,
    complete_checkpoints,
    latest_complete_checkpoint,
    list_checkpoints,
    staging_directories,
)
from modeling.files import DiskFullError, UnwritableError
from modeling.schedule import noam_learning_rate
from modeling.trainer import (
    SaveFailedOnAnotherProcessError,
    TokenBudgetSeq2SeqTrainer,
    bleu_metrics,
    check_sharding,
    evaluation_metrics,
    start_loader_worker,
)


def one_sgd_update(output_dir: Path, max_tokens: int, **overrides) -> dict[str, torch.Tensor]:
    """Weights after one SGD update with the step-1 rate d_model^-0.5 (warmup 1); SGD, unlike Adam, shows any
    error in the scale of the gradient."""
    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer), dropout=0.0)
    settings = {"max_steps": 1, "optim": "sgd", "warmup_steps": 1, "max_tokens_per_device": max_tokens}
    args = training_args(output_dir, **settings, **overrides)
    make_trainer(args, equal_length_halves(len(tokenizer)), tokenizer, model).train()
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_same_update(actual: dict, expected: dict, initial: dict) -> None:
    moved = max((expected[name] - initial[name]).abs().max().item() for name in expected)
    assert moved > 1e-3, "the update should move the weights"
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-5, rtol=0, msg=name)


def test_first_trainer_update_uses_the_step_one_rate(tmp_path):
    class RecordLearningRate(TrainerCallback):
        def __init__(self):
            self.rates = []

        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            self.rates.append(optimizer.param_groups[0]["lr"])

    tokenizer = word_tokenizer()
    args = training_args(tmp_path, max_steps=3, warmup_steps=2, learning_rate=0.5, max_tokens_per_device=36)
    record = RecordLearningRate()
    model = tiny_model(len(tokenizer), dropout=0.0)
    trainer = make_trainer(args, equal_length_halves(len(tokenizer)), tokenizer, model)
    trainer.add_callback(record)
    trainer.train()
    expected = [0.5 * noam_learning_rate(step, 32, 2) for step in (1, 2, 3)]
    assert record.rates == pytest.approx(expected, rel=1e-12)
    logged = [entry["learning_rate"] for entry in trainer.state.log_history if "loss" in entry]
    assert logged == pytest.approx(expected, rel=1e-12)


def test_tokens_per_update_and_accumulation_steps_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        training_args(tmp_path, tokens_per_update=25000, gradient_accumulation_steps=2)


def test_a_ddp_backend_in_a_one_process_run_is_ignored(tmp_path, caplog, no_launcher):
    """A config written for torchrun, requeued as one process: accelerate would fail, naming no setting."""
    with caplog.at_level(logging.INFO, logger="modeling.arguments"):
        args = training_args(tmp_path, ddp_backend="gloo")
    assert args.ddp_backend is None and args.world_size == 1
    assert "One process: ddp_backend='gloo' is not needed, ignoring it" in caplog.text


def test_the_precision_accelerate_launch_passes_on_is_what_the_arguments_record(tmp_path, monkeypatch, caplog):
    """A default accelerate config with `mixed_precision: bf16` (from another project) trained the run under bf16
    autocast while training_args.json and the card said bf16: false, fp16: false."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    args = training_args(tmp_path)
    assert (args.mixed_precision, args.bf16, args.fp16) == ("bf16", True, False)
    assert (args.to_dict()["bf16"], args.to_dict()["fp16"]) == (True, False)
    assert "Training with bf16 autocast, as ACCELERATE_MIXED_PRECISION=bf16 asks" in caplog.text
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # accelerate trains float32 on a CPU
    assert (training_args(tmp_path).fp16, training_args(tmp_path).mixed_precision) == (False, "fp16")
    caplog.clear()
    given = training_args(tmp_path, bf16=True)  # the arguments' own choice wins, as in the Trainer
    assert (given.mixed_precision, given.bf16, given.fp16) == ("bf16", True, False)
    assert "autocast" not in caplog.text, "what was given is not said to come from accelerate"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert (training_args(tmp_path).bf16, training_args(tmp_path).fp16) == (False, False)


def test_where_one_batch_holds_too_many_tokens_per_update_the_batches_are_made_smaller(tmp_path):
    tokenizer = word_tokenizer()
    settings = {"max_steps": 2, "warmup_steps": 1, "save_strategy": "steps", "save_steps": 2}
    args = training_args(tmp_path, max_tokens_per_device=1000, tokens_per_update=28, **settings)
    trainer = make_trainer(args, equal_length_halves(len(tokenizer)), tokenizer, tiny_model(len(tokenizer)))
    assert (trainer.args.gradient_accumulation_steps, trainer.args.max_tokens_per_device) == (1, 62)
    assert args.max_tokens_per_device == 1000, "the caller's arguments stay as given"
    trainer.train()
    per_update = [entry["target_tokens_per_update"] for entry in trainer.state.log_history[:2]]
    assert sum(per_update) == 56, "one of the two batches in each update: 28 target tokens on average"
    assert json.loads((tmp_path / "checkpoint-2" / "checkpoint_complete.json").read_text())["batching"] == {
        "processes": 1,
        "micro_batches_per_update": 1,
        "max_tokens_per_device": 62,
    }


RESUMED_BATCHING = {"warmup_steps": 1, "save_strategy": "steps", "save_steps": 1, "max_tokens_per_device": 1000}


def mixed_lengths_dataset(tokenizer):
    """24 copy-task sentences of 3 to 9 tokens: the batches of mixed lengths a resume or a preemption meets."""
    return copy_dataset(random.Random(2).choices(range(3, 10), k=24), len(tokenizer), seed=3)


def resume_an_earlier_versions_checkpoint(tmp_path: Path, caplog, unrecorded: tuple[str, ...]) -> None:
    """checkpoint-1 of a run of batches of 1000 tokens, its marker without the fields `unrecorded` (as an earlier
    version of this code wrote it), resumed with tokens_per_update=28, which derives batches of 62 tokens now:
    resumed with its own batches."""
    tokenizer, data = word_tokenizer(), equal_length_halves(len(word_tokenizer()))
    first = training_args(tmp_path, max_steps=1, **RESUMED_BATCHING)
    make_trainer(first, data, tokenizer, tiny_model(len(tokenizer))).train()
    marker = tmp_path / "checkpoint-1" / "checkpoint_complete.json"
    marker.write_text(json.dumps({k: v for k, v in json.loads(marker.read_text()).items() if k not in unrecorded}))
    args = training_args(tmp_path, max_steps=2, tokens_per_update=28, **RESUMED_BATCHING)
    resumed = make_trainer(args, data, tokenizer, tiny_model(len(tokenizer)))
    assert resumed.args.max_tokens_per_device == 62, "derived anew"
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert (resumed.args.gradient_accumulation_steps, resumed.args.max_tokens_per_device) == (1, 1000)
    assert "with its own batches (1 process(es) × 1 micro-batch(es) per update of at most 1000 tokens)" in caplog.text
    assert "other batches" not in caplog.text
    assert resumed.state.log_history[1]["target_tokens_per_update"] == 56, "one batch of all 8 examples, as before"


def test_a_resume_on_as_many_processes_keeps_the_batches_its_checkpoint_was_trained_with(tmp_path, caplog):
    # The checkpoint of an earlier version of this code: batches tokens_per_update did not make smaller, and a
    # marker that does not record what was asked.
    resume_an_earlier_versions_checkpoint(tmp_path, caplog, unrecorded=("batching_asked",))
    # Never batches larger than the memory now given: then the derived ones, with the warning.
    caplog.clear()
    tokenizer, data = word_tokenizer(), equal_length_halves(len(word_tokenizer()))
    smaller = training_args(
        tmp_path, max_steps=2, tokens_per_update=28, **{**RESUMED_BATCHING, "max_tokens_per_device": 500}
    )
    limited = make_trainer(smaller, data, tokenizer, tiny_model(len(tokenizer)))
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        limited.adopt_checkpoint_batching(tmp_path / "checkpoint-1")
    assert limited.args.max_tokens_per_device < 500 and "its own batches" not in caplog.text


def test_a_checkpoint_whose_marker_records_no_batching_resumes_with_the_batches_of_its_pickled_arguments(
    tmp_path, caplog
):
    """A marker written before 2026-12-03 records no batching: the batches derived anew replaced the checkpoint's
    without a word (another update size from there on, part of the epoch skipped or seen twice)."""
    resume_an_earlier_versions_checkpoint(tmp_path, caplog, unrecorded=("batching", "batching_asked"))
    # Trained by two processes (a random state saved by each): their batches per update, on the one there is now.
    checkpoint = tmp_path / "checkpoint-1"
    for rank in (0, 1):
        shutil.copy(checkpoint / "rng_state.pth", checkpoint / f"rng_state_{rank}.pth")
    (checkpoint / "rng_state.pth").unlink()
    caplog.clear()
    tokenizer, data = word_tokenizer(), equal_length_halves(len(word_tokenizer()))
    args = training_args(tmp_path, max_steps=2, tokens_per_update=28, **RESUMED_BATCHING)
    two = make_trainer(args, data, tokenizer, tiny_model(len(tokenizer)))
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        two.adopt_checkpoint_batching(checkpoint)
    assert (two.args.gradient_accumulation_steps, two.args.max_tokens_per_device) == (2, 1000)
    assert "with its own batches (1 process(es) × 2 micro-batch(es) per update of at most 1000 tokens)" in caplog.text
    # Without a random state, nothing tells how many processes trained it: the batches derived now, not none.
    for rank in (0, 1):
        (checkpoint / f"rng_state_{rank}.pth").unlink()
    caplog.clear()
    fresh = training_args(tmp_path, max_steps=2, tokens_per_update=28, **RESUMED_BATCHING)
    unknown = make_trainer(fresh, data, tokenizer, tiny_model(len(tokenizer)))
    derived = (unknown.args.gradient_accumulation_steps, unknown.args.max_tokens_per_device)
    assert derived == (1, 62)
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        unknown.adopt_checkpoint_batching(checkpoint)
    assert (unknown.args.gradient_accumulation_steps, unknown.args.max_tokens_per_device) == derived
    assert "with its own batches" not in caplog.text


def test_a_resume_asking_for_other_tokens_per_update_derives_its_batches(tmp_path, caplog):
    settings = {"warmup_steps": 1, "save_strategy": "steps", "save_steps": 1, "max_tokens_per_device": 1000}
    tokenizer, data = word_tokenizer(), equal_length_halves(len(word_tokenizer()))
    first = training_args(tmp_path, max_steps=1, tokens_per_update=28, **settings)
    make_trainer(first, data, tokenizer, tiny_model(len(tokenizer))).train()
    marker = json.loads((tmp_path / "checkpoint-1" / "checkpoint_complete.json").read_text())
    assert marker["batching_asked"] == {"tokens_per_update": 28, "max_tokens_per_device": 1000}
    changed = make_trainer(
        training_args(tmp_path, max_steps=2, tokens_per_update=56, **settings),
        data,
        tokenizer,
        tiny_model(len(tokenizer)),
    )
    derived = (changed.args.gradient_accumulation_steps, changed.args.max_tokens_per_device)
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        changed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert (changed.args.gradient_accumulation_steps, changed.args.max_tokens_per_device) == derived != (1, 62)
    assert "its own batches" not in caplog.text and "other batches" in caplog.text


def test_evaluation_batches_keep_the_budget_given_when_training_batches_are_made_smaller(tmp_path):
    tokenizer, data = word_tokenizer(), equal_length_halves(len(word_tokenizer()))
    losses_by_budget = []
    for tokens_per_update in (None, 28):
        args = training_args(
            tmp_path / str(tokens_per_update), max_tokens_per_device=1000, tokens_per_update=tokens_per_update
        )
        torch.manual_seed(0)
        trainer = make_trainer(args, data, tokenizer, tiny_model(len(tokenizer)), eval_dataset=data)
        assert len(trainer.get_eval_dataloader()) == 1, "all 8 examples in one batch of at most 1000 tokens"
        losses_by_budget.append(trainer.evaluate()["eval_loss"])
    assert losses_by_budget[0] == losses_by_budget[1]


def test_training_without_a_train_dataset_is_refused_naming_it(tmp_path):
    tokenizer = word_tokenizer()
    trainer = make_trainer(training_args(tmp_path, max_steps=1), None, tokenizer, tiny_model(len(tokenizer)))
    with pytest.raises(ValueError, match=r"^Training requires a train_dataset\.$"):
        trainer.train()


def test_evaluation_batches_come_in_length_order(tmp_path):
    """`get_eval_dataloader`'s promise: a compute_metrics sees the examples in the same order at every evaluation,
    the shortest batches first, not in the shuffled order of the training batches."""
    tokenizer = word_tokenizer()
    rng = random.Random(4)
    lengths = [rng.randint(3, 12) for _ in range(30)]
    dataset = copy_dataset(lengths, len(tokenizer), seed=4)
    args = training_args(tmp_path, max_tokens_per_device=40)
    trainer = make_trainer(args, dataset, tokenizer, tiny_model(len(tokenizer)), eval_dataset=dataset)
    longest = [batch["input_ids"].shape[1] for batch in trainer.get_eval_dataloader()]
    assert len(longest) > 3 and longest == sorted(longest)


def test_a_training_dataset_without_labels_is_refused_naming_it(tmp_path):
    tokenizer = word_tokenizer()
    dataset = copy_dataset([3, 4], len(tokenizer)).remove_columns("labels")
    trainer = make_trainer(training_args(tmp_path, max_steps=1), dataset, tokenizer, tiny_model(len(tokenizer)))
    with pytest.raises(ValueError, match=r"^The training dataset lacks \['labels'\]: tokenize it with "):
        trainer.train()


def test_an_evaluation_dataset_without_labels_is_refused_naming_it(tmp_path):
    tokenizer = word_tokenizer()
    dataset = copy_dataset([3, 4], len(tokenizer))
    trainer = make_trainer(training_args(tmp_path), dataset, tokenizer, tiny_model(len(tokenizer)))
    with pytest.raises(ValueError, match=r"^The evaluation dataset lacks \['labels'\]: tokenize it with "):
        trainer.evaluate(dataset.remove_columns("labels"))


def test_two_half_batches_accumulated_equal_one_full_batch(tmp_path):
    initial = tiny_model(len(word_tokenizer()), dropout=0.0).state_dict()
    full = one_sgd_update(tmp_path / "full", max_tokens=1000)  # one batch of all 8 examples
    # A budget of 36 cuts the 8 examples in 2 batches with 20 and 36 target tokens; asking for 56 tokens per
    # update makes the trainer accumulate 2 of them.
    accumulated = one_sgd_update(tmp_path / "halves", max_tokens=36, tokens_per_update=56)
    assert_same_update(accumulated, full, initial)


WORKER = """
import json, os, sys, torch
sys.path.insert(0, {tests_dir!r})
from helpers import copy_dataset, equal_length_halves, make_trainer, tiny_model, training_args, word_tokenizer
from modeling.callbacks import leave_process_group, lowest_and_highest_over_ranks
from modeling.trainer import TokenBudgetSeq2SeqTrainer, bleu_metrics

class RecordingTrainer(TokenBudgetSeq2SeqTrainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        rows = [[t for t in row if t != 0] for row in inputs["input_ids"].tolist()]
        with open(os.path.join({out!r}, f"batches_{{self.args.process_index}}.jsonl"), "a") as f:
            f.write(json.dumps(rows) + "\\n")
        return super().training_step(model, inputs, num_items_in_batch)

tokenizer = word_tokenizer()
model = tiny_model(len(tokenizer), dropout=0.0)
args = training_args({out!r}, max_steps=1, optim="sgd", warmup_steps=1, max_tokens_per_device=36, ddp_backend="gloo",
                     predict_with_generate=True, generation_max_length=4)
three = copy_dataset([5, 5, 9], len(tokenizer), seed=7)  # one batch, split in two for the two processes
trainer = make_trainer(args, equal_length_halves(len(tokenizer)), tokenizer, model, RecordingTrainer,
                       eval_dataset=three, bleu_dataset=three, compute_metrics=bleu_metrics(tokenizer, "de"))
metrics = trainer.train().metrics
metrics |= trainer.evaluate()
trainer.args.max_steps, trainer.args.num_train_epochs = -1, 3  # what a resume by epochs is checked against
metrics["updates_of_three_epochs"] = trainer._total_updates()
# `predict` takes the Trainer's batches of 8: accelerate completes the last one with repeats of the first examples.
eleven = copy_dataset([3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 9], len(tokenizer), seed=7)
predicted = trainer.predict(eleven, max_new_tokens=2)
metrics["eleven_test_loss"] = predicted.metrics["test_loss"]
metrics["eleven_predictions"] = predicted.predictions.tolist()
metrics["eleven_label_ids"] = predicted.label_ids.tolist()
trainer.compute_metrics = None  # BLEU takes one translation per example
two_each = trainer.predict(eleven, max_new_tokens=2, num_beams=2, num_return_sequences=2).predictions
metrics["eleven_two_each"] = two_each.tolist()
# A user's own compute_metrics (run_translation.py's), on token batches of unequal sizes on the two processes.
seen = []
trainer.compute_metrics = lambda prediction: seen.append(prediction) or {{}}
trainer.args.include_for_metrics = ["inputs"]
trainer.bleu_dataset = eleven
trainer.evaluate()
metrics["eleven_seen"] = [getattr(seen[0], name).tolist() for name in ("predictions", "label_ids", "inputs")]
if trainer.is_world_process_zero():
    torch.save(model.state_dict(), os.path.join({out!r}, "weights.pt"))
    with open(os.path.join({out!r}, "metrics.json"), "w") as f:
        json.dump(metrics, f)
assert lowest_and_highest_over_ranks(5 * args.process_index, args.device) == (0, 5)  # what resuming agrees on
del trainer, model  # as scripts/train.py holds none once train() returns: the DDP wrapper holds the group
leave_process_group()  # as scripts/train.py does: gloo left to interpreter shutdown can abort the worker
"""


def test_two_processes_match_one_process_over_the_same_global_batch(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER.format(tests_dir=str(Path(__file__).parent), out=str(tmp_path)))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker)]
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    rank_batches = [
        [json.loads(line) for line in (tmp_path / f"batches_{rank}.jsonl").read_text().splitlines()] for rank in (0, 1)
    ]
    assert [len(batches) for batches in rank_batches] == [1, 1], "each rank takes one of the two batches"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["updates_of_three_epochs"] == 3, "an epoch is one batch on each process"
    rows = [tuple(row) for batches in rank_batches for batch in batches for row in batch]
    expected = [tuple(row) for row in equal_length_halves(len(word_tokenizer()))["input_ids"]]
    assert sorted(rows) == sorted(expected), "the two ranks' batches are disjoint and cover the global batch"

    initial = tiny_model(len(word_tokenizer()), dropout=0.0).state_dict()
    single = one_sgd_update(tmp_path / "single", max_tokens=36, gradient_accumulation_steps=2)
    assert_same_update(torch.load(tmp_path / "weights.pt"), single, initial)

    # Evaluation: 3 examples in one token batch, split so that each of the two processes gets one batch and no
    # example is translated (and counted) twice.
    assert metrics["train_samples_per_second"] == pytest.approx(8 / metrics["train_runtime"], rel=1e-2)
    assert metrics["eval_sample_sentences"] == 3
    # Both losses are per labelled token of the 3 examples, the processes' batches of unequal sizes weighed so.
    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer), dropout=0.0)
    model.load_state_dict(torch.load(tmp_path / "weights.pt"))
    three = copy_dataset([5, 5, 9], len(tokenizer), seed=7)
    whole = make_trainer(training_args(tmp_path / "single"), three, tokenizer, model).data_collator(list(three))
    expected = LabelSmoother(epsilon=0.1)(model(**whole), whole["labels"]).item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["eval_sample_loss"] == pytest.approx(expected, rel=1e-5)
    # The 5 examples repeated on the second process counted twice: 4.305 where the 11 examples' loss is 4.367.
    eleven = copy_dataset([3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 9], len(tokenizer), seed=7)
    whole = make_trainer(training_args(tmp_path / "single"), eleven, tokenizer, model).data_collator(list(eleven))
    expected = LabelSmoother(epsilon=0.1)(model(**whole), whole["labels"]).item()
    assert metrics["eleven_test_loss"] == pytest.approx(expected, rel=1e-5)
    # One translation per example, in order, as on one process: not those of the repeats too (16 rows).
    args = training_args(tmp_path / "single", predict_with_generate=True, generation_max_length=4)
    one_process = make_trainer(args, eleven, tokenizer, model)
    predicted = one_process.predict(eleven, max_new_tokens=2)
    assert metrics["eleven_predictions"] == predicted.predictions.tolist()
    assert metrics["eleven_label_ids"] == predicted.label_ids.tolist()
    # With `num_return_sequences`, each example keeps its rows (`gather_for_metrics` would keep 11 of the 22).
    two_each = one_process.predict(eleven, max_new_tokens=2, num_beams=2, num_return_sequences=2).predictions
    assert metrics["eleven_two_each"] == two_each.tolist()
    # A user's compute_metrics sees one row per example, as on one process (no rows of -100 padding, scored as
    # empty sentences), the inputs too (gathered unpadded, they aborted gloo: "Received data size doesn't match").
    seen = []
    args = training_args(
        tmp_path / "single", predict_with_generate=True, generation_max_length=4, include_for_metrics=["inputs"]
    )
    one_process = make_trainer(
        args,
        eleven,
        tokenizer,
        model,
        eval_dataset=eleven,
        bleu_dataset=eleven,
        compute_metrics=lambda prediction: seen.append(prediction) or {},
    )
    one_process.evaluate()
    expected = [getattr(seen[0], name).tolist() for name in ("predictions", "label_ids", "inputs")]
    assert [unpadded(rows) for rows in metrics["eleven_seen"]] == [unpadded(rows) for rows in expected]


def unpadded(rows: list[list[int]]) -> list[list[int]]:
    """`rows` without their padding: the batch's pad (0) and -100, which pads the batches to one length."""
    return [[token for token in row if token not in (0, -100)] for row in rows]


def test_trainer_smooths_labels_in_the_models_fused_loss(tmp_path):
    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer), dropout=0.0)
    args = training_args(tmp_path, max_steps=1, max_tokens_per_device=36)
    dataset = equal_length_halves(len(tokenizer))
    trainer = make_trainer(args, dataset, tokenizer, model)
    assert trainer.label_smoother is None, "the Trainer's own smoother would smooth a second time"
    short = dataset.select([0, 2, 4, 6])  # the four of length 5: one batch
    batch = trainer.data_collator(list(short))
    loss = trainer.compute_loss(model, dict(batch))
    # The training forward fuses the loss and returns no logits (dropout is 0: the same forward gives them).
    expected = LabelSmoother(epsilon=0.1)(model(**batch, skip_logits=False), batch["labels"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    # Only `labels` is a label: an argument named like one would leave evaluation without a loss.
    assert trainer.label_names == ["labels"]
    assert trainer.evaluate(short)["eval_loss"] == pytest.approx(expected.item(), rel=1e-5)
    # The loss logged beside BLEU (the generating evaluation, `predict`) is smoothed too.
    args = training_args(tmp_path, max_steps=1, max_tokens_per_device=36, predict_with_generate=True)
    trainer = make_trainer(args, dataset, tokenizer, model)
    assert trainer.predict(short).metrics["test_loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert trainer.label_smoother is None, "set for the generating call only"


def test_a_model_without_the_fused_loss_is_smoothed_by_the_trainers_label_smoother(tmp_path):
    """A stock transformers model (MarianMT) has no `smoothing_epsilon` argument: it is not passed one."""
    tokenizer = word_tokenizer()
    model = seeded_marian(len(tokenizer)).eval()
    dataset = equal_length_halves(len(tokenizer))
    trainer = make_trainer(training_args(tmp_path, max_steps=1, max_tokens_per_device=36), dataset, tokenizer, model)
    assert trainer.label_smoother is not None
    batch = trainer.data_collator(list(dataset.select([0, 2])))
    given = []
    model.register_forward_pre_hook(lambda module, args, kwargs: given.append(set(kwargs)), with_kwargs=True)
    loss = trainer.compute_loss(model, dict(batch))
    assert given and "smoothing_epsilon" not in given[0], "its forward takes **kwargs: it would be passed on unseen"
    assert loss.item() == pytest.approx(LabelSmoother(epsilon=0.1)(model(**batch), batch["labels"]).item(), rel=1e-6)


def test_the_evaluation_loss_is_per_labelled_token_of_the_whole_split_whatever_its_batches(tmp_path):
    """The Trainer's own was the unweighted mean of its batches' means: the 3 tokens of a short last batch counted
    as much as the 30 of another, and the number changed with the token budget."""
    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer), dropout=0.0)
    split = copy_dataset([3, 10, 10, 10, 4, 6, 9, 5], len(tokenizer), seed=4)
    whole = make_trainer(training_args(tmp_path), split, tokenizer, model).data_collator(list(split))
    expected = LabelSmoother(epsilon=0.1)(model(**whole), whole["labels"]).item()
    for budget in (12, 30, 1000):
        args = training_args(tmp_path, max_tokens_per_device=budget, predict_with_generate=True)
        trainer = make_trainer(args, split, tokenizer, model)
        assert trainer.evaluate(split)["eval_loss"] == pytest.approx(expected, rel=1e-5), budget
        # The loss beside the translations, from another call of the model (`Seq2SeqTrainer.prediction_step`).
        assert trainer.predict(split, max_new_tokens=2).metrics["test_loss"] == pytest.approx(expected, rel=1e-5)


def test_predict_asked_for_the_loss_only_generates_nothing(tmp_path, monkeypatch):
    """`prediction_loss_only` (the flag, for a quick test loss) also where `predict_with_generate` is set."""
    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer), dropout=0.0)
    split = copy_dataset([3, 10, 4, 6], len(tokenizer), seed=4)
    args = training_args(tmp_path, predict_with_generate=True, prediction_loss_only=True)
    trainer = make_trainer(args, split, tokenizer, model)
    monkeypatch.setattr(model, "generate", lambda *args, **kwargs: pytest.fail("generated"))
    predicted = trainer.predict(split, max_new_tokens=2)
    assert predicted.predictions is None and math.isfinite(predicted.metrics["test_loss"])


def test_an_evaluation_batch_with_a_non_finite_loss_is_left_out_of_the_loss_with_a_warning(tmp_path, caplog):
    """As the Trainer does (`logging_nan_inf_filter`), but it said nothing: eval_loss was then that of part of the
    split, finite, and could rank best a model whose loss overflowed on the rest."""
    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer), dropout=0.0)
    split = copy_dataset([3, 10, 10, 10, 4, 6, 9, 5], len(tokenizer), seed=4)
    trainer = make_trainer(training_args(tmp_path, max_tokens_per_device=12), split, tokenizer, model)
    compute_loss, batches = trainer.compute_loss, []

    def first_batch_overflows(model, inputs, *args, **kwargs):
        batches.append(inputs["labels"])
        loss, outputs = compute_loss(model, inputs, *args, **kwargs)
        return (loss * float("inf") if len(batches) == 1 else loss), outputs

    trainer.compute_loss = first_batch_overflows
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):
        loss = trainer.evaluate(split)["eval_loss"]
    left_out = [[token for token in row if token != -100] for row in batches[0].tolist()]
    rest = trainer.data_collator([example for example in split if example["labels"] not in left_out])
    assert len(batches) > 2 and loss == pytest.approx(LabelSmoother(epsilon=0.1)(model(**rest), rest["labels"]).item())
    assert f"1 of the {len(batches)} batches evaluated had a non-finite loss" in caplog.text


def test_an_evaluation_whose_every_batch_is_non_finite_says_so_in_its_loss_not_in_a_warning(tmp_path, caplog):
    """No batch is left to average: eval_loss is then the Trainer's own, not finite, which says it; a warning that
    the batches were left out of it would be untrue."""
    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer), dropout=0.0)
    split = copy_dataset([3, 10, 10, 10, 4, 6, 9, 5], len(tokenizer), seed=4)
    trainer = make_trainer(training_args(tmp_path, max_tokens_per_device=12), split, tokenizer, model)
    compute_loss = trainer.compute_loss

    def overflows(model, inputs, *args, **kwargs):
        loss, outputs = compute_loss(model, inputs, *args, **kwargs)
        return loss * float("inf"), outputs

    trainer.compute_loss = overflows
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):
        loss = trainer.evaluate(split)["eval_loss"]
    assert not np.isfinite(loss) and "non-finite loss" not in caplog.text


def test_the_evaluation_steps_per_second_count_the_token_budget_batches(tmp_path):
    """The Trainer counted per_device_eval_batch_size (8) sentences per batch: 1 batch for these 8 sentences."""
    tokenizer = word_tokenizer()
    split = copy_dataset([3, 10, 10, 10, 4, 6, 9, 5], len(tokenizer), seed=4)
    args = training_args(tmp_path, max_tokens_per_device=12)
    trainer = make_trainer(args, split, tokenizer, tiny_model(len(tokenizer)))
    batches = len(trainer.get_eval_dataloader(split))
    assert batches > 1
    metrics = trainer.evaluate(split)
    assert metrics["eval_steps_per_second"] == pytest.approx(batches / metrics["eval_runtime"], rel=1e-2)
    assert trainer.state.log_history[-1]["eval_steps_per_second"] == metrics["eval_steps_per_second"]


def test_runtimes_and_rates_hold_when_the_system_clock_is_set_back(tmp_path, monkeypatch):
    """NTP setting the system clock back an hour after each update and each evaluation batch: the Trainer measures
    its runtimes with time.time(), and logged train_runtime -3599 s, eval_runtime -7199 s and negative rates."""
    wall, set_back = time.time, [0.0]
    monkeypatch.setattr(time, "time", lambda: wall() - set_back[0])

    class ClockSetBack(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            set_back[0] += 3600

        def on_prediction_step(self, args, state, control, **kwargs):
            set_back[0] += 3600

    tokenizer = word_tokenizer()
    args = training_args(tmp_path, max_steps=2, warmup_steps=1, max_tokens_per_device=12)
    args.include_num_input_tokens_seen = "all"  # every training log then holds train_runtime and its rate too
    split = copy_dataset([3, 10, 10, 10, 4, 6, 9, 5], len(tokenizer), seed=4)
    trainer = make_trainer(args, split, tokenizer, tiny_model(len(tokenizer)), callbacks=[ClockSetBack()])
    trainer.train()
    trainer.evaluate(split)
    timings = [
        (key, value) for entry in trainer.state.log_history for key, value in entry.items() if "_runtime" in key
    ]
    rates = [
        (key, value) for entry in trainer.state.log_history for key, value in entry.items() if "per_second" in key
    ]
    assert len(timings) == 4 and all(0 < seconds < 600 for _, seconds in timings), timings
    assert len(rates) > 4 and all(rate > 0 for _, rate in rates), rates


def test_resumed_run_has_the_losses_of_the_uninterrupted_run(tmp_path):
    tokenizer = word_tokenizer()
    dataset = mixed_lengths_dataset(tokenizer)

    def run(output_dir, resume=None):
        # Adam and dropout as in the paper: resuming must restore optimizer, schedule, RNG and data order.
        args = training_args(
            output_dir, max_steps=6, warmup_steps=2, max_tokens_per_device=48, save_strategy="steps", save_steps=3
        )
        trainer = make_trainer(args, dataset, tokenizer, tiny_model(len(tokenizer), dropout=0.1))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    uninterrupted = run(tmp_path / "a")
    batches_per_epoch = len(uninterrupted.get_train_dataloader())
    assert 3 < batches_per_epoch < 6, "steps 4-6 must finish one epoch and start the next"
    resumed = run(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-3"))
    expected, actual = losses(uninterrupted.state.log_history), losses(resumed.state.log_history)
    assert sorted(expected) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        assert actual[step] == pytest.approx(expected[step], rel=1e-6, abs=1e-7), step


def test_the_first_log_after_a_resume_says_it_covers_the_updates_since_the_checkpoint(tmp_path):
    settings = {"logging_steps": 4, "save_strategy": "steps", "save_steps": 3}
    resumable_run(tmp_path, **settings).train()
    resumed = resumable_run(tmp_path, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    logs = [entry for entry in resumed.state.log_history if "loss" in entry]
    # Update 4 alone: the loss of update 4, over the tokens of update 4.
    assert [(entry["step"], entry["updates_logged"]) for entry in logs] == [(4, 1)]


def test_resuming_a_checkpoint_at_max_steps_trains_nothing_and_loads_it(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)  # the Trainer's warnings, to caplog
    finished = resumable_run(tmp_path, save_strategy="steps", save_steps=3)
    finished.train()
    saved = load_file(tmp_path / "checkpoint-6" / "model.safetensors")
    # The same command requeued after its last update (killed while averaging or pushing, say), beside what a save
    # killed in an earlier launch left: no save of this one removes it.
    leftover = tmp_path / ".checkpoint-7.partial" / "checkpoint-7"
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"half")
    rerun = resumable_run(tmp_path, save_strategy="steps", save_steps=3)
    with caplog.at_level(logging.INFO):
        output = rerun.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    assert output.metrics == {} and output.global_step == rerun.state.global_step == 6
    assert "checkpoint-6 is at update 6 of 6: nothing left to train" in caplog.text
    assert sorted(path.name for path in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    assert not leftover.parent.exists()
    weights = rerun.model.state_dict()
    for name, tensor in saved.items():
        torch.testing.assert_close(weights[name], tensor, atol=0, rtol=0, msg=name)
    assert rerun.state.log_history == finished.state.log_history[:-1], "the checkpoint's, before the run's summary"
    # Loading the shared embedding fills its tied copies: they are not "missing keys".
    assert rerun.model.lm_head.weight is rerun.model.model.shared.weight
    assert "missing keys" not in caplog.text


def test_resuming_warns_of_no_missing_keys_for_the_tied_embedding_copies(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=4)
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert resumed.state.global_step == 4
    assert "missing keys" not in caplog.text
    # A key truly missing is still named, alone.
    real = next(
        name for name, _ in resumed.model.named_parameters() if name not in resumed.model.all_tied_weights_keys
    )
    with caplog.at_level(logging.WARNING):
        resumed._issue_warnings_after_load(_IncompatibleKeys([*resumed.model.all_tied_weights_keys, real], []))
    assert f"There were missing keys in the checkpoint model loaded: [{real!r}]." in caplog.text


# --- long runs: preemption, atomic checkpoints, rotation, a full disk -----------------------------------------


def resumable_run(output_dir: Path, trainer_class=None, eval_dataset=None, bleu_dataset=None, **overrides):
    """A 6-update run with Adam, dropout and 2 micro-batches per update: resuming must restore everything. With
    `bleu_dataset`, evaluations also translate it and score BLEU."""
    tokenizer = word_tokenizer()
    settings = {"max_steps": 6, "warmup_steps": 2, "max_tokens_per_device": 24, "gradient_accumulation_steps": 2}
    scoring = {}
    if bleu_dataset is not None:
        settings["predict_with_generate"] = True
        scoring = {"bleu_dataset": bleu_dataset, "compute_metrics": bleu_metrics(tokenizer, "de")}
    args = training_args(output_dir, **{**settings, **overrides})
    dataset = mixed_lengths_dataset(tokenizer)
    model = tiny_model(len(tokenizer), dropout=0.1)
    return make_trainer(
        args,
        dataset,
        tokenizer,
        model,
        trainer_class or TokenBudgetSeq2SeqTrainer,
        eval_dataset=eval_dataset,
        **scoring,
    )


def test_resuming_an_optimizer_state_of_other_parameters_is_refused_naming_the_counts(tmp_path):
    """An untied model saved before 2026-12-04 held an unused `shared` matrix, whose Adam state the resumed model
    has no parameter for: torch's message named no checkpoint and no cause."""
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    optimizer = tmp_path / "checkpoint-3" / "optimizer.pt"
    state = torch.load(optimizer, weights_only=True)
    state["param_groups"][0]["params"].append(max(max(group["params"]) for group in state["param_groups"]) + 1)
    torch.save(state, optimizer)
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3)
    with pytest.raises(ValueError, match=r"cannot resume .*checkpoint-3: its optimizer state holds (\d+) parameters"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))


@pytest.mark.parametrize(
    ("saved_with", "missing"),
    [
        ({"save_only_model": True}, "optimizer.pt and no scheduler.pt"),
        ({"lose": "scheduler.pt"}, "scheduler.pt"),  # another Trainer's checkpoint: no marker lists the file
        ({"lose": "optimizer.pt"}, "optimizer.pt"),
    ],
)
def test_resuming_a_checkpoint_without_optimizer_or_schedule_state_is_refused(tmp_path, saved_with, missing):
    """The Trainer loads neither state unless both are there, and trained on with Adam's moments at zero and the
    warmup begun again (at update 4 of a 2-update warmup, the rate of update 1), without a word."""
    settings = {key: value for key, value in saved_with.items() if key != "lose"}
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3, **settings).train()
    checkpoint = tmp_path / "checkpoint-3"
    if "lose" in saved_with:
        (checkpoint / saved_with["lose"]).unlink()
        (checkpoint / COMPLETE_MARKER).unlink()
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3)
    with pytest.raises(ValueError, match=rf"^Cannot resume from .*checkpoint-3: it holds no {missing} \("):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 0 and not (tmp_path / "checkpoint-6").exists()


@pytest.mark.parametrize("removed", ["before its trainer state is read", "once its optimizer state is read"])
def test_a_checkpoint_rotated_out_while_it_is_resumed_is_named_not_resumed_without_its_states(
    tmp_path, monkeypatch, removed
):
    """Resuming a run's checkpoint into another directory while that run trains on: its rotation removed it after the
    weights were loaded. Before, the Trainer skipped each state whose file was gone, without a word: the run trained
    from update 0 (Adam's moments at zero, the warmup begun again), or on with fresh random states."""
    source = tmp_path / "first"
    resumable_run(source, save_strategy="steps", save_steps=3, max_steps=3).train()
    checkpoint = source / "checkpoint-3"

    def rotate_out() -> None:
        if checkpoint.exists():
            checkpoint.rename(source / ".checkpoint-3.deleting")

    if removed == "before its trainer state is read":
        create_scheduler = TokenBudgetSeq2SeqTrainer.create_scheduler
        monkeypatch.setattr(
            TokenBudgetSeq2SeqTrainer,
            "create_scheduler",
            lambda *args, **kwargs: (rotate_out(), create_scheduler(*args, **kwargs))[1],
        )
    else:
        load = TokenBudgetSeq2SeqTrainer._load_optimizer_and_scheduler
        monkeypatch.setattr(
            TokenBudgetSeq2SeqTrainer, "_load_optimizer_and_scheduler", lambda *args: (load(*args), rotate_out())[0]
        )
    resumed = resumable_run(tmp_path / "second", save_strategy="steps", save_steps=3)
    with pytest.raises(FileNotFoundError) as refused:
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert str(refused.value) == (
        f"{checkpoint} was removed while it was resumed (by the save_total_limit rotation of a run still training "
        "there?): resume from a checkpoint that run keeps, or from a copy"
    )
    assert not list((tmp_path / "second").glob("checkpoint-*"))


class RunsWhenUnpickled:
    """Pickled, it makes a directory when unpickled: the code a pickle from elsewhere could run."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (str(self.path),)


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt"])
def test_a_checkpoints_optimizer_and_scheduler_states_are_read_as_tensors_only_never_run(tmp_path, name):
    """optimizer.pt and scheduler.pt are pickles, read before the Trainer's own loading to compare their settings
    (Adam's, the learning rate and warmup): read with weights_only, one holding code (a checkpoint from elsewhere)
    is refused before the code runs."""
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    state, ran = tmp_path / "checkpoint-3" / name, tmp_path / "ran"
    torch.save({**torch.load(state, weights_only=True), "extra": RunsWhenUnpickled(ran)}, state)
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert not ran.exists()


@pytest.mark.parametrize(
    ("changed", "refusal"),
    [
        ({"learning_rate": 2.0}, "--learning_rate 2 (the checkpoint's: 1)"),
        ({"warmup_steps": 5}, "--warmup_steps 5 (the checkpoint's: 2)"),
        (
            {"adam_beta2": 0.99, "weight_decay": 0.1},
            "--adam_beta1/--adam_beta2 0.9, 0.99 (the checkpoint's: 0.9, 0.98)",
        ),
        ({"weight_decay": 0.1}, "--weight_decay 0.1 (the checkpoint's: 0)"),
        ({"adam_epsilon": 1e-8}, "--adam_epsilon 1e-08 (the checkpoint's: 1e-09)"),
        ({"optim": "sgd"}, "--optim sgd (not the checkpoint's optimizer)"),
        (
            {"optim": "sgd", "optim_args": "momentum=0.9,nesterov=True"},
            "optimizer nesterov True (the checkpoint's: False)",
        ),
    ],
)
def test_resuming_with_settings_the_checkpoint_state_would_override_is_refused(tmp_path, changed, refusal):
    first = {"optim": "sgd", "optim_args": "momentum=0.9"} if "nesterov" in refusal else {}
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3, **first).train()
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3, **changed)
    with pytest.raises(ValueError, match="Cannot resume from .*checkpoint-3 with ") as refused:
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert refusal in str(refused.value) and "--model_name_or_path" in str(refused.value)
    assert max(losses(resumed.state.log_history), default=0) <= 3 and not (tmp_path / "checkpoint-6").exists()


def test_a_warmup_ratio_whose_count_a_longer_run_changes_is_refused_naming_the_ratio(tmp_path):
    """--warmup_steps 0.5 of a run requeued with more epochs: the refusal named "--warmup_steps 4", a count nobody
    gave, without the ratio or the run's length it came from."""
    by_epochs = {"max_steps": -1, "warmup_steps": 0.5, "save_strategy": "steps", "save_steps": 2}
    resumable_run(tmp_path, num_train_epochs=1, **by_epochs).train()
    longer = resumable_run(tmp_path, num_train_epochs=2, **by_epochs)
    with pytest.raises(ValueError, match=r"with --warmup_steps 0\.5 of 8 updates: 4 \(the checkpoint's: 2\)"):
        longer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


@pytest.mark.parametrize(
    ("saved", "refusal"),
    [
        ({"betas": (0.9, 0.98, 0.999)}, "--adam_beta1/--adam_beta2 0.9, 0.98 (the checkpoint's: 0.9, 0.98, 0.999)"),
        ({"weight_decay": None}, "--weight_decay 0 (the checkpoint's: None)"),
    ],
)
def test_an_optimizer_setting_saved_in_another_shape_is_refused_naming_it(tmp_path, saved, refusal):
    """A checkpoint whose optimizer state holds a setting as another number of values, or as no number (saved by
    another optimizer or version): refused like another value, not a TypeError or ValueError of the comparison."""
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    optimizer = tmp_path / "checkpoint-3" / "optimizer.pt"
    state = torch.load(optimizer, weights_only=True)
    state["param_groups"][0].update(saved)
    torch.save(state, optimizer)
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3)
    with pytest.raises(ValueError, match="Cannot resume from .*checkpoint-3 with ") as refused:
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert refusal in str(refused.value)


def test_resuming_with_true_takes_the_newest_complete_checkpoint_and_checks_it_like_a_path(tmp_path, caplog):
    with pytest.raises(ValueError, match=f"No complete checkpoint in {tmp_path} to resume from"):
        resumable_run(tmp_path, save_strategy="steps", save_steps=3).train(resume_from_checkpoint=True)
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    (tmp_path / "checkpoint-5").mkdir()  # incomplete: skipped, with a warning
    with pytest.raises(ValueError, match="--learning_rate 2 \\(the checkpoint's: 1\\)"):
        resumable_run(tmp_path, save_strategy="steps", save_steps=3, learning_rate=2.0).train(
            resume_from_checkpoint=True
        )
    assert "Skipping the incomplete checkpoint" in caplog.text
    shutil.rmtree(tmp_path / "checkpoint-5")
    counting = type("CountingMicroBatches", (SignalOnMicroBatch,), {"signal_at": 0})
    resumed = resumable_run(tmp_path, counting, save_strategy="steps", save_steps=3)
    assert resumed.train(resume_from_checkpoint=True).global_step == 6
    assert resumed.micro_batches == 6, "updates 4 to 6, two micro-batches each"
    rerun = resumable_run(tmp_path, save_strategy="steps", save_steps=3)
    assert rerun.train(resume_from_checkpoint=True).metrics == {}  # at the last update: nothing to train


@pytest.mark.parametrize(
    "settings",
    [
        {"max_steps": -1, "num_train_epochs": 2, "warmup_steps": 0.5},  # a warmup ratio of updates the epochs set
        {"optim": "sgd"},
        {"optim": "rmsprop"},  # torch's own epsilon, not adam_epsilon
        {"optim": "adafactor", "paper_schedule": False},  # epsilon a pair
        # not a LambdaLR: its state holds neither base rates nor rate functions
        {"paper_schedule": False, "lr_scheduler_type": "reduce_lr_on_plateau", "eval_strategy": "steps"},
    ],
)
def test_resuming_with_unchanged_settings_is_never_refused(tmp_path, settings):
    evaluated = mixed_lengths_dataset(word_tokenizer()) if "eval_strategy" in settings else None
    preempted = resumable_run(
        tmp_path, SignalOnMicroBatch, evaluated, save_strategy="steps", save_steps=100, eval_steps=100, **settings
    )
    preempted.train()  # stopped at update 3, its checkpoint saved
    assert preempted.preempted["step"] == 3
    resumed = resumable_run(
        tmp_path, None, evaluated, save_strategy="steps", save_steps=100, eval_steps=100, **settings
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert resumed.state.global_step == resumed.state.max_steps > 3


def test_rerunning_a_finished_epoch_run_trains_nothing_even_with_fractional_epochs(tmp_path):
    settings = {"max_steps": -1, "num_train_epochs": 1.5, "save_strategy": "steps", "save_steps": 100}
    finished = resumable_run(tmp_path, **settings)
    finished.train()
    total = finished.state.global_step
    assert latest_complete_checkpoint(tmp_path) == tmp_path / f"checkpoint-{total}"
    rerun = resumable_run(tmp_path, **settings)
    assert rerun.train(resume_from_checkpoint=str(tmp_path / f"checkpoint-{total}")).metrics == {}
    assert rerun.state.global_step == total


@pytest.mark.parametrize("load_best_model_at_end", [True, False])
def test_rerunning_a_finished_run_loads_its_best_checkpoint_as_the_end_of_training_did(
    tmp_path, load_best_model_at_end
):
    """Without `load_best_model_at_end` the end of training kept the last weights, though a best is recorded."""
    # The highest validation loss is the best: the first checkpoint stays the best.
    best_first = {"eval_strategy": "steps", "eval_steps": 1, "save_steps": 1, "save_strategy": "steps"}
    best_first |= {"metric_for_best_model": "eval_loss", "greater_is_better": True}
    best_first |= {"load_best_model_at_end": load_best_model_at_end}
    tokenizer = word_tokenizer()
    validation = copy_dataset([4, 5, 6], len(tokenizer), seed=5)
    finished = resumable_run(tmp_path, max_steps=3, eval_dataset=validation, **best_first)
    finished.train()
    best = Path(finished.state.best_model_checkpoint)
    assert best != tmp_path / "checkpoint-3"
    rerun = resumable_run(tmp_path, max_steps=3, eval_dataset=validation, **best_first)
    rerun.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    expected = load_file((best if load_best_model_at_end else tmp_path / "checkpoint-3") / "model.safetensors")
    weights = rerun.model.state_dict()
    assert all(torch.equal(weights[name], tensor) for name, tensor in expected.items())


@pytest.mark.parametrize("shorter", [{"max_steps": 2}, {"max_steps": -1, "num_train_epochs": 0.1}])
def test_a_resume_asking_for_fewer_updates_than_its_checkpoint_holds_is_refused_naming_the_max_steps_that_ends_it(
    tmp_path, shorter
):
    """It trained nothing and ended with the checkpoint's model, while training_args.json and the card said the shorter
    run (--max_steps 2 of a model of 4 updates), without a word."""
    resumable_run(tmp_path, max_steps=4, save_strategy="steps", save_steps=4).train()
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=4, **shorter)
    asked = "--max_steps 2" if shorter["max_steps"] > 0 else "--num_train_epochs 0.1"
    refusal = rf"checkpoint-4: it is at update 4, past the last update of this run \(\d, from {asked}\)"
    with pytest.raises(ValueError, match=refusal + "; to end the run at update 4, give --max_steps 4$"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert not resumed.state.global_step
    ended = resumable_run(tmp_path, save_strategy="steps", save_steps=4, max_steps=4)
    assert ended.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4")).metrics == {}


def test_rerunning_a_finished_one_update_run_trains_nothing(tmp_path):
    """max_steps=1 is a number of updates as any other: the Trainer's loop would make a second update."""
    resumable_run(tmp_path, max_steps=1, save_strategy="steps", save_steps=1).train()
    rerun = resumable_run(tmp_path, max_steps=1, save_strategy="steps", save_steps=1)
    output = rerun.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert output.metrics == {} and rerun.state.global_step == 1
    assert [path.name for path in list_checkpoints(tmp_path)] == ["checkpoint-1"]


def test_rerunning_a_finished_run_whose_best_checkpoint_was_deleted_keeps_the_weights_it_resumed(tmp_path, caplog):
    """A best checkpoint removed by hand (for the disk space) is forgotten with a warning; with none to load, the
    rerun keeps the weights of the checkpoint it resumed, as the end of training does where no best is known."""
    best_first = {"eval_strategy": "steps", "eval_steps": 1, "save_steps": 1, "save_strategy": "steps"}
    best_first |= {"metric_for_best_model": "eval_loss", "greater_is_better": True, "load_best_model_at_end": True}
    validation = copy_dataset([4, 5, 6], len(word_tokenizer()), seed=5)
    finished = resumable_run(tmp_path, max_steps=3, eval_dataset=validation, **best_first)
    finished.train()
    best = Path(finished.state.best_model_checkpoint)
    assert best != tmp_path / "checkpoint-3"
    shutil.rmtree(best)
    rerun = resumable_run(tmp_path, max_steps=3, eval_dataset=validation, **best_first)
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):
        output = rerun.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert output.metrics == {} and f"The run's best checkpoint {best.name} is not in {tmp_path}" in caplog.text
    weights = rerun.model.state_dict()
    for name, tensor in load_file(tmp_path / "checkpoint-3" / "model.safetensors").items():
        assert torch.equal(weights[name], tensor), name


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({"greater_is_better": False}, {"greater_is_better": True}),
        ({"metric_for_best_model": None, "load_best_model_at_end": False}, {}),
    ],
    ids=["the other direction", "a best asked for by the requeue only"],
)
@pytest.mark.parametrize("max_steps", [6, 3])  # 3: a finished run, run again, trains nothing and loads its best
def test_a_resume_with_another_rule_for_the_best_checkpoint_chooses_it_again_by_that_rule(
    tmp_path, first, then, max_steps, caplog
):
    """The Trainer compared the requeue's evaluations, by its rule, with the best the checkpoint's rule had kept: the
    best loaded at the end (here the highest loss, asked for the whole run by the records) was chosen by neither."""
    settings = {"eval_strategy": "steps", "eval_steps": 1, "save_steps": 1, "save_strategy": "steps"}
    settings |= {"load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "greater_is_better": True}
    validation = copy_dataset([4, 5, 6], len(word_tokenizer()), seed=5)
    resumable_run(tmp_path, max_steps=3, eval_dataset=validation, **(settings | first)).train()
    resumed = resumable_run(tmp_path, max_steps=max_steps, eval_dataset=validation, **(settings | then))
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    evaluated = {entry["step"]: entry["eval_loss"] for entry in resumed.state.log_history if "eval_loss" in entry}
    highest = max(evaluated, key=evaluated.get)
    assert len(evaluated) == max_steps and highest != 3
    assert resumed.state.best_model_checkpoint == str(tmp_path / f"checkpoint-{highest}")
    assert resumed.state.best_metric == evaluated[highest]
    weights = resumed.model.state_dict()
    for name, tensor in load_file(tmp_path / f"checkpoint-{highest}" / "model.safetensors").items():
        assert torch.equal(weights[name], tensor), name
    assert "chosen again among its evaluations" in caplog.text


@pytest.mark.parametrize("max_steps", [6, 3])  # 3: a finished run, run again, trains nothing and loads no best
def test_a_resume_evaluating_other_validation_data_chooses_the_best_checkpoint_anew(tmp_path, max_steps, caplog):
    """Validation files edited between launches (or another --max_length): the Trainer compared the requeue's
    scores with the best of the old data, so that the best kept and loaded at the end was chosen across two test
    sets, without a word."""
    settings = {"eval_strategy": "steps", "eval_steps": 1, "save_steps": 1, "save_strategy": "steps"}
    settings |= {"load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "greater_is_better": True}
    vocab_size = len(word_tokenizer())
    resumable_run(tmp_path, max_steps=3, eval_dataset=copy_dataset([9, 9, 9], vocab_size, seed=5), **settings).train()
    edited = copy_dataset([3, 3, 3], vocab_size, seed=6)  # shorter: lower losses, which the old best outranked
    resumed = resumable_run(tmp_path, max_steps=max_steps, eval_dataset=edited, **settings)
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert "with another validation split than its evaluations scored" in caplog.text
    assert "the best checkpoint (eval_loss) is chosen anew from this launch's evaluations" in caplog.text
    evaluated = {entry["step"]: entry["eval_loss"] for entry in resumed.state.log_history if "eval_loss" in entry}
    of_this_launch = {step: loss for step, loss in evaluated.items() if step > 3}
    best = max(of_this_launch, key=of_this_launch.get, default=3)
    assert max(evaluated.values()) > max(of_this_launch.values(), default=0), "an old score outranked them all"
    assert resumed.state.best_model_checkpoint == (str(tmp_path / f"checkpoint-{best}") if of_this_launch else None)
    weights = resumed.model.state_dict()
    for name, tensor in load_file(tmp_path / f"checkpoint-{best}" / "model.safetensors").items():
        assert torch.equal(weights[name], tensor), name


def test_a_resume_with_another_bleu_sample_keeps_a_best_checkpoint_chosen_by_the_validation_loss(tmp_path, caplog):
    """Another --bleu_sample_size changes the `eval_sample_*` scores only: a best chosen by `eval_loss` compares
    scores on the same validation split, and stays; the warning says the BLEU curve compares two samples."""
    settings = {"eval_strategy": "steps", "eval_steps": 1, "save_steps": 1, "save_strategy": "steps"}
    settings |= {"load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "greater_is_better": True}
    validation = copy_dataset([4, 5, 6], len(word_tokenizer()), seed=5)
    finished = resumable_run(tmp_path, max_steps=3, eval_dataset=validation, bleu_dataset=validation, **settings)
    finished.train()
    another_sample = validation.select([0])
    rerun = resumable_run(tmp_path, max_steps=3, eval_dataset=validation, bleu_dataset=another_sample, **settings)
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):
        rerun.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert "with another BLEU sample than its evaluations scored" in caplog.text
    assert "chosen anew" not in caplog.text
    assert rerun.state.best_model_checkpoint == finished.state.best_model_checkpoint is not None


@pytest.mark.parametrize("how", ["moved", "copied"])
@pytest.mark.parametrize("max_steps", [5, 3])  # 3: a finished run, run again, trains nothing and loads its best
def test_a_moved_or_copied_run_keeps_and_loads_its_own_best_checkpoint(tmp_path, how, max_steps, caplog):
    """The state names the best checkpoint by the path the run was saved in. Resumed after `mv` of the run, that
    path was gone: the Trainer forgot the best, rotation deleted it and the end kept the last weights; resumed in a
    copy, the original's checkpoint was loaded at the end, whatever another run had put there since."""
    best_first = {"eval_strategy": "steps", "eval_steps": 1, "save_steps": 1, "save_strategy": "steps"}
    best_first |= {"load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "greater_is_better": True}
    validation = copy_dataset([4, 5, 6], len(word_tokenizer()), seed=5)
    original, run = tmp_path / "original", tmp_path / "run"
    resumable_run(original, max_steps=3, eval_dataset=validation, **best_first).train()
    best = json.loads((original / "checkpoint-3" / "trainer_state.json").read_text())["best_model_checkpoint"]
    name = Path(best).name
    assert name != "checkpoint-3"
    expected = load_file(original / name / "model.safetensors")
    if how == "moved":
        original.rename(run)
    else:  # and the original's directory is then another run's
        shutil.copytree(original, run)
        other = {key: tensor + 1 for key, tensor in expected.items()}
        save_file(other, original / name / "model.safetensors", metadata={"format": "pt"})
    resumed = resumable_run(run, max_steps=max_steps, save_total_limit=2, eval_dataset=validation, **best_first)
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        resumed.train(resume_from_checkpoint=str(run / "checkpoint-3"))
    assert f"The run's best checkpoint is {run / name} (its state named " in caplog.text
    assert Path(resumed.state.best_model_checkpoint) == run / name
    assert (run / name).is_dir(), "rotation kept the best checkpoint"
    weights = resumed.model.state_dict()
    assert all(torch.equal(weights[key], tensor) for key, tensor in expected.items()), "the best loaded at the end"


def test_every_process_names_the_best_checkpoint_by_its_final_path(tmp_path, monkeypatch):
    """Ranks other than 0 kept the staging path (`.checkpoint-N.partial/checkpoint-N`) as the best checkpoint, as
    the main process corrected it only as it finished the checkpoint, which they never do: at the end,
    load_best_model_at_end found nothing there, those ranks kept other weights than rank 0's, and the Trainer's
    warning advised save_on_each_node. Here, what the state says before the main process's finishing step."""
    best_first = {"eval_strategy": "steps", "eval_steps": 1, "save_steps": 1, "save_strategy": "steps"}
    best_first |= {"load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "greater_is_better": True}
    validation = copy_dataset([4, 5, 6], len(word_tokenizer()), seed=5)
    trainer = resumable_run(tmp_path, max_steps=2, eval_dataset=validation, **best_first)
    seen_by_every_process = []
    finish = TokenBudgetSeq2SeqTrainer._finish_checkpoint

    def main_process_finishes(self, *args, **kwargs):
        seen_by_every_process.append(Path(self.state.best_model_checkpoint))
        return finish(self, *args, **kwargs)

    monkeypatch.setattr(TokenBudgetSeq2SeqTrainer, "_finish_checkpoint", main_process_finishes)
    trainer.train()
    assert seen_by_every_process == [tmp_path / "checkpoint-1", tmp_path / "checkpoint-2"]  # the loss rose: best
    assert Path(trainer.state.best_model_checkpoint) == tmp_path / "checkpoint-2"


def test_resuming_with_other_batches_says_that_the_data_position_moves(tmp_path, caplog):
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    marker = json.loads((tmp_path / "checkpoint-3" / "checkpoint_complete.json").read_text())
    batching = {"processes": 1, "micro_batches_per_update": 2, "max_tokens_per_device": 24}
    assert marker["batching"] == batching
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_tokens_per_device=36)
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert "with other batches (1 process(es) × 2 micro-batch(es) per update of at most 36 tokens)" in caplog.text
    assert (
        "than it was trained with (1 process(es) × 2 micro-batch(es) per update of at most 24 tokens)" in caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):  # the same batches: nothing to say
        resumable_run(tmp_path / "b", save_strategy="steps", save_steps=3, max_steps=3).train()
        resumable_run(tmp_path / "b", save_strategy="steps", save_steps=3).train(
            resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-3")
        )
    assert "other batches" not in caplog.text


def test_resuming_in_another_precision_says_that_the_records_name_the_new_one(tmp_path, caplog):
    """fp32 updates resumed with --bf16 (a run moved to other hardware): allowed, but the run's training_args.json
    and card then say bf16 of the whole run, which nothing said."""
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):
        resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=4, bf16=True).train(
            resume_from_checkpoint=str(tmp_path / "checkpoint-3")
        )
    assert f"Resuming {tmp_path / 'checkpoint-3'} in bf16 mixed precision, where its updates so far were in fp32" in (
        caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):  # the same precision: nothing to say
        resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=5, bf16=True).train(
            resume_from_checkpoint=str(tmp_path / "checkpoint-4")
        )
    assert "Resuming" not in caplog.text


def test_resuming_with_another_label_smoothing_or_clipping_says_that_the_records_name_the_new_one(tmp_path, caplog):
    """Nothing in a checkpoint overrides them: the resume applies them from its first update on, and the run's
    training_args.json and card then show them for the whole run, which nothing said."""
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    kept = resumable_run(tmp_path / "kept", max_steps=4)
    shutil.copytree(tmp_path / "checkpoint-3", tmp_path / "kept" / "checkpoint-3")
    kept.train(resume_from_checkpoint=str(tmp_path / "kept" / "checkpoint-3"))
    assert "applied from here on" not in caplog.text  # the same settings: nothing to say
    refused = resumable_run(tmp_path, max_steps=4, label_smoothing_factor=0.3, learning_rate=2.0)
    with pytest.raises(ValueError, match="--learning_rate 2"):
        refused.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert "applied from here on" not in caplog.text  # nothing is
    changed = resumable_run(tmp_path, max_steps=4, label_smoothing_factor=0.3, max_grad_norm=1.0)
    changed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert losses(changed.state.log_history)[4] != losses(kept.state.log_history)[4]  # applied from update 4
    assert (
        f"Resuming {tmp_path / 'checkpoint-3'} with --label_smoothing_factor 0.3 (its updates so far: 0.1), "
        "--max_grad_norm 1 (its updates so far: 0): applied from here on, but the run's records will show the new "
        "values only"
    ) in caplog.text


def test_resuming_fp16_updates_in_fp32_says_so(tmp_path, caplog):
    """As with --bf16 above, for a checkpoint of fp16 updates (a GPU's; its pickled arguments say fp16 here)."""
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    pickled = tmp_path / "checkpoint-3" / "training_args.bin"
    arguments = torch.load(pickled, weights_only=False)
    arguments.fp16 = True
    torch.save(arguments, pickled)
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):
        resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=4).train(
            resume_from_checkpoint=str(tmp_path / "checkpoint-3")
        )
    assert f"Resuming {tmp_path / 'checkpoint-3'} in fp32, where its updates so far were in fp16 mixed precision" in (
        caplog.text
    )


def test_a_checkpoint_whose_pickled_arguments_do_not_read_resumes_without_a_precision_to_compare(tmp_path, caplog):
    """training_args.bin in torch's legacy format (an older torch's, another tool's) records no precision that
    can be read: the resume goes on, with nothing to warn of."""
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    pickled = tmp_path / "checkpoint-3" / "training_args.bin"
    torch.save(torch.load(pickled, weights_only=False), pickled, _use_new_zipfile_serialization=False)
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=4, bf16=True)
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert resumed.state.global_step == 4 and "Resuming" not in caplog.text


def trained_as(checkpoint: Path, **batching) -> None:
    """Make `checkpoint`'s marker say it was trained with other batching (another number of processes, say)."""
    marker = checkpoint / "checkpoint_complete.json"
    record = json.loads(marker.read_text())
    marker.write_text(json.dumps({**record, "batching": {**record["batching"], **batching}}))


def test_a_requeue_on_another_number_of_processes_resumes_the_same_updates_or_is_refused(tmp_path, caplog):
    """2 processes x 1 micro-batch resumed as 1 x 2 are the same updates in the same order (rank r takes batches
    r, r + R, ... of one list): once warned of as a moved data position. 2 x 2 resumed as 1 x 2 would make updates
    half the size and train part of the epoch twice: once a warning, which a multi-day run's log buries."""
    checkpoint = tmp_path / "checkpoint-3"
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    trained_as(checkpoint, processes=2, micro_batches_per_update=1)
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        resumable_run(tmp_path, save_strategy="steps", save_steps=3).train(resume_from_checkpoint=str(checkpoint))
    assert "the same batches per update, in the same order" in caplog.text and "other batches" not in caplog.text

    trained_as(checkpoint, processes=2, micro_batches_per_update=2)
    refused = resumable_run(tmp_path, save_strategy="steps", save_steps=3)
    with pytest.raises(
        ValueError,
        match=r"trained as 2 process\(es\) × 2 micro-batch\(es\) per update .*, 4 "
        r"batches per update, .*; resume with --gradient_accumulation_steps 4 to keep them",
    ):
        refused.train(resume_from_checkpoint=str(checkpoint))


def test_a_marker_with_part_of_a_batching_record_resumes_as_one_without(tmp_path, caplog):
    checkpoint = tmp_path / "checkpoint-3"
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    marker = checkpoint / "checkpoint_complete.json"
    record = json.loads(marker.read_text())
    del record["batching"]["processes"]  # an edited marker: once a KeyError traceback
    marker.write_text(json.dumps(record))
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        resumable_run(tmp_path, save_strategy="steps", save_steps=3).train(resume_from_checkpoint=str(checkpoint))
    assert "other batches" not in caplog.text and "same batches per update" not in caplog.text


def test_a_checkpoint_whose_batching_reads_nowhere_resumes_with_the_batches_asked(tmp_path, caplog):
    """A checkpoint saved before markers recorded the batching (2026-12-03) whose training_args.bin does not read
    either (torch's legacy format) holds no batching to compare: the resume goes on with the batches the arguments
    ask for, with nothing to warn of."""
    checkpoint = tmp_path / "checkpoint-3"
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    marker = checkpoint / "checkpoint_complete.json"
    record = json.loads(marker.read_text())
    del record["batching"]
    record.pop("batching_asked", None)
    marker.write_text(json.dumps(record))
    pickled = checkpoint / "training_args.bin"
    torch.save(torch.load(pickled, weights_only=False), pickled, _use_new_zipfile_serialization=False)
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=4)
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 4
    assert "other batches" not in caplog.text and "same batches per update" not in caplog.text


def test_a_requeue_on_another_number_of_processes_splits_the_checkpoints_batches_over_them(tmp_path, caplog):
    """With tokens_per_update, the checkpoint's batches per update, split over the processes there are now; before,
    derived anew, with the warning that part of the epoch is skipped or seen twice."""
    settings = {"warmup_steps": 1, "save_strategy": "steps", "save_steps": 1, "max_tokens_per_device": 1000}
    tokenizer, data = word_tokenizer(), equal_length_halves(len(word_tokenizer()))
    first = training_args(tmp_path, max_steps=1, tokens_per_update=28, **settings)
    make_trainer(first, data, tokenizer, tiny_model(len(tokenizer))).train()
    trained_as(tmp_path / "checkpoint-1", processes=2, micro_batches_per_update=1)  # 2 batches of <= 62 tokens
    resumed = make_trainer(
        training_args(tmp_path, max_steps=2, tokens_per_update=28, **settings),
        data,
        tokenizer,
        tiny_model(len(tokenizer)),
    )
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        resumed.adopt_checkpoint_batching(tmp_path / "checkpoint-1")  # as `training.train` does, to record it
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert (resumed.args.gradient_accumulation_steps, resumed.args.max_tokens_per_device) == (2, 62)
    said = "with its own batches (1 process(es) × 2 micro-batch(es) per update of at most 62 tokens)"
    assert caplog.text.count(said) == 1, "said once"
    assert "other batches" not in caplog.text


@pytest.mark.parametrize(
    ("recorded", "now", "advice"),
    [
        # no accumulation on 4 processes keeps 2 × 3 batches
        (
            (2, 3, 4096),
            (4, 1, 4096),
            "resume on a number of processes that divides 6, with as many micro-batches as keep 6",
        ),
        # 1 × 4 batches of 4096 on 2 processes: 2 micro-batches on each keep them, at the size recorded, not the one
        # asked now, so the refusal names both
        (
            (1, 4, 4096),
            (2, 1, 2048),
            "resume with --gradient_accumulation_steps 2 --max_tokens_per_device 4096 to keep",
        ),
    ],
)
def test_a_refused_requeue_says_what_keeps_the_checkpoints_updates(recorded, now, advice):
    fields = ("processes", "micro_batches_per_update", "max_tokens_per_device")
    message = trainer_module._other_processes_refusal(
        Path("run/checkpoint-9"), dict(zip(fields, recorded, strict=True)), dict(zip(fields, now, strict=True))
    )
    assert advice in str(message)


class SignalOnMicroBatch(TokenBudgetSeq2SeqTrainer):
    """Sends itself SIGTERM during micro-batch `signal_at` (1-based), i.e. in the middle of an update."""

    signal_at = 5

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.micro_batches = getattr(self, "micro_batches", 0) + 1
        if self.micro_batches == self.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(model, inputs, num_items_in_batch)


def test_sigterm_mid_update_finishes_it_saves_a_complete_checkpoint_and_resuming_loses_nothing(tmp_path):
    uninterrupted = resumable_run(tmp_path / "a")
    uninterrupted.train()
    handler = signal.getsignal(signal.SIGTERM)
    interrupted = resumable_run(tmp_path / "b", SignalOnMicroBatch, save_strategy="steps", save_steps=100)
    interrupted.train()  # micro-batch 5 is the first half of update 3

    assert interrupted.preempted == {"signal": "SIGTERM", "step": 3}, "the update in flight finished, then it stopped"
    assert interrupted.last_checkpoint == tmp_path / "b" / "checkpoint-3"
    assert checkpoint_problems(interrupted.last_checkpoint) == []
    assert signal.getsignal(signal.SIGTERM) is handler, "the previous handler is back"
    expected, before = losses(uninterrupted.state.log_history), losses(interrupted.state.log_history)
    assert sorted(before) == [1, 2, 3] and all(before[s] == pytest.approx(expected[s], rel=1e-6) for s in before)

    resumed = resumable_run(tmp_path / "b", SignalOnMicroBatch)
    resumed.signal_at = None  # counts micro-batches only
    resumed.train(resume_from_checkpoint=str(interrupted.last_checkpoint))
    after = losses(resumed.state.log_history)
    assert resumed.micro_batches == 6 and sorted(after) == [1, 2, 3, 4, 5, 6], "updates 4-6 run, none repeated"
    for step in (4, 5, 6):
        assert after[step] == pytest.approx(expected[step], rel=1e-6, abs=1e-7), step


def test_the_same_trainer_trains_again_after_a_preempted_train_without_its_signal(tmp_path):
    """A notebook user's Ctrl-C, then train(resume_from_checkpoint=True) on the same trainer: the spent signal
    stopped the second run after its first update (and made the next Ctrl-C a second one, stopping at once)."""
    trainer = resumable_run(tmp_path, SignalOnMicroBatch, save_strategy="steps", save_steps=100)
    trainer.train()
    assert trainer.preempted == {"signal": "SIGTERM", "step": 3}
    trainer.signal_at = None
    trainer.train(resume_from_checkpoint=True)
    assert trainer.preempted is None and trainer.state.global_step == 6
    assert trainer.last_checkpoint == tmp_path / "checkpoint-6", "this train()'s checkpoint"


def test_a_second_train_logs_its_own_throughput(tmp_path):
    """The batches after the last log of one train() were counted into the next one's first log (with the time in
    between): here twice the tokens per update."""
    tokenizer = word_tokenizer()
    args = training_args(tmp_path, max_steps=3, logging_steps=2, warmup_steps=1, max_tokens_per_device=36)
    trainer = make_trainer(args, equal_length_halves(len(tokenizer)), tokenizer, tiny_model(len(tokenizer)))
    logs = []
    for _ in range(2):
        trainer.train()  # update 3 is counted, never logged
        logs += [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and logs[0]["target_tokens_per_update"] == logs[1]["target_tokens_per_update"]


def test_the_samples_per_second_count_the_sentences_of_the_token_budget_batches(tmp_path):
    """The Trainer counted per_device_train_batch_size (8) sentences per batch: 24 for 3 batches of 4."""
    tokenizer = word_tokenizer()
    args = training_args(tmp_path, max_steps=3, warmup_steps=1, max_tokens_per_device=36)
    trainer = make_trainer(args, equal_length_halves(len(tokenizer)), tokenizer, tiny_model(len(tokenizer)))
    metrics = trainer.train().metrics
    assert metrics["train_samples_per_second"] == pytest.approx(3 * 4 / metrics["train_runtime"], rel=1e-2)
    assert trainer.state.log_history[-1]["train_samples_per_second"] == metrics["train_samples_per_second"]


class Clock:
    """`time` for modeling.trainer, whose perf_counter an hour's evaluation moves on at once."""

    def __init__(self):
        self.offset = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.offset


class HourLongEvaluation(TokenBudgetSeq2SeqTrainer):
    clock = Clock()

    def evaluate(self, *args, **kwargs):
        self.clock.offset += 3600.0
        return super().evaluate(*args, **kwargs)


def test_an_evaluation_between_two_logs_is_left_out_of_the_tokens_per_second(tmp_path, monkeypatch):
    """An evaluation at update 1 of the interval 1-2 counted as training time."""
    monkeypatch.setattr(trainer_module, "time", HourLongEvaluation.clock)
    tokenizer = word_tokenizer()
    dataset = equal_length_halves(len(tokenizer))
    settings = {"max_steps": 2, "logging_steps": 2, "eval_strategy": "steps", "eval_steps": 1, "warmup_steps": 1}
    args = training_args(tmp_path, max_tokens_per_device=36, **settings)
    model = tiny_model(len(tokenizer))
    trainer = make_trainer(args, dataset, tokenizer, model, HourLongEvaluation, eval_dataset=dataset)
    trainer.train()
    (logged,) = [entry for entry in trainer.state.log_history if "loss" in entry]
    tokens = 2 * (logged["source_tokens_per_update"] + logged["target_tokens_per_update"])
    assert logged["tokens_per_second"] > tokens / 60, "two tiny updates take well under a minute"


class SignalWhileEvaluating(TokenBudgetSeq2SeqTrainer):
    """Sends itself SIGTERM in its first evaluation batch during training; counts the evaluation batches."""

    evaluation_batches = 0

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        self.evaluation_batches += 1
        if self.evaluation_batches == 1 and self.is_in_train:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys, **gen_kwargs)


@pytest.mark.parametrize(
    "saving",
    [{"save_strategy": "steps", "save_steps": 4}, {"save_strategy": "best", "metric_for_best_model": "eval_loss"}],
)
def test_sigterm_while_evaluating_abandons_the_evaluation_and_saves_the_update_it_followed(tmp_path, saving):
    """Under save_strategy="best" too, where the Trainer saves only on a new best metric, which an abandoned
    evaluation has none of."""
    tokenizer = word_tokenizer()
    validation = copy_dataset([4, 5, 6, 7] * 4, len(tokenizer), seed=5)
    settings = {"eval_strategy": "steps", "eval_steps": 2, **saving}
    args = training_args(
        tmp_path, max_steps=6, warmup_steps=2, max_tokens_per_device=24, predict_with_generate=True, **settings
    )
    dataset = mixed_lengths_dataset(tokenizer)
    trainer = make_trainer(
        args,
        dataset,
        tokenizer,
        tiny_model(len(tokenizer)),
        SignalWhileEvaluating,
        eval_dataset=validation,
        bleu_dataset=validation,
        compute_metrics=bleu_metrics(tokenizer, "de"),
    )
    batches = len(trainer.get_eval_dataloader(validation))
    assert batches >= 4
    handler = signal.getsignal(signal.SIGTERM)
    trainer.train()

    assert trainer.preempted == {"signal": "SIGTERM", "step": 2}, "no update after the evaluation"
    assert trainer.evaluation_batches == 1, f"abandoned before the batch it came in, of {2 * batches}"
    assert trainer.last_checkpoint == tmp_path / "checkpoint-2" and not checkpoint_problems(trainer.last_checkpoint)
    assert sorted(path.name for path in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not any("eval_loss" in entry for entry in trainer.state.log_history), "no half-evaluation logged"
    assert signal.getsignal(signal.SIGTERM) is handler


def test_a_signal_outside_training_leaves_an_evaluation_whole(tmp_path):
    """Only an evaluation during training is abandoned on a signal, the update it followed then saved. One after
    train() (a script's own, under the run's handlers) runs to its end, the signal left to whoever handles it."""
    validation = copy_dataset([4, 5, 6, 7] * 2, len(word_tokenizer()), seed=5)
    trainer = resumable_run(tmp_path, eval_dataset=validation)
    with trainer.preemption.handling():
        os.kill(os.getpid(), signal.SIGTERM)
        metrics = trainer.evaluate()
    assert math.isfinite(metrics["eval_loss"]) and trainer.preempted is None


@pytest.mark.parametrize("signalled", [SignalOnMicroBatch, SignalWhileEvaluating])
def test_a_run_preempted_at_an_evaluation_resumes_with_the_losses_of_the_uninterrupted_run(tmp_path, signalled):
    """Preempted in the update before an evaluation (skipped), or while evaluating (abandoned after its first
    DataLoader of two): each evaluation DataLoader drew its seed from torch's generator, so the checkpoint's random
    state was not the uninterrupted run's after its evaluation, and from there every update's dropout differed
    (found by 20 requeues of a run: its weights differed from the uninterrupted run's)."""
    validation = copy_dataset([4, 5, 6], len(word_tokenizer()), seed=5)
    evaluating = {"eval_strategy": "steps", "eval_steps": 3, "save_strategy": "steps", "save_steps": 100}
    evaluating |= {"bleu_dataset": validation, "generation_max_length": 8}
    uninterrupted = resumable_run(tmp_path / "a", eval_dataset=validation, **evaluating)
    uninterrupted.train()
    interrupted = resumable_run(tmp_path / "b", signalled, eval_dataset=validation, **evaluating)
    interrupted.train()
    assert interrupted.preempted == {"signal": "SIGTERM", "step": 3}
    assert not any("eval_loss" in entry for entry in interrupted.state.log_history), "no evaluation at update 3"

    resumed = resumable_run(tmp_path / "b", eval_dataset=validation, **evaluating)
    resumed.train(resume_from_checkpoint=str(interrupted.last_checkpoint))
    expected, after = losses(uninterrupted.state.log_history), losses(resumed.state.log_history)
    assert sorted(after) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        assert after[step] == pytest.approx(expected[step], rel=1e-6, abs=1e-7), step


def test_bleu_metrics_score_the_best_of_several_sequences_returned_per_example():
    """With num_return_sequences in the generation config, the evaluation gathers that many rows per example: the
    metrics failed with a bare IndexError ("size of axis is 4 but size of corresponding boolean axis is 3")."""
    tokenizer = word_tokenizer()
    sentences = tokenizer(["the dog sees a cat", "a red ball"], padding=True, return_tensors="np")["input_ids"]
    padding = np.full((1, sentences.shape[1]), -100)  # a row prediction_step adds to gather unequal batches
    labels = np.concatenate([sentences, padding])
    other = tokenizer(["ball ball", "cat"], padding="max_length", max_length=sentences.shape[1], return_tensors="np")
    best_first = np.stack(
        [sentences[0], other["input_ids"][0], sentences[1], other["input_ids"][1], *padding, *padding]
    )
    metrics = bleu_metrics(tokenizer, "de")(EvalPrediction(predictions=best_first, label_ids=labels))
    assert metrics["sentences"] == 2 and metrics["bleu"] == pytest.approx(100.0)


def test_bleu_metrics_read_the_minus_100_padding_of_predictions_as_padding():
    """The Trainer concatenates the generations of batches of other lengths padded with -100 (`nested_concat`): a
    shorter translation's row ends in -100s, which are no token."""
    tokenizer = word_tokenizer()
    sentences = tokenizer(["the dog sees a cat", "a red ball"], padding=True, return_tensors="np")["input_ids"]
    predictions = np.where(sentences == tokenizer.pad_token_id, -100, sentences)
    assert (predictions == -100).any()
    metrics = bleu_metrics(tokenizer, "de")(EvalPrediction(predictions=predictions, label_ids=sentences))
    assert metrics["sentences"] == 2 and metrics["bleu"] == pytest.approx(100.0)


def test_a_bleu_dataset_without_predict_with_generate_is_refused(tmp_path):
    """BLEU needs translations: without generation the evaluation would score the logits' argmax, or nothing."""
    tokenizer = word_tokenizer()
    dataset = copy_dataset([3, 4], len(tokenizer))
    args = training_args(tmp_path, predict_with_generate=False)
    with pytest.raises(ValueError, match=r"^BLEU on bleu_dataset needs predict_with_generate=True\.$"):
        make_trainer(args, dataset, tokenizer, tiny_model(len(tokenizer)), bleu_dataset=dataset)


@pytest.mark.parametrize("target_lang", ["de", "zh"])
def test_the_metrics_an_evaluation_reports_are_those_metric_for_best_model_may_name(tmp_path, target_lang):
    """`training` refuses a metric_for_best_model outside `evaluation_metrics` before any work. Into Chinese, no
    tokenised BLEU is computed (`corpus_scores`): none is logged, rather than a None the curves cannot plot."""
    tokenizer = word_tokenizer()
    dataset = copy_dataset([4, 5, 6, 7] * 2, len(tokenizer), seed=5)
    evaluation = {"eval_strategy": "steps", "eval_steps": 1, "predict_with_generate": True}
    args = training_args(tmp_path, max_steps=1, warmup_steps=1, max_tokens_per_device=24, **evaluation)
    scoring = {"bleu_dataset": dataset, "compute_metrics": bleu_metrics(tokenizer, target_lang)}
    for bleu, extra in ((False, {}), (True, scoring)):
        trainer = make_trainer(args, dataset, tokenizer, tiny_model(len(tokenizer)), eval_dataset=dataset, **extra)
        trainer.train()
        entries = [entry for entry in trainer.state.log_history if any(name.startswith("eval_") for name in entry)]
        reported = {name for entry in entries for name in entry if name.startswith("eval_")}
        assert reported == evaluation_metrics(bleu=bleu, target_lang=target_lang)
        assert all(value is not None for entry in entries for value in entry.values())
    assert ("eval_sample_paper_bleu" in reported) == (target_lang == "de")


def test_without_a_target_language_an_evaluation_reports_every_bleu_metric():
    """`target_lang` is optional: no language named, none of the BLEU metrics is left out."""
    names = {f"eval_sample_{name}" for name in ("bleu", "paper_bleu", "chrf", "sentences")}
    assert names <= evaluation_metrics(bleu=True)


def test_sigterm_while_evaluating_on_start_stops_before_the_first_update(tmp_path):
    tokenizer = word_tokenizer()
    validation = copy_dataset([4, 5, 6, 7] * 4, len(tokenizer), seed=5)
    evaluation = {"eval_strategy": "steps", "eval_steps": 2, "eval_on_start": True}
    args = training_args(tmp_path, max_steps=6, warmup_steps=2, max_tokens_per_device=24, **evaluation)
    dataset = mixed_lengths_dataset(tokenizer)
    trainer = make_trainer(
        args, dataset, tokenizer, tiny_model(len(tokenizer)), SignalWhileEvaluating, eval_dataset=validation
    )
    output = trainer.train()
    assert (output.global_step, output.metrics) == (0, {}) and math.isnan(output.training_loss)
    assert trainer.preempted == {"signal": "SIGTERM", "step": 0} and trainer.evaluation_batches == 1
    assert not any("loss" in entry for entry in trainer.state.log_history), "no update made"


# Where a checkpoint write is killed: after half of a file is written (weights, optimizer, trainer state, the
# marker itself), or just before the staging directory is renamed into place.
KILL_POINTS = ["model.safetensors", "optimizer.pt", "trainer_state.json", COMPLETE_MARKER, "rename"]


def _wait_for_child(pid: int, timeout: float) -> int:
    """The wait status of the child `pid`; killed and failed after `timeout` s (a forked child can hang in a
    threading runtime that is not fork-safe: libgomp under torch 2.7's CPU flash attention)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked training process hung for {timeout} s")


def kill_during_second_checkpoint(output_dir: Path, point: str) -> int:
    """Fork a child that trains 4 updates, saving at 2 and 4, and SIGKILLs itself at `point` of the save at 4."""
    pid = os.fork()
    if pid:
        return _wait_for_child(pid, timeout=300)
    try:  # the child: nothing of pytest must run here; it leaves by SIGKILL or os._exit
        import transformers.modeling_utils as modeling_utils
        from transformers.trainer_callback import TrainerState

        import modeling.trainer as trainer_module

        def tear(path) -> None:
            path = Path(path)
            if path.name == point and ".checkpoint-4.partial" in str(path):
                path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # half written...
                os.kill(os.getpid(), signal.SIGKILL)  # ...and killed

        def wrap(function, path_of):
            def wrapper(*args, **kwargs):
                result = function(*args, **kwargs)
                tear(path_of(args, kwargs, result))
                return result

            return wrapper

        save_file, torch_save = modeling_utils.safe_save_file, torch.save
        modeling_utils.safe_save_file = wrap(save_file, lambda args, kwargs, result: args[1])
        torch.save = wrap(torch_save, lambda args, kwargs, result: args[1])
        TrainerState.save_to_json = wrap(TrainerState.save_to_json, lambda args, kwargs, result: args[1])
        trainer_module.write_completeness_marker = wrap(
            trainer_module.write_completeness_marker, lambda args, kwargs, result: result
        )
        swap = trainer_module.swap_directory

        def swap_or_die(new, path):
            if point == "rename" and Path(path).name == "checkpoint-4":
                os.kill(os.getpid(), signal.SIGKILL)
            return swap(new, path)

        trainer_module.swap_directory = swap_or_die
        resumable_run(output_dir, max_steps=4, save_strategy="steps", save_steps=2).train()
    finally:
        os._exit(3)  # not killed: the kill point was never reached


def test_a_save_that_failed_on_another_process_stops_this_one_with_an_oserror_leaving_no_half(tmp_path, monkeypatch):
    """Rank 0, when another rank could not write its part (its error names the cause): a RuntimeError once, which
    scripts/train.py showed as a traceback. One process stands in, told by `any_rank` that another failed."""
    trainer = resumable_run(tmp_path, max_steps=4, save_strategy="steps", save_steps=2)
    monkeypatch.setattr("modeling.trainer.any_rank", lambda flag, device: True)
    with pytest.raises(SaveFailedOnAnotherProcessError, match=r"Saving .*checkpoint-2 failed on another process"):
        trainer.train()
    assert list_checkpoints(tmp_path) == [] and staging_directories(tmp_path) == []
    assert issubclass(SaveFailedOnAnotherProcessError, OSError), "what scripts/train.py says in one line"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_during_a_checkpoint_write_leaves_the_previous_checkpoint_as_the_last(tmp_path, point):
    output_dir = tmp_path / "run"
    status = kill_during_second_checkpoint(output_dir, point)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"the child was not killed: {status}"

    assert [path.name for path in list_checkpoints(output_dir)] == ["checkpoint-2"], "no checkpoint-4, not even half"
    assert [path.name for path in staging_directories(output_dir)] == [".checkpoint-4.partial"]
    assert latest_complete_checkpoint(output_dir) == output_dir / "checkpoint-2"
    assert last_checkpoints(output_dir, 1) == [output_dir / "checkpoint-2"]
    average_checkpoints(complete_checkpoints(output_dir), tmp_path / "averaged")

    resumed = resumable_run(output_dir, SignalOnMicroBatch, max_steps=4, save_strategy="steps", save_steps=2)
    resumed.signal_at = None  # counts micro-batches only
    resumed.train(resume_from_checkpoint=str(latest_complete_checkpoint(output_dir)))
    assert resumed.micro_batches == 4, "updates 3 and 4 again: nothing before checkpoint-2 is lost"
    assert not checkpoint_problems(output_dir / "checkpoint-4")
    assert staging_directories(output_dir) == [], "the leftover is gone"


def test_a_tensorboard_log_the_disk_refuses_is_given_up_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    """TensorBoard's event file (the presets' report_to), written at every log step: its "[Errno 28] No space left
    on device" (naming no file) stopped the run, losing the updates since its last checkpoint, also where its
    directory (TENSORBOARD_LOGGING_DIR, a home directory's quota) was on another file system than the checkpoints."""
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tensorboard"))
    add_scalar = SummaryWriter.add_scalar

    def add_scalar_until_the_quota_is_full(self, tag, value, step=None, *args, **kwargs):
        if step is not None and step >= 2:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        return add_scalar(self, tag, value, step, *args, **kwargs)

    monkeypatch.setattr(SummaryWriter, "add_scalar", add_scalar_until_the_quota_is_full)
    output_dir = tmp_path / "run"
    trainer = resumable_run(output_dir, max_steps=4, save_strategy="steps", save_steps=2, report_to=["tensorboard"])
    with caplog.at_level(logging.WARNING, logger="modeling.callbacks"):
        trainer.train()
    assert [path.name for path in complete_checkpoints(output_dir)] == ["checkpoint-2", "checkpoint-4"]
    given_up = f"Not logging to TensorBoard any more: cannot write into {tmp_path / 'tensorboard'} ("
    assert caplog.text.count(given_up) == 1 and "Disk quota exceeded" in caplog.text
    assert [entry["step"] for entry in trainer.state.log_history if "loss" in entry] == [1, 2, 3, 4], "all kept"


def test_what_killed_saves_left_is_removed_before_the_next_save_needs_the_room(tmp_path, monkeypatch):
    """A save killed midway (a scheduler's SIGKILL after its grace period) leaves up to a whole checkpoint in
    `.checkpoint-N.partial`, a killed rotation one in `.checkpoint-N.deleting`. Removed only after the next save was
    complete, they took the room it needed: the requeue, given room for one more checkpoint, trained until its
    first save and stopped on a full disk."""
    output_dir = tmp_path / "run"
    leftovers = [output_dir / ".checkpoint-3.partial" / "checkpoint-3", output_dir / ".checkpoint-1.deleting"]
    for leftover in leftovers:
        leftover.mkdir(parents=True)
        (leftover / "optimizer.pt").write_bytes(b"\0" * 1024)
    torch_save = torch.save

    def save_where_there_is_room(obj, path, *args, **kwargs):
        if any(leftover.exists() for leftover in leftovers):
            raise OSError(errno.ENOSPC, "No space left on device")
        return torch_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_where_there_is_room)
    resumable_run(output_dir, max_steps=2, save_strategy="steps", save_steps=2).train()
    assert [path.name for path in complete_checkpoints(output_dir)] == ["checkpoint-2"]
    assert staging_directories(output_dir) == []


def test_rotation_counts_complete_checkpoints_only_and_leftovers_are_cleaned(tmp_path, caplog):
    output_dir = tmp_path / "run"
    (output_dir / "checkpoint-100").mkdir(parents=True)  # incomplete: neither counted nor deleted
    (output_dir / ".checkpoint-2.partial" / "checkpoint-2").mkdir(parents=True)  # a killed save of step 2
    (output_dir / ".checkpoint-2.partial" / "checkpoint-2" / "model.safetensors").write_bytes(b"half")
    (output_dir / ".checkpoint-77.partial").mkdir()  # of some other step
    (output_dir / ".checkpoint-1.deleting" / "optimizer.pt").mkdir(parents=True)  # a rotation killed midway
    trainer = resumable_run(output_dir, max_steps=4, save_strategy="steps", save_steps=1, save_total_limit=2)
    with caplog.at_level(logging.WARNING, logger="modeling.trainer"):
        trainer.train()
    names = sorted(path.name for path in output_dir.iterdir() if "checkpoint" in path.name)
    assert names == ["checkpoint-100", "checkpoint-3", "checkpoint-4"]
    assert ".checkpoint-77.partial" in caplog.text and ".checkpoint-1.deleting" in caplog.text, "removed, warned"
    assert all(not checkpoint_problems(output_dir / name) for name in ("checkpoint-3", "checkpoint-4"))


def test_rotation_keeps_another_users_checkpoint_saying_so_once(tmp_path, monkeypatch, caplog):
    """A run resumed from a colleague's, whose checkpoints were written under a umask of 022: rotation logged
    "Deleted checkpoint-1", left `.checkpoint-1.deleting` (rmtree's errors ignored) and removed it again, in vain,
    at every later save."""
    output_dir = tmp_path / "run"
    theirs = output_dir / "checkpoint-1"
    access = os.access

    def as_another_user(path, mode, **kwargs):  # tests run as root, whom no permission stops
        return Path(path) != theirs and access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", as_another_user)
    trainer = resumable_run(output_dir, max_steps=5, save_strategy="steps", save_steps=1, save_total_limit=2)
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        trainer.train()
    names = sorted(path.name for path in output_dir.iterdir() if "checkpoint" in path.name)
    assert names == ["checkpoint-1", "checkpoint-4", "checkpoint-5"]
    assert caplog.text.count(f"Keeping {theirs} beyond save_total_limit=2") == 1
    assert f"Deleted {theirs}" not in caplog.text and "Removing" not in caplog.text


def test_a_save_total_limit_of_0_keeps_every_checkpoint_as_the_trainer_does(tmp_path):
    resumable_run(tmp_path, max_steps=3, save_strategy="steps", save_steps=1, save_total_limit=0).train()
    assert [path.name for path in list_checkpoints(tmp_path)] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]


def test_the_minute_settings_save_and_stop_a_run_by_the_clock(tmp_path):
    """`save_every_minutes` and `max_train_minutes` (their callbacks are tested in test_callbacks): a budget spent
    after the first update stops the run there with a checkpoint; an interval that has passed saves every update."""
    stopped = resumable_run(tmp_path / "stopped", max_train_minutes=1e-9, save_strategy="no")
    stopped.train()
    assert stopped.state.global_step == 1 and [path.name for path in list_checkpoints(tmp_path / "stopped")] == [
        "checkpoint-1"
    ]
    resumable_run(tmp_path / "timed", max_steps=3, save_every_minutes=1e-9, save_strategy="no").train()
    assert [path.name for path in list_checkpoints(tmp_path / "timed")] == [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
    ]


def test_a_second_train_call_starts_the_paper_schedule_over(tmp_path):
    """A notebook calling `train()` again on the same trainer: the Trainer rebuilds a schedule it created itself; the
    paper's, kept, would have gone on from the first call's last update."""
    trainer = resumable_run(tmp_path, max_steps=2, save_strategy="no", logging_steps=1)

    def rates() -> list[float]:
        trainer.state.log_history.clear()
        trainer.train()
        return [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]

    first = rates()
    assert len(first) == 2 and rates() == first


def test_a_resume_with_other_save_eval_and_logging_intervals_takes_them(tmp_path, caplog):
    """The Trainer kept the checkpoint's intervals, in its state, warning only that they differ from the arguments:
    a requeue with --save_steps 5 (fewer saves, for the disk) went on saving every 2 updates, evaluating and logging
    at the old intervals too, while training_args.json and the card said 5."""
    evaluated = mixed_lengths_dataset(word_tokenizer())
    steps = {"save_strategy": "steps", "eval_strategy": "steps"}
    every_2 = {"save_steps": 2, "eval_steps": 2, "logging_steps": 1}
    resumable_run(tmp_path, None, evaluated, max_steps=4, **steps, **every_2).train()
    every_5 = {"save_steps": 5, "eval_steps": 5, "logging_steps": 3}
    resumed = resumable_run(tmp_path, None, evaluated, max_steps=9, **steps, **every_5)
    with caplog.at_level(logging.INFO, logger="modeling.trainer"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert [path.name for path in list_checkpoints(tmp_path)] == [f"checkpoint-{step}" for step in (2, 4, 5, 9)]
    history = resumed.state.log_history
    assert [entry["step"] for entry in history if "eval_loss" in entry] == [2, 4, 5, 9]  # and at the end
    assert list(losses(history)) == [1, 2, 3, 4, 6, 9]
    assert "Resuming with --logging_steps 3 (the checkpoint's: 1), --eval_steps 5 (the checkpoint's: 2)" in caplog.text


def test_rotation_deletes_only_the_checkpoints_beyond_the_limit(tmp_path):
    resumable_run(tmp_path, max_steps=5, save_strategy="steps", save_steps=1, save_total_limit=3).train()
    assert [path.name for path in list_checkpoints(tmp_path)] == ["checkpoint-3", "checkpoint-4", "checkpoint-5"]


def test_a_resume_with_a_lower_save_total_limit_deletes_every_checkpoint_beyond_it_at_its_first_save(tmp_path):
    """A run requeued with a lower `save_total_limit` (the disk filling up) brings its checkpoints down to the limit at
    the next save, however many are beyond it, the newest kept."""
    resumable_run(tmp_path, max_steps=4, save_strategy="steps", save_steps=1).train()
    resumed = resumable_run(tmp_path, max_steps=5, save_strategy="steps", save_steps=1, save_total_limit=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert [path.name for path in list_checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-5"]


def diverging_from_update(update: int, trainer: TokenBudgetSeq2SeqTrainer) -> TokenBudgetSeq2SeqTrainer:
    """`trainer`, its loss (and so its gradients) NaN from `update` on."""
    compute_loss = trainer.compute_loss

    def nan_from_the_update(*args, **kwargs):
        loss = compute_loss(*args, **kwargs)
        return loss * float("nan") if trainer.state.global_step >= update - 1 else loss

    trainer.compute_loss = nan_from_the_update
    return trainer


def test_nan_gradients_at_the_first_update_of_a_launch_name_the_weights_it_started_from(tmp_path):
    """No learning rate has acted yet: lowering it, which the other messages advise, would not help."""
    trainer = diverging_from_update(1, resumable_run(tmp_path, max_steps=2, save_strategy="steps", save_steps=1))
    with pytest.raises(trainer_module.TrainingDiverged) as diverged:
        trainer.train()
    assert str(diverged.value) == (
        f"Training diverged at update 1 of {tmp_path}: its gradient norm is nan, at the first update of this launch: "
        "the weights it started from give non-finite gradients (the weights of a run that had diverged already?), "
        "or its batches do. Nothing was saved."
    )
    assert list_checkpoints(tmp_path) == []


def test_nan_gradients_before_any_checkpoint_advise_a_lower_rate_from_the_start(tmp_path):
    trainer = diverging_from_update(2, resumable_run(tmp_path, max_steps=3, save_strategy="no"))
    with pytest.raises(trainer_module.TrainingDiverged) as diverged:
        trainer.train()
    assert str(diverged.value) == (
        f"Training diverged at update 2 of {tmp_path}: its gradient norm is nan. The update was not applied; no "
        "checkpoint was saved before it. Start again with a lower --learning_rate or more --warmup_steps."
    )


def test_an_update_with_nan_gradients_stops_the_run_before_it_keeping_every_checkpoint_finite(tmp_path):
    """Without the stop, the run went on to update 8 logging a loss of 0.0 (the Trainer's NaN filter) and rotated
    checkpoints 2 and 4 out for NaN ones."""
    trainer = resumable_run(tmp_path, max_steps=8, save_strategy="steps", save_steps=2, save_total_limit=2)
    diverging_from_update(5, trainer)
    with pytest.raises(trainer_module.TrainingDiverged) as diverged:
        trainer.train()
    assert str(diverged.value).startswith(
        f"Training diverged at update 5 of {tmp_path}: its gradient norm is nan. The update was not applied and "
        f"nothing was saved after it; the newest complete checkpoint is {tmp_path / 'checkpoint-4'} "
    )
    assert "--model_name_or_path CHECKPOINT" in str(diverged.value) and "\n" not in str(diverged.value)
    assert trainer.state.global_step == 4 and sorted(losses(trainer.state.log_history)) == [1, 2, 3, 4]
    assert all(parameter.isfinite().all() for parameter in trainer.model.parameters()), "update 5 not applied"
    assert [path.name for path in list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-4"]
    for checkpoint in list_checkpoints(tmp_path):
        assert all(tensor.isfinite().all() for tensor in load_file(checkpoint / "model.safetensors").values())


DIVERGING_WORKER = """
import os, sys
sys.path.insert(0, {tests_dir!r})
from helpers import copy_dataset, make_trainer, tiny_model, training_args, word_tokenizer
from modeling.callbacks import leave_process_group
from modeling.trainer import TokenBudgetSeq2SeqTrainer, TrainingDiverged

class NanOnRankOne(TokenBudgetSeq2SeqTrainer):
    def compute_loss(self, *args, **kwargs):
        loss = super().compute_loss(*args, **kwargs)
        return loss * float("nan") if self.args.process_index == 1 and self.state.global_step >= 2 else loss

tokenizer = word_tokenizer()
args = training_args({out!r}, max_steps=4, warmup_steps=2, max_tokens_per_device=24, ddp_backend="gloo",
                     save_strategy="steps", save_steps=2)
trainer = make_trainer(args, copy_dataset([4] * 16, len(tokenizer), seed=3), tokenizer, tiny_model(len(tokenizer)),
                       NanOnRankOne)
try:
    trainer.train()
except TrainingDiverged as diverged:
    with open(os.path.join({out!r}, f"diverged_{{args.process_index}}.txt"), "w") as f:
        f.write(str(diverged))
del trainer
leave_process_group()
"""


def test_nan_gradients_on_one_process_stop_every_process_at_the_same_update(tmp_path):
    """The gradients are summed over processes before their norm is taken: a NaN loss on rank 1 alone stops both
    ranks, none left waiting in a collective for the other."""
    worker = tmp_path / "worker.py"
    worker.write_text(DIVERGING_WORKER.format(tests_dir=str(Path(__file__).parent), out=str(tmp_path)))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker)]
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    messages = [(tmp_path / f"diverged_{rank}.txt").read_text() for rank in (0, 1)]
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"Training diverged at update 3 of {tmp_path}: its gradient norm is nan.")
    assert [path.name for path in list_checkpoints(tmp_path)] == ["checkpoint-2"]


def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_previous_checkpoint_stays(tmp_path, monkeypatch):
    output_dir = tmp_path / "run"
    torch_save = torch.save

    def save_until_the_disk_is_full(obj, path, *args, **kwargs):
        if ".checkpoint-4.partial" in str(path) and str(path).endswith("optimizer.pt"):
            monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 4096))
            raise RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file")
        return torch_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_the_disk_is_full)
    trainer = resumable_run(output_dir, max_steps=4, save_strategy="steps", save_steps=2)
    with pytest.raises(DiskFullError) as error:
        trainer.train()
    assert str(error.value).startswith(f"No space left on device while writing {output_dir / 'checkpoint-4'}")
    assert "\n" not in str(error.value)
    assert [path.name for path in list_checkpoints(output_dir)] == ["checkpoint-2"] and not checkpoint_problems(
        output_dir / "checkpoint-2"
    )
    assert staging_directories(output_dir) == [], "the partial save is removed, freeing its space"


@pytest.mark.parametrize(
    ("writer", "failure", "message"),
    [
        # a scratch quota: torch's writer says neither why nor where, safetensors says why in words
        ("torch", RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"), "Writing "),
        ("safetensors", RuntimeError("Error while serializing: I/O error: Disk quota exceeded (os error 122)"), ""),
        ("torch", OSError(errno.EIO, "Input/output error"), "Input/output error while writing "),  # an NFS server's
    ],
)
def test_a_quota_or_an_io_error_during_a_checkpoint_is_one_line_and_the_previous_checkpoint_stays(
    tmp_path, monkeypatch, writer, failure, message
):
    """Free space on the disk, so not blamed on it: torch's and safetensors' errors ended the run in a traceback,
    an EIO in "[Errno 5] Input/output error", naming no file."""
    output_dir = tmp_path / "run"
    module, name = (torch, "save") if writer == "torch" else (modeling_utils, "safe_save_file")
    save = getattr(module, name)

    def save_until_the_file_system_refuses(obj, path, *args, **kwargs):
        if ".checkpoint-4.partial" in str(path):
            raise failure
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(module, name, save_until_the_file_system_refuses)
    trainer = resumable_run(output_dir, max_steps=4, save_strategy="steps", save_steps=2)
    with pytest.raises(UnwritableError) as error:
        trainer.train()
    expected = message or "Disk quota exceeded while writing "
    assert str(error.value).startswith(f"{expected}{output_dir / 'checkpoint-4'}") and "\n" not in str(error.value)
    assert [path.name for path in list_checkpoints(output_dir)] == ["checkpoint-2"] and not checkpoint_problems(
        output_dir / "checkpoint-2"
    )
    assert staging_directories(output_dir) == []


def test_a_checkpoint_whose_directory_cannot_be_made_is_one_line_and_the_previous_checkpoint_stays(
    tmp_path, monkeypatch
):
    """An inode quota refuses the staging directory itself: nothing to remove after, and its error is the one said."""
    output_dir = tmp_path / "run"
    makedirs = os.makedirs

    def makedirs_until_the_quota_is_spent(name, *args, **kwargs):
        if ".checkpoint-4.partial" in str(name):
            raise OSError(errno.EDQUOT, "Disk quota exceeded", str(name))
        return makedirs(name, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", makedirs_until_the_quota_is_spent)
    trainer = resumable_run(output_dir, max_steps=4, save_strategy="steps", save_steps=2)
    with pytest.raises(UnwritableError) as error:
        trainer.train()
    assert str(error.value).startswith(f"Disk quota exceeded while writing {output_dir / 'checkpoint-4'}")
    assert [path.name for path in list_checkpoints(output_dir)] == ["checkpoint-2"]
    assert staging_directories(output_dir) == []


def test_a_checkpoint_save_failing_otherwise_than_in_the_file_system_raises_its_own_error_and_leaves_no_half(
    tmp_path, monkeypatch
):
    """A bug's error (here a state that does not pickle) is no write error to name in one line: it is raised as it
    is, for its traceback, not as "failed on another process"; the staged half is removed and checkpoint-2 stays."""
    output_dir = tmp_path / "run"
    torch_save = torch.save

    def save_until_a_state_does_not_pickle(obj, path, *args, **kwargs):
        if ".checkpoint-4.partial" in str(path):
            raise TypeError("cannot pickle '_thread.lock' object")
        return torch_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_a_state_does_not_pickle)
    trainer = resumable_run(output_dir, max_steps=4, save_strategy="steps", save_steps=2)
    with pytest.raises(TypeError, match=r"^cannot pickle '_thread.lock' object$"):
        trainer.train()
    assert [path.name for path in list_checkpoints(output_dir)] == ["checkpoint-2"]
    assert staging_directories(output_dir) == []


@pytest.mark.parametrize(
    ("failure", "raised", "message"),
    [
        (OSError(errno.EIO, "Input/output error"), UnwritableError, "^Input/output error while writing {run}$"),
        (TypeError("cannot pickle '_thread.lock' object"), TypeError, "^cannot pickle '_thread.lock' object$"),
    ],
)
def test_a_final_model_that_fails_to_save_names_its_directory_or_raises_its_own_error_and_leaves_no_half(
    tmp_path, monkeypatch, failure, raised, message
):
    """A file system's error names output_dir in one line; any other is raised as it is. Either way the staging
    directory is removed and output_dir holds no final model, half or whole."""
    output_dir = tmp_path / "run"
    trainer = resumable_run(output_dir, max_steps=1)
    trainer.train()

    def save_model_failing(directory, *args, **kwargs):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "config.json").write_text("{}")
        raise failure

    monkeypatch.setattr(trainer, "save_model", save_model_failing)
    with pytest.raises(raised, match=message.format(run=re.escape(str(output_dir)))):
        trainer.save_final_model()
    assert not (output_dir / ".final-model.partial").exists()
    assert not (output_dir / "config.json").exists() and not (output_dir / "model.safetensors").exists()


def test_a_final_model_whose_directory_cannot_be_made_is_one_line(tmp_path, monkeypatch):
    """An inode quota refuses the staging directory itself: nothing to remove after, and its error is the one said."""
    output_dir = tmp_path / "run"
    trainer = resumable_run(output_dir, max_steps=1)
    trainer.train()

    def save_model_refused(directory, *args, **kwargs):
        raise OSError(errno.EDQUOT, "Disk quota exceeded", str(directory))

    monkeypatch.setattr(trainer, "save_model", save_model_refused)
    with pytest.raises(UnwritableError, match=f"^Disk quota exceeded while writing {re.escape(str(output_dir))}"):
        trainer.save_final_model()
    assert not (output_dir / ".final-model.partial").exists()


def test_a_final_model_save_publishes_nothing_that_a_killed_earlier_save_left_in_staging(tmp_path):
    """A save killed midway leaves `.final-model.partial` behind; the next save starts it afresh, so that a file of
    the killed one that the new model does not write over never reaches output_dir beside the new model."""
    output_dir = tmp_path / "run"
    trainer = resumable_run(output_dir, max_steps=1)
    staging = output_dir / ".final-model.partial"
    staging.mkdir(parents=True)
    (staging / "stale-leftover.json").write_text("{}")
    assert trainer.save_final_model() == output_dir
    assert (output_dir / "config.json").is_file() and (output_dir / "model.safetensors").is_file()
    assert not (output_dir / "stale-leftover.json").exists()
    assert not staging.exists()


@pytest.mark.parametrize("setting", [{"dispatch_batches": True}, {"even_batches": False}])
def test_accelerate_settings_that_would_split_or_drop_token_budget_batches_are_refused_on_several_processes(
    tmp_path, setting
):
    """Each process trains whole batches of its own, as many as the others: split (its token budget shared out),
    dispatched from rank 0 or left uneven at an epoch's end, the processes' updates no longer add up."""
    check_sharding(training_args(tmp_path), 2)
    args = training_args(tmp_path, accelerator_config=setting)
    check_sharding(args, 1)  # one process: nothing is shared out
    refused = "dispatch_batches=True" if "dispatch_batches" in setting else "even_batches=False"
    with pytest.raises(ValueError, match=rf"^accelerator_config {refused}: token-budget batches are sharded whole"):
        check_sharding(args, 2)


@pytest.mark.parametrize("loader", ["train", "eval"])
def test_accelerates_split_batches_is_refused_in_one_line_on_one_process_too(tmp_path, loader):
    """accelerate divides a batch size, which token-budget batches lack: on one process it failed in the loader with
    its own message ("you must have a `batch_size` attribute ..."), naming no setting to change."""
    args = training_args(tmp_path, accelerator_config={"split_batches": True})
    with pytest.raises(ValueError, match=r"^accelerator_config split_batches=True: .* keep split_batches=False"):
        check_sharding(args, 1)
    tokenizer = word_tokenizer()
    dataset = equal_length_halves(len(tokenizer))
    trainer = make_trainer(args, dataset, tokenizer, tiny_model(len(tokenizer)))
    with pytest.raises(ValueError, match=r"^accelerator_config split_batches=True: token-budget batches"):
        trainer.get_train_dataloader() if loader == "train" else trainer.get_eval_dataloader(dataset)


@pytest.mark.parametrize("loader", ["train", "eval"])
def test_the_trainers_loaders_refuse_accelerate_settings_that_shard_batches_unevenly_on_several_processes(
    tmp_path, monkeypatch, loader
):
    """`check_sharding` is asked by both loaders, with the processes of the run: one process stands in for two."""
    tokenizer = word_tokenizer()
    dataset = equal_length_halves(len(tokenizer))
    args = training_args(tmp_path, accelerator_config={"even_batches": False})
    trainer = make_trainer(args, dataset, tokenizer, tiny_model(len(tokenizer)))
    make_loader = trainer.get_train_dataloader if loader == "train" else lambda: trainer.get_eval_dataloader(dataset)
    make_loader()  # one process: nothing is shared out
    monkeypatch.setattr(type(trainer.accelerator), "num_processes", property(lambda self: 2))
    with pytest.raises(ValueError, match=r"^accelerator_config even_batches=False: token-budget batches are sharded"):
        make_loader()


@pytest.mark.parametrize(("max_tokens", "micro_batches"), [(24, 2), (24, 3), (1000, 4)])
def test_the_number_of_updates_a_resume_is_checked_against_is_the_number_the_trainer_runs(
    tmp_path, max_tokens, micro_batches
):
    """`_total_updates` (what a warmup ratio is taken of when a resume compares warmups) counts the updates of
    `num_train_epochs` as the Trainer does: one per epoch at least, where the batches are fewer than an update's."""
    settings = {"max_tokens_per_device": max_tokens, "gradient_accumulation_steps": micro_batches}
    trainer = resumable_run(tmp_path, max_steps=-1, num_train_epochs=2, save_strategy="no", **settings)
    counted = trainer._total_updates()
    trainer.train()
    assert counted == trainer.state.max_steps == trainer.state.global_step


@pytest.fixture
def spawned_workers():
    """DataLoader workers started as macOS starts them (`spawn`), for this test only."""
    method = torch.multiprocessing.get_start_method()
    torch.multiprocessing.set_start_method("spawn", force=True)
    yield
    torch.multiprocessing.set_start_method(method, force=True)


@pytest.mark.usefixtures("spawned_workers")
def test_spawned_loader_workers_outlive_the_preemption_signal_the_main_process_answers(tmp_path):
    """A terminal's Ctrl-C and a scheduler's SIGTERM reach the workers too; the main process finishes the update
    and saves. Spawned workers kept the default handlers and died: the run ended in `DataLoader worker (pid N) is
    killed by signal: Terminated`, without its checkpoint."""
    tokenizer, data = word_tokenizer(), equal_length_halves(len(word_tokenizer()))
    args = training_args(tmp_path, max_tokens_per_device=24, dataloader_num_workers=1)
    trainer = make_trainer(args, data, tokenizer, tiny_model(len(tokenizer)), eval_dataset=data)
    for loader in (trainer.get_train_dataloader(), trainer.get_eval_dataloader()):
        batches = iter(loader)
        first = next(batches)
        workers = multiprocessing.active_children()
        assert len(workers) == 1
        for worker in workers:
            os.kill(worker.pid, signal.SIGTERM)
        time.sleep(1)  # the signal is delivered before the next batch is asked for
        assert len([first, *batches]) == len(loader) > 1


def test_save_metrics_writes_each_split_and_merges_them_into_all_results(tmp_path, monkeypatch):
    """What the training script leaves in the run's directory: `{split}_results.json` per split, and
    `all_results.json` holding every split's metrics so far (a later split's added, not replacing the file); by the
    main process alone (each process has its own runtimes, and all_results.json is read, merged and rewritten)."""
    other_process = resumable_run(tmp_path / "other")
    monkeypatch.setattr(other_process, "is_world_process_zero", lambda: False)
    other_process.save_metrics("train", {"train_loss": 2.5})
    other_process.save_state()
    assert list((tmp_path / "other").iterdir()) == []
    trainer = resumable_run(tmp_path)
    trainer.save_metrics("train", {"train_loss": 2.5})
    trainer.save_metrics("eval", {"eval_loss": 3.0})
    trainer.save_metrics("test", {"test_bleu": 1.0}, combined=False)
    assert json.loads((tmp_path / "train_results.json").read_text()) == {"train_loss": 2.5}
    assert json.loads((tmp_path / "test_results.json").read_text()) == {"test_bleu": 1.0}
    assert json.loads((tmp_path / "all_results.json").read_text()) == {"train_loss": 2.5, "eval_loss": 3.0}
    (tmp_path / "all_results.json").write_text('{"train_loss": 2.')  # edited by hand, cut short
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'all_results.json'))} does not parse"):
        trainer.save_metrics("eval", {"eval_loss": 3.0})


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({"paper_schedule": False}, {}),
        ({"paper_schedule": False, "lr_scheduler_type": "constant"}, {}),
        ({}, {"paper_schedule": False, "warmup_steps": 1}),
    ],
    ids=[
        "the trainer's, then the paper's",
        "the trainer's constant, then the paper's",
        "the paper's, then the trainer's with another warmup",
    ],
)
def test_resuming_a_run_with_the_other_schedule_takes_it(tmp_path, first, then):
    """Nothing to refuse either way: the Trainer's linear schedule saves an empty dict and its constant one None (no
    warmup recorded), and the paper schedule's warmup, in its scheduler state, is not restored into the linear one
    (--no_paper_schedule), so another --warmup_steps differs from nothing. The updates after the first take the new
    schedule's rates. (The first takes the rate its optimizer state holds: after the linear schedule, its last, 0
    here.)"""
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3, learning_rate=1e-3, **first).train()
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3, learning_rate=1e-3, **then)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    uninterrupted = resumable_run(tmp_path / "uninterrupted", save_strategy="no", learning_rate=1e-3, **then)
    uninterrupted.train()

    def rates(trainer):
        logged = [entry for entry in trainer.state.log_history if "learning_rate" in entry]
        return {entry["step"]: entry["learning_rate"] for entry in logged if entry["step"] > 4}

    assert resumed.state.global_step == 6 and rates(resumed) == pytest.approx(rates(uninterrupted))
    assert len(rates(uninterrupted)) == 2


def test_a_learning_rate_that_puts_the_papers_peak_below_1e_5_is_warned_of(tmp_path, caplog):
    """`learning_rate` multiplies the schedule: a rate meant as Adam's (1e-5, as for --no_paper_schedule) would train
    with a peak of 1.25e-6. The tests' d_model 32 and warmup 2 peak at 32^-0.5 × 2^-0.5 = 0.125 for a multiplier 1."""
    for learning_rate in (1.0, 1e-5):
        trainer = resumable_run(tmp_path, learning_rate=learning_rate)
        with caplog.at_level(logging.INFO, logger="modeling.trainer"):
            trainer.create_optimizer_and_scheduler(num_training_steps=6)
    assert "peak 0.125 at update 2" in caplog.text and "peak 1.25e-06 at update 2" in caplog.text
    assert caplog.text.count("use --no_paper_schedule") == 1
    assert "giving a peak rate of 1.3e-06; for a peak rate of 1e-05 use --no_paper_schedule" in caplog.text


class MinuteLongUpdates(TokenBudgetSeq2SeqTrainer):
    """Each batch moves `modeling.trainer`'s clock on by a minute."""

    clock = Clock()

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.clock.offset += 60.0
        return loss


def test_a_training_log_holds_the_tokens_and_padding_of_its_updates(tmp_path, monkeypatch):
    """Sources of 3 and 5 tokens in one batch (padded to 2 × 5), the targets the same, trained on twice and logged
    once: 8 real source and 8 real target tokens per update, 16 of 20 padded tokens real; 32 tokens in 2 minutes."""
    monkeypatch.setattr(trainer_module, "time", MinuteLongUpdates.clock)
    tokenizer = word_tokenizer()
    args = training_args(tmp_path, max_steps=2, logging_steps=2, warmup_steps=1, max_tokens_per_device=1000)
    dataset = copy_dataset([3, 5], len(tokenizer))
    trainer = make_trainer(args, dataset, tokenizer, tiny_model(len(tokenizer)), MinuteLongUpdates)
    trainer.train()
    (logged,) = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logged["tokens_per_second"] == pytest.approx(32 / 120, rel=0.05), "the updates' seconds, not the test's"
    expected = {
        "source_tokens_per_update": 8,
        "target_tokens_per_update": 8,
        "padding_efficiency": 0.8,
        "gradient_accumulation_steps": 1,
        "updates_logged": 2,
    }
    assert {key: logged.get(key) for key in expected} == expected


@pytest.mark.parametrize("persistent", [False, True])
def test_loader_workers_persist_between_epochs_only_when_asked(tmp_path, persistent):
    """`dataloader_persistent_workers` as the Trainer takes it: workers kept alive between epochs only when set
    (each keeps a copy of the dataset), and never asked of a loader without workers (torch refuses that)."""
    tokenizer = word_tokenizer()
    dataset = equal_length_halves(len(tokenizer))
    for workers in (0, 1):
        settings = {"dataloader_num_workers": workers, "dataloader_persistent_workers": persistent}
        trainer = make_trainer(training_args(tmp_path, **settings), dataset, tokenizer, tiny_model(len(tokenizer)))
        assert trainer.get_train_dataloader().persistent_workers is (persistent and workers > 0)


def test_loader_workers_prefetch_as_many_batches_as_asked(tmp_path):
    """`dataloader_prefetch_factor` as the Trainer takes it: each worker's batches in flight, never asked of a loader
    without workers (torch refuses that)."""
    tokenizer = word_tokenizer()
    dataset = equal_length_halves(len(tokenizer))
    for workers, prefetched in ((0, None), (1, 4)):
        settings = {"dataloader_num_workers": workers, "dataloader_prefetch_factor": 4 if workers else None}
        trainer = make_trainer(training_args(tmp_path, **settings), dataset, tokenizer, tiny_model(len(tokenizer)))
        assert trainer.get_train_dataloader().prefetch_factor == prefetched


@pytest.mark.parametrize("pin_memory", [False, True])
def test_loader_memory_is_pinned_only_when_asked_and_a_gpu_is_there(tmp_path, monkeypatch, pin_memory):
    """`dataloader_pin_memory` as the Trainer takes it: the loaders handed to accelerate pin their batches where CUDA
    is available and it is set, not where it is turned off (page-locked memory a host may not spare), nor without
    CUDA."""
    tokenizer = word_tokenizer()
    dataset = equal_length_halves(len(tokenizer))
    trainer = make_trainer(training_args(tmp_path), dataset, tokenizer, tiny_model(len(tokenizer)))
    trainer.args.dataloader_pin_memory = pin_memory  # as a GPU run's arguments hold it (use_cpu turns it off)
    monkeypatch.setattr(trainer.accelerator, "prepare", lambda loader: loader)  # the loader as built here
    assert trainer.get_train_dataloader().pin_memory is False  # the CPU run of these tests
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert trainer.get_train_dataloader().pin_memory is pin_memory
    assert trainer.get_eval_dataloader(dataset).pin_memory is pin_memory


def test_a_checkpoints_files_have_the_permissions_the_umask_gives(tmp_path):
    """safetensors writes model.safetensors 0600 (through a private temporary file): a serving account or a colleague
    on a shared file system could not read a checkpoint. Every file of a complete one has the umask's permissions."""
    umask = os.umask(0o022)
    try:
        resumable_run(tmp_path, max_steps=2, save_strategy="steps", save_steps=2).train()
    finally:
        os.umask(umask)
    checkpoint = tmp_path / "checkpoint-2"
    modes = {path.name: path.stat().st_mode & 0o777 for path in checkpoint.rglob("*") if path.is_file()}
    assert "model.safetensors" in modes and COMPLETE_MARKER in modes
    assert set(modes.values()) == {0o644}, modes


def test_a_training_loaders_worker_ignores_the_preemption_signals_and_is_seeded_by_its_rank():
    """What `start_loader_worker` leaves in a training loader's worker: the preemption signals ignored (the main
    process answers them), and the random generators seeded as transformers seeds workers, `num_workers × rank`
    plus the worker's torch seed, so that the workers of different processes draw different numbers."""
    handlers = {signum: signal.getsignal(signum) for signum in PREEMPTION_SIGNALS}
    drawn = {}
    try:
        for rank in (0, 1):
            torch.manual_seed(1234)  # the worker's torch seed, which the DataLoader sets
            start_loader_worker(0, num_workers=2, rank=rank, seeded=True)
            assert {signal.getsignal(signum) for signum in PREEMPTION_SIGNALS} == {signal.SIG_IGN}
            drawn[rank] = (random.random(), np.random.rand(), torch.rand(1).item())
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    for rank in (0, 1):
        set_seed(1234 + 2 * rank)
        assert drawn[rank] == (random.random(), np.random.rand(), torch.rand(1).item())
    assert drawn[0] != drawn[1]


def test_rerunning_a_finished_run_on_another_process_than_the_main_one_keeps_that_process_off_its_role(
    tmp_path, monkeypatch
):
    """The state loaded from the checkpoint is the main process's (is_world_process_zero true): on another process,
    the callbacks reading it (TensorBoard's, the progress bar) would write as the main process does. One process
    stands in for rank 1 of another node, told that it is not the main process."""
    resumable_run(tmp_path, save_strategy="steps", save_steps=6).train()
    rerun = resumable_run(tmp_path, save_strategy="steps", save_steps=6)
    monkeypatch.setattr(rerun, "is_world_process_zero", lambda: False)
    monkeypatch.setattr(rerun, "is_local_process_zero", lambda: False)
    rerun.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    assert rerun.state.global_step == 6, "nothing left to train"
    assert not rerun.state.is_world_process_zero and not rerun.state.is_local_process_zero


def test_an_optimizer_state_lacking_a_setting_of_a_newer_torch_resumes_with_its_default(tmp_path):
    """A checkpoint saved by an older torch, whose AdamW had no `decoupled_weight_decay`: a setting the built optimizer
    alone has is a newer torch's, loaded with its default. Another optimizer differs on both sides (refused)."""
    resumable_run(tmp_path, save_strategy="steps", save_steps=3, max_steps=3).train()
    path = tmp_path / "checkpoint-3" / "optimizer.pt"
    state = torch.load(path, weights_only=True)
    assert all("decoupled_weight_decay" in group for group in state["param_groups"])
    for group in state["param_groups"]:
        del group["decoupled_weight_decay"]
    torch.save(state, path)
    resumed = resumable_run(tmp_path, save_strategy="steps", save_steps=3)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert resumed.state.global_step == 6 and (tmp_path / "checkpoint-6").is_dir()


def test_train_runtime_counts_from_the_start_of_train_not_from_the_trainers_construction(tmp_path, monkeypatch):
    """A trainer built an hour before train() (the data prepared meanwhile, a wait on the other processes):
    train_runtime and the rates divided by it are those of the updates. The hour passes on the monotonic clock,
    by which they are measured."""
    tokenizer = word_tokenizer()
    args = training_args(tmp_path, max_steps=2, warmup_steps=1, max_tokens_per_device=36)
    trainer = make_trainer(args, equal_length_halves(len(tokenizer)), tokenizer, tiny_model(len(tokenizer)))
    clock = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: clock() + 3600)
    metrics = trainer.train().metrics
    assert 0 < metrics["train_runtime"] < 600, metrics


def test_an_evaluation_logged_between_two_training_logs_takes_none_of_their_throughput(tmp_path):
    """Throughput is a training log's: an evaluation logged between two (eval_steps off the logging steps) must not
    take the tokens counted so far, or the next training log covers only the updates after the evaluation."""
    tokenizer = word_tokenizer()
    dataset = equal_length_halves(len(tokenizer))
    settings = {"max_steps": 2, "logging_steps": 2, "eval_strategy": "steps", "eval_steps": 1, "warmup_steps": 1}
    args = training_args(tmp_path, max_tokens_per_device=36, **settings)
    trainer = make_trainer(args, dataset, tokenizer, tiny_model(len(tokenizer)), eval_dataset=dataset)
    trainer.train()
    evaluations = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    assert len(evaluations) == 2 and not any("tokens_per_second" in entry for entry in evaluations)
    (logged,) = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logged["updates_logged"] == 2
