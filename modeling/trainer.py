"""`Seq2SeqTrainer` with the paper's recipe: token-budget batches, the schedule of Sec. 5.3, BLEU while training.

What `TokenBudgetSeq2SeqTrainer` adds to the Trainer, and why:

- **Token-budget batches** (Sec. 5.1: "approximately 25000 source tokens and 25000 target tokens") from
  `modeling.batching.TokenBudgetBatchSampler`, sharded over processes by accelerate, and a number of
  **micro-batches per update derived from the world size**, so an update holds the same number of tokens on 1 or
  8 GPUs.
- **The exact schedule** of Sec. 5.3 (`modeling.schedule`), `learning_rate` being its multiplier.
- **Validation**: loss on the whole validation split, and BLEU by the paper's beam search on a fixed sample of it.
- **Label smoothing in the model's fused loss** (its `smoothing_epsilon` argument) instead of the Trainer's
  `LabelSmoother`, which needs the (B, T, V) logits and makes several passes over them: on CPU the training forward
  fuses the output projection with the loss and never builds them; the same value and gradients.
- **Time-based checkpoints and a wall-clock budget** (`modeling.callbacks`).
- **Stopping cleanly when preempted**: the first SIGTERM / SIGINT / SIGUSR1 / SIGHUP ends training after the update
  under way with a complete checkpoint (`modeling.callbacks.PreemptionCallback`); `trainer.preempted` then says so.
- **Atomic checkpoints**: the Trainer's own `_save_checkpoint` writes into a hidden staging directory
  (`OUT/.checkpoint-N.partial/checkpoint-N`); the main process then flushes it, lists every file with its size in
  `checkpoint_complete.json` and renames it to `OUT/checkpoint-N`. A save killed at any point leaves no
  `checkpoint-N` behind, and `save_total_limit` rotates over complete checkpoints only (`modeling.checkpoints`).

How batches are sharded over processes: the sampler is built for one process (`num_replicas=1`) and
`accelerator.prepare` wraps it in a `BatchSamplerShard`, which gives rank r the batches r, r + R, ... and, with
accelerate's default `even_batches=True`, repeats a few first batches at the end of an epoch so every rank gets the
same number (with `even_batches=False` ranks would get different numbers of batches and DDP would hang on the
last one). Evaluation batches are instead split until their number is a multiple of R, so that nothing is
evaluated twice.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import inspect
import json
import logging
import math
import os
import shutil
import signal
import time
from collections.abc import Callable
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
from accelerate.utils import recursively_apply
from torch.utils.data import DataLoader, Sampler
from transformers import EvalPrediction, PreTrainedTokenizerBase, Seq2SeqTrainer, TrainerState
from transformers.integrations import TensorBoardCallback
from transformers.trainer_pt_utils import LabelSmoother
from transformers.trainer_utils import EvalLoopOutput, TrainOutput, seed_worker

from .arguments import TranslationTrainingArguments
from .batching import (
    FixedBatchSampler,
    TokenBudgetBatchSampler,
    sequence_lengths,
    split_batches_to_multiple,
    update_batching,
)
from .callbacks import (
    PREEMPTION_SIGNALS,
    PreemptionCallback,
    SamplerEpochCallback,
    SaveEveryMinutesCallback,
    StopAfterMinutesCallback,
    TensorBoardGivenUpCallback,
    TrainingClockCallback,
    any_rank,
)
from .checkpoints import (
    RUN_IDENTITY_FILE,
    TRAINER_STATE_NAME,
    complete_checkpoints,
    latest_complete_checkpoint,
    marker_record,
    model_card_files,
    removed_by_rotation,
    saved_training_arguments,
    staging_directories,
    write_completeness_marker,
)
from .files import (
    publish_tree,
    read_json,
    remove_tree,
    replace_files,
    swap_directory,
    undeletable,
    write_error,
    write_json,
    write_text,
)
from .schedule import check_warmup_steps, noam_learning_rate, noam_scheduler
from .scoring import corpus_scores, moses_finds_words

logger = logging.getLogger(__name__)

# What `bleu_metrics` scores, reported by an evaluation with a BLEU sample as eval_sample_<name>.
BLEU_METRICS = ("bleu", "paper_bleu", "chrf", "sentences")


class SaveFailedOnAnotherProcessError(OSError):
    """A save (a checkpoint, the final model) that failed on another process, which raises its own cause: this one
    stops too, an OSError as the cause most often is, so that the scripts say it in one line."""


class TrainingDiverged(ArithmeticError):
    """An update's gradients were not finite (NaN or inf): the run stopped before applying them, so its weights and
    its checkpoints stay finite. One line, naming the update and the newest complete checkpoint."""


class _EvaluationAbandoned(Exception):
    """Raised inside the evaluation loop on a preemption signal; `evaluate` turns it into a stop."""

    def __init__(self, signal: Any):
        super().__init__(signal.name)
        self.signal = signal


class _StoppedBeforeAnUpdate(Exception):
    """Raised by `evaluate` when a signal came while evaluating before this launch's first update."""


# The flags behind optimizer settings; those the schedule sets, or that change how and not what it computes.
_OPTIMIZER_FLAGS = {"betas": "--adam_beta1/--adam_beta2", "eps": "--adam_epsilon", "weight_decay": "--weight_decay"}
_SCHEDULED_OR_IMPLEMENTATION = {"params", "lr", "initial_lr", "foreach", "fused", "capturable", "differentiable"}
# Settings of the updates that a resume takes from its first update on: nothing in the checkpoint overrides them.
_APPLIED_FROM_THE_RESUME = {"label_smoothing_factor": "--label_smoothing_factor", "max_grad_norm": "--max_grad_norm"}


def _same(value: Any, saved: Any) -> bool:
    if _numbers(value) is not None and _numbers(saved) is not None:
        return _close(value, saved)
    return value == saved


def _override_refusal(checkpoint: Path, used: list[str]) -> ValueError:
    return ValueError(
        f"Cannot resume from {checkpoint} with {', '.join(used)}: a resumed run keeps the optimizer and schedule of "
        "its checkpoint. Resume with the checkpoint's values, or train on from its weights with the new ones as a new "
        f"run (--model_name_or_path {checkpoint}, another --output_dir)"
    )


def _missing_optimizer_state(checkpoint: Path) -> list[str]:
    """The files of the optimizer's and the schedule's state that `checkpoint` lacks (one saved with
    `--save_only_model`, a model directory). The Trainer loads neither unless both are there (`optimizer.bin` or an
    `optimizer*` folder of sharded states will do for the optimizer) and otherwise trains on with Adam's moments at
    zero and the warmup begun again, without a word."""
    optimizer = any(
        (path.is_dir() and "optimizer" in path.name) or path.name in ("optimizer.pt", "optimizer.bin")
        for path in checkpoint.iterdir()
    )
    held = {"optimizer.pt": optimizer, "scheduler.pt": (checkpoint / "scheduler.pt").is_file()}
    return [name for name, present in held.items() if not present]


def _require_still_there(checkpoint: str) -> None:
    """The Trainer reads a resumed checkpoint's trainer state, optimizer, schedule and random states one after the
    other, each only if its file is there: a checkpoint that another run still training rotated out meanwhile
    (save_total_limit) resumed without them (at update 0, Adam's moments at zero, the warmup begun again), without a
    word."""
    if not os.path.isdir(checkpoint):
        raise removed_by_rotation(
            checkpoint, "it was resumed", "resume from a checkpoint that run keeps, or from a copy"
        )


def _other_processes_refusal(checkpoint: Path, saved: dict[str, int], batching: dict[str, int]) -> ValueError:
    """A requeue on another number of processes, with micro-batches per update fixed by the arguments: updates of
    another size, and the Trainer would skip another part of the epoch than the one trained on. Says what keeps
    them."""
    total, split = _batches_per_update(saved), _split_over(saved, batching["processes"])
    if split is not None:
        keep = [f"--gradient_accumulation_steps {split['micro_batches_per_update']}"]
        if batching["max_tokens_per_device"] != saved["max_tokens_per_device"]:
            keep.append(f"--max_tokens_per_device {saved['max_tokens_per_device']}")
        fix = f"resume with {' '.join(keep)} to keep them"
    else:
        fix = f"resume on a number of processes that divides {total}, with as many micro-batches as keep {total}"
    return ValueError(
        f"Cannot resume {checkpoint} as {_describe_batching(batching)}: it was trained as "
        f"{_describe_batching(saved)}, {total} batches per update, and other updates would skip another part of the "
        f"epoch than the one trained on; {fix} (or train on from its weights as a new run: --model_name_or_path "
        f"{checkpoint})"
    )


def _numbers(value: Any) -> tuple[float, ...] | None:
    """A number, or a tuple or list of numbers, as a tuple of floats; None for anything else."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    if all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in values):
        return tuple(float(item) for item in values)
    return None


def _close(value: Any, saved: Any) -> bool:
    ours, theirs = _numbers(value), _numbers(saved)
    if len(ours) != len(theirs):
        return False
    return all(math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0) for a, b in zip(ours, theirs, strict=True))


def _shown(value: Any) -> str:
    numbers = _numbers(value)
    return ", ".join(f"{number:g}" for number in numbers) if numbers is not None else repr(value)


def _batches_per_update(batching: dict[str, int]) -> int:
    """Batches in one update over all processes: the same number split otherwise over the processes makes the same
    updates, in the same order (rank r takes batches r, r + R, ... of one shuffled list; see `batching`), but for
    the repeats that fill an epoch's last update, whose number depends on the processes."""
    return batching["processes"] * batching["micro_batches_per_update"]


def _split_over(saved: dict[str, int], processes: int) -> dict[str, int] | None:
    """`saved`'s batches per update split over `processes` processes (the same updates: `_batches_per_update`), or
    None where they do not divide evenly."""
    total = _batches_per_update(saved)
    if total % processes != 0:
        return None
    return {
        "processes": processes,
        "micro_batches_per_update": total // processes,
        "max_tokens_per_device": saved["max_tokens_per_device"],
    }


def _recorded_batching(record: dict[str, Any]) -> dict[str, int] | None:
    """The batching a checkpoint's marker `record` holds, or None where it holds none (or not all of it)."""
    batching = record.get("batching")
    keys = {"processes", "micro_batches_per_update", "max_tokens_per_device"}
    return batching if isinstance(batching, dict) and keys <= batching.keys() else None


def _checkpoint_batching(checkpoint: str | os.PathLike) -> dict[str, int] | None:
    """The batching `checkpoint` was trained with: its marker's record; for a checkpoint saved before markers
    recorded it (2026-12-03), the micro-batches and their size in the Trainer's pickled arguments, over as many
    processes as saved a random state (`rng_state.pth` alone: one; `rng_state_R.pth`: one per rank R)."""
    batching = _recorded_batching(marker_record(checkpoint))
    if batching is not None:
        return batching
    arguments = saved_training_arguments(checkpoint) or {}
    micro_batches, max_tokens = arguments.get("gradient_accumulation_steps"), arguments.get("max_tokens_per_device")
    single = (Path(checkpoint) / "rng_state.pth").is_file()
    processes = 1 if single else len(list(Path(checkpoint).glob("rng_state_*.pth")))
    if not processes or not isinstance(micro_batches, int) or not isinstance(max_tokens, int):
        return None
    return {"processes": processes, "micro_batches_per_update": micro_batches, "max_tokens_per_device": max_tokens}


def _precision(arguments: dict[str, Any]) -> str:
    """The precision a run's training arguments ask of its updates: bf16 or fp16 mixed precision, else fp32."""
    if arguments.get("bf16"):
        return "bf16 mixed precision"
    if arguments.get("fp16"):
        return "fp16 mixed precision"
    return "fp32"


def _best_rule(arguments: dict[str, Any]) -> tuple[str, bool] | None:
    """How a run's arguments choose its best checkpoint: the evaluation metric, and whether greater is better; None
    where they choose none."""
    metric = arguments.get("metric_for_best_model")
    if metric is None:
        return None
    return (metric if metric.startswith("eval_") else f"eval_{metric}", bool(arguments.get("greater_is_better")))


def _describe_best_rule(rule: tuple[str, bool] | None) -> str:
    if rule is None:
        return "no metric"
    return f"{'the highest' if rule[1] else 'the lowest'} {rule[0]}"


def _describe_batching(batching: dict[str, int]) -> str:
    return (
        f"{batching['processes']} process(es) × {batching['micro_batches_per_update']} micro-batch(es) per update "
        f"of at most {batching['max_tokens_per_device']} tokens"
    )


def check_sharding(args: TranslationTrainingArguments, num_processes: int) -> None:
    """Token-budget batches go whole to the processes, the same number to each: accelerate must not split them. Its
    split_batches fails on one process too, naming no setting: it divides a batch size, which these batches lack."""
    config = args.accelerator_config
    refused = ["split_batches=True"] if config.split_batches else []
    if num_processes > 1:  # one process: nothing is dispatched or left uneven
        refused += ["dispatch_batches=True"] if config.dispatch_batches else []
        refused += [] if config.even_batches else ["even_batches=False"]
    if refused:
        raise ValueError(
            f"accelerator_config {', '.join(refused)}: token-budget batches are sharded whole (accelerate cannot "
            "split them), the same number to every process; keep split_batches=False, dispatch_batches=False and "
            "even_batches=True."
        )


def _remove_interrupted_saves(run_dir: Path) -> None:
    """Remove what saves, replacements and rotations killed midway left in `run_dir` (`.checkpoint-N.partial`,
    `.old`, `.deleting`: up to a whole checkpoint each, which a resume never uses), before a save needs the room.
    Removed only once that save was complete, they made a disk or quota freed for one more checkpoint refuse it."""
    for leftover in staging_directories(run_dir):
        logger.warning("Removing %s, what an interrupted save left", leftover)
        shutil.rmtree(leftover, ignore_errors=True)


def _token_ids_sha256(dataset: datasets.Dataset | dict | None) -> str | None:
    """sha256 of a tokenised dataset's `input_ids` and `labels`, row by row; None for anything else."""
    if not isinstance(dataset, datasets.Dataset):
        return None
    digest = hashlib.sha256(f"{len(dataset)} examples\n".encode())
    scored = [name for name in ("input_ids", "labels") if name in dataset.column_names]
    for batch in dataset.select_columns(scored).iter(batch_size=1024):
        digest.update(json.dumps(batch).encode())
    return digest.hexdigest()


def evaluation_metrics(bleu: bool, target_lang: str | None = None) -> frozenset[str]:
    """The metrics `TokenBudgetSeq2SeqTrainer.evaluate` reports, with (`bleu`) or without a BLEU sample into
    `target_lang`: what `metric_for_best_model` may name."""
    timing = ("runtime", "samples_per_second", "steps_per_second")
    names = {f"eval_{name}" for name in ("loss", *timing)}
    if bleu:
        scored = [name for name in BLEU_METRICS if name not in _unscored_metrics(target_lang)]
        names |= {f"eval_sample_{name}" for name in ("loss", *timing, *scored)}
    return frozenset(names)


def _unscored_metrics(target_lang: str | None) -> tuple[str, ...]:
    """The `BLEU_METRICS` that `bleu_metrics` leaves out into `target_lang`: the paper's tokenised BLEU into a
    language written without spaces between words (`corpus_scores` does not compute it there)."""
    return ("paper_bleu",) if target_lang is not None and not moses_finds_words(target_lang) else ()


def _random_state_kept(device: torch.device) -> contextlib.AbstractContextManager:
    """torch's random state on the CPU and on `device`, put back when the block ends."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[device], device_type=device.type)


def start_loader_worker(worker_id: int, *, num_workers: int, rank: int, seeded: bool) -> None:
    """A DataLoader worker's start: it ignores the preemption signals, which the main process alone answers by
    finishing the update and saving a checkpoint (a terminal's Ctrl-C, a scheduler's SIGTERM reach every process
    of the job). Workers started by `spawn`, macOS' default, had the default handlers: they died, and the run
    ended in `DataLoader worker (pid N) is killed by signal: Terminated` with no checkpoint (forked workers had
    the main process's handler). Training workers are then seeded as transformers seeds them."""
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if seeded:
        seed_worker(worker_id, num_workers=num_workers, rank=rank)


def _token_counts(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """[real source, padded source, real target, padded target] tokens of one batch."""
    attention_mask, labels = inputs["attention_mask"], inputs["labels"]
    return torch.stack(
        [
            attention_mask.sum(),
            torch.tensor(attention_mask.numel(), device=attention_mask.device),
            labels.ne(-100).sum(),
            torch.tensor(labels.numel(), device=labels.device),
        ]
    ).to(torch.int64)


class TokenBudgetSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with token-budget batches, the schedule of Sec. 5.3 and BLEU on a validation sample.

    `args` must be `TranslationTrainingArguments`. Datasets are `datasets.Dataset`s with `input_ids`, `labels` (and
    `attention_mask`), as `modeling.data.tokenize_parallel_dataset` makes them. `bleu_dataset`, a fixed sample of
    the validation split, is translated by beam search at each evaluation and scored with `compute_metrics`, while
    the loss is computed on the whole `eval_dataset` (without generation, which would cost far more).
    `preemption` is the `PreemptionCallback` to use (one that handles signals from before training, say);
    by default the trainer makes its own.

    Besides the Trainer's logs, each training log holds `tokens_per_second` (real source + target tokens over all
    processes), `source_tokens_per_update`, `target_tokens_per_update`, `padding_efficiency` (real / padded tokens)
    and `gradient_accumulation_steps`, measured on the batches of the logging interval, and `updates_logged`, the
    updates whose mean the log's loss is (after a resume, those since the checkpoint: fewer than since the last log).
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        args: TranslationTrainingArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: datasets.Dataset | None = None,
        eval_dataset: datasets.Dataset | dict[str, datasets.Dataset] | None = None,
        *,
        bleu_dataset: datasets.Dataset | None = None,
        preemption: PreemptionCallback | None = None,
        **kwargs: Any,
    ):
        if not isinstance(args, TranslationTrainingArguments):
            raise TypeError("TokenBudgetSeq2SeqTrainer needs args=TranslationTrainingArguments(...).")
        if bleu_dataset is not None and not args.predict_with_generate:
            raise ValueError("BLEU on bleu_dataset needs predict_with_generate=True.")
        # The memory a device was given: batches for `tokens_per_update` may be smaller, never larger, and
        # evaluation batches keep it, so that an evaluation does not depend on the number of processes.
        self.max_tokens_limit = args.max_tokens_per_device
        if args.tokens_per_update is not None and train_dataset is not None:
            args = copy.copy(args)  # the caller's arguments stay as given
            args.gradient_accumulation_steps, args.max_tokens_per_device = update_batching(
                args.tokens_per_update, train_dataset, args.max_tokens_per_device, args.world_size
            )
        super().__init__(model, args, data_collator, train_dataset, eval_dataset, **kwargs)
        self.bleu_dataset = bleu_dataset
        self._loss_only = False
        # [summed loss, labelled tokens, batches left out for a non-finite loss] while evaluating
        self._evaluation_loss_totals: torch.Tensor | None = None
        self._evaluation_batches = 0  # on each process, in the last evaluation loop
        self._evaluation_samples = 0  # the examples of the last evaluation loop
        self._evaluation_seconds = 0.0  # the last evaluation loop's, by the monotonic clock
        self._training_clock = TrainingClockCallback()
        self.add_callback(self._training_clock)
        self._sampler_epoch = SamplerEpochCallback()
        self.add_callback(self._sampler_epoch)
        self.preemption = preemption if preemption is not None else PreemptionCallback()
        self.add_callback(self.preemption)
        reported = [callback for callback in self.callback_handler.callbacks if type(callback) is TensorBoardCallback]
        for callback in reported:  # report_to's (a caller's own subclass stays as it is)
            self.pop_callback(callback)
            self.add_callback(TensorBoardGivenUpCallback(callback.tb_writer))
        self._staging_root: Path | None = None
        self._kept_undeletable: set[Path] = set()  # checkpoints rotation may not delete, warned once
        self.last_checkpoint: Path | None = None  # the newest checkpoint this trainer saved (complete)
        self._resumed_checkpoint: Path | None = None  # the checkpoint train() resumes from
        if self.args.save_every_minutes is not None:
            self.add_callback(SaveEveryMinutesCallback(self.args.save_every_minutes))
        if self.args.max_train_minutes is not None:
            self.add_callback(StopAfterMinutesCallback(self.args.max_train_minutes))
        self._reset_throughput()
        self._sentences_trained = 0
        # Sec. 5.4's label smoothing in the model's own fused loss when it has one, instead of `LabelSmoother`'s
        # several passes over the (B, T, V) log-probabilities: the same value (tested), faster.
        forward = inspect.signature(self.accelerator.unwrap_model(self.model).forward).parameters
        self._fused_label_smoothing = self.label_smoother is not None and "smoothing_epsilon" in forward
        if self._fused_label_smoothing:
            self.label_smoother = None

    # --- data ---

    @property
    def _data_seed(self) -> int:
        return self.args.data_seed if self.args.data_seed is not None else self.args.seed

    def _token_dataset(self, dataset: Any, description: str) -> datasets.Dataset:
        if not isinstance(dataset, datasets.Dataset):
            raise TypeError(f"The {description} dataset must be a datasets.Dataset, got {type(dataset).__name__}.")
        missing = {"input_ids", "labels"} - set(dataset.column_names)
        if missing:
            raise ValueError(
                f"The {description} dataset lacks {sorted(missing)}: tokenize it with "
                "modeling.data.tokenize_parallel_dataset."
            )
        return self._remove_unused_columns(dataset, description=description)

    def _dataloader(self, dataset: datasets.Dataset, batch_sampler: Sampler[list[int]], training: bool) -> DataLoader:
        workers = self.args.dataloader_num_workers
        loader = DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            collate_fn=self.data_collator,
            num_workers=workers,
            pin_memory=self.args.dataloader_pin_memory and torch.cuda.is_available(),
            persistent_workers=self.args.dataloader_persistent_workers and workers > 0,
            prefetch_factor=self.args.dataloader_prefetch_factor if workers > 0 else None,
            worker_init_fn=partial(
                start_loader_worker, num_workers=workers, rank=self.args.process_index, seeded=training
            ),
        )
        return self.accelerator.prepare(loader)

    def get_train_dataloader(self) -> DataLoader:
        """Shuffled token-budget batches, sharded over processes by accelerate (see the module docstring)."""
        if self.train_dataset is None:
            raise ValueError("Training requires a train_dataset.")
        check_sharding(self.args, self.accelerator.num_processes)
        dataset = self._token_dataset(self.train_dataset, "training")
        sampler = self._train_sampler(dataset)
        self._sampler_epoch.sampler = sampler
        efficiency = sampler.padding_efficiency()
        logger.info(
            "Training on %d batches per epoch of at most %d padded tokens per side (padding efficiency %.3f), "
            "%d process(es), %d micro-batch(es) per update",
            len(sampler),
            self.args.max_tokens_per_device,
            efficiency["total"],
            self.accelerator.num_processes,
            self.args.gradient_accumulation_steps,
        )
        return self._dataloader(dataset, sampler, training=True)

    def _train_sampler(self, dataset: datasets.Dataset) -> TokenBudgetBatchSampler:
        return TokenBudgetBatchSampler(
            *sequence_lengths(dataset), self.args.max_tokens_per_device, shuffle=True, seed=self._data_seed
        )

    def get_eval_dataloader(self, eval_dataset: str | datasets.Dataset | None = None) -> DataLoader:
        """Token-budget batches in length order, each example on exactly one process."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Evaluation requires an eval_dataset.")
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        check_sharding(self.args, self.accelerator.num_processes)
        dataset = self._token_dataset(dataset, "evaluation")
        sampler = TokenBudgetBatchSampler(*sequence_lengths(dataset), self.max_tokens_limit, shuffle=False)
        batches = split_batches_to_multiple(list(sampler), self.accelerator.num_processes)
        return self._dataloader(dataset, FixedBatchSampler(batches), training=False)

    # --- training, stopping, saving ---

    def train(self, resume_from_checkpoint: str | os.PathLike | bool | None = None, **kwargs: Any) -> TrainOutput:
        """`Trainer.train`, handling SIGTERM / SIGINT / SIGUSR1 / SIGHUP as a request to stop with a checkpoint (see
        `PreemptionCallback`); the previous signal handlers are back when it returns or raises. After a stop on
        a signal, `self.preempted` is `{"signal", "step"}` and `self.last_checkpoint` the checkpoint saved.
        `resume_from_checkpoint=True` is the newest complete checkpoint of `output_dir`, incomplete newer ones
        skipped with a warning (`--resume_from_checkpoint last`), and is checked like a path.

        Resuming from a checkpoint already at the run's last update (a run requeued after it, killed while it
        averaged or pushed) trains nothing: its weights and state are loaded (the best checkpoint's weights with
        `load_best_model_at_end`, as at the end of training) and the metrics returned are empty. The Trainer's own
        loop would make one more update before it checks the count, at every rerun. One past it (a requeue that asks
        for fewer updates than the checkpoint holds) is refused, naming the --max_steps that ends the run there."""
        self._reset_throughput()  # what a train() stopped between two logs counted is not this one's
        self._sentences_trained = 0  # on this process, in this train()
        self.last_checkpoint = None
        with self.preemption.handling():
            checkpoint = self._checkpoint_to_resume(resume_from_checkpoint)
            self._resumed_checkpoint = Path(checkpoint) if checkpoint is not None else None
            if checkpoint is not None:
                self.adopt_checkpoint_batching(checkpoint)
            total = self._total_updates() if checkpoint is not None else 0
            state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME)) if checkpoint else None
            if state is not None and state.global_step > total:
                # Else its model was the run's result while the records named the shorter length, without a word.
                length = (
                    f"--max_steps {self.args.max_steps}"
                    if self.args.max_steps > 0
                    else f"--num_train_epochs {self.args.num_train_epochs:g}"
                )
                raise ValueError(
                    f"Cannot resume from {checkpoint}: it is at update {state.global_step}, past the last update of "
                    f"this run ({total}, from {length}); to end the run at update {state.global_step}, give "
                    f"--max_steps {state.global_step}"
                )
            if state is not None and state.global_step >= total:
                logger.info("%s is at update %d of %d: nothing left to train", checkpoint, state.global_step, total)
                if self.is_world_process_zero():  # no save follows to clear them before it
                    _remove_interrupted_saves(Path(self.args.output_dir))
                self._load_from_checkpoint(str(checkpoint))
                state.is_local_process_zero = self.is_local_process_zero()  # saved by the main process
                state.is_world_process_zero = self.is_world_process_zero()
                self.state = state
                self._resumed_best_checkpoint(Path(checkpoint))
                if self.args.load_best_model_at_end and state.best_model_checkpoint is not None:
                    self._load_best_model()
                return TrainOutput(self.state.global_step, float("nan"), {})
            if checkpoint is not None:
                self._check_resumable(Path(checkpoint), total)
            try:
                return super().train(checkpoint, **kwargs)
            except _StoppedBeforeAnUpdate:  # a signal while evaluating before the first update (eval_on_start)
                return TrainOutput(self.state.global_step, float("nan"), {})

    def _checkpoint_to_resume(self, resume_from_checkpoint: str | os.PathLike | bool | None) -> str | None:
        if resume_from_checkpoint is not True:
            return None if resume_from_checkpoint is False else resume_from_checkpoint
        checkpoint = latest_complete_checkpoint(self.args.output_dir)
        if checkpoint is None:
            raise ValueError(f"No complete checkpoint in {self.args.output_dir} to resume from.")
        return str(checkpoint)

    def _load_callback_state(self) -> None:
        # The Trainer calls this right after it loads the resumed checkpoint's state.
        self._take_the_intervals_asked()
        self._resumed_best_checkpoint(self._resumed_checkpoint)
        super()._load_callback_state()

    def _resumed_best_checkpoint(self, checkpoint: Path | None) -> None:
        """The resumed state's best checkpoint as this launch must keep it: named by its place in this run's
        output_dir, and, resuming `checkpoint`, chosen again by another rule or anew on other validation data."""
        self._best_checkpoint_of_this_run()
        if checkpoint is not None:
            self._choose_best_again_by_another_rule(checkpoint)
            self._choose_best_anew_on_other_validation_data(checkpoint)

    def _take_the_intervals_asked(self) -> None:
        """The resumed state's logging, evaluation and save intervals replaced by the arguments': the Trainer kept the
        checkpoint's (warning that they differ, not which it used), so that a requeue with another --save_steps went
        on saving at the old interval while training_args.json and the card named the new one."""
        kinds = ("logging", "eval", "save")
        saved = {kind: getattr(self.state, f"{kind}_steps") for kind in kinds}
        # The run's length counts only for a ratio: an epoch run's is a pass over the lengths of the whole corpus.
        ratio = any(0 < (getattr(self.args, f"{kind}_steps") or 1) < 1 for kind in kinds)
        self.state.compute_steps(self.args, self._total_updates() if ratio else 0)
        changed = [
            f"--{kind}_steps {getattr(self.state, f'{kind}_steps')} (the checkpoint's: {saved[kind]})"
            for kind in kinds
            if getattr(self.state, f"{kind}_steps") != saved[kind]
        ]
        if changed:
            logger.info("Resuming with %s", ", ".join(changed))

    def _best_checkpoint_of_this_run(self) -> None:
        """Name the resumed state's best checkpoint by its place in this run's output_dir. The state records it by
        the path of the directory the run was saved in: in a run moved or renamed since, that path is gone (the
        Trainer forgets the best, rotation deletes it, the end loads the last weights instead), and in a copy it is
        the original's checkpoint, which another run may have replaced since (its weights loaded at the end)."""
        state = self.state
        recorded = state.best_model_checkpoint
        if recorded is not None:
            name = Path(recorded).name
        elif state.best_global_step:  # the Trainer dropped a recorded path that is gone (or none was saved then)
            name = f"checkpoint-{state.best_global_step}"
        else:
            return
        here = Path(self.args.output_dir) / name
        if here.is_dir():
            if recorded is None or Path(recorded) != here:
                logger.info("The run's best checkpoint is %s (its state named %s)", here, recorded or "one now gone")
            state.best_model_checkpoint = str(here)
        elif recorded is not None:
            logger.warning("The run's best checkpoint %s is not in %s: forgotten for this run", name, here.parent)
            state.best_model_checkpoint = None

    def _choose_best_again_by_another_rule(self, checkpoint: Path) -> None:
        """A resume with another `metric_for_best_model` or `greater_is_better` than `checkpoint` was trained with
        chooses the run's best checkpoint again by the new rule, among the run's evaluations of the checkpoints still
        in output_dir. The Trainer compared the new rule's values with the best the old rule had kept (another
        metric's value, or the lowest loss where the highest is now wanted), so that the best it loaded at the end
        was chosen by neither rule, while the records name the new one."""
        saved = saved_training_arguments(checkpoint)
        if saved is None:
            return
        before, now = _best_rule(saved), _best_rule(vars(self.args))
        if now is None or before == now:
            return
        metric, greater = now
        output_dir = Path(self.args.output_dir)
        scored = [
            (entry[metric], entry["step"])
            for entry in self.state.log_history
            if math.isfinite(entry.get(metric, math.nan)) and (output_dir / f"checkpoint-{entry['step']}").is_dir()
        ]
        best = (max if greater else min)(scored, key=lambda score: score[0], default=None)
        state = self.state
        state.best_metric, state.best_global_step = best if best is not None else (None, None)
        state.best_model_checkpoint = str(output_dir / f"checkpoint-{best[1]}") if best is not None else None
        logger.warning(
            "Resuming %s with the best checkpoint chosen by %s, where the run chose it by %s: chosen again among its "
            "evaluations of the checkpoints in %s: %s",
            checkpoint,
            _describe_best_rule(now),
            _describe_best_rule(before),
            output_dir,
            f"checkpoint-{best[1]} ({metric} {best[0]:g})" if best is not None else "none evaluated",
        )

    @cached_property
    def _evaluated_data_sha256(self) -> dict[str, str | None]:
        """sha256 of the token ids that evaluations score, by the marker field recording them: the validation
        split's (`eval_*` metrics) and its BLEU sample's (`eval_sample_*`). Edited validation files, another
        --max_length or --bleu_sample_size change them. None where there is none (or a dict of validation splits)."""
        return {
            "validation_sha256": _token_ids_sha256(self.eval_dataset),
            "bleu_sample_sha256": _token_ids_sha256(self.bleu_dataset),
        }

    def _choose_best_anew_on_other_validation_data(self, checkpoint: Path) -> None:
        """A resume whose evaluations score other data than `checkpoint`'s did chooses the run's best checkpoint
        anew among this launch's evaluations where `metric_for_best_model` is scored on those data: the Trainer
        compared the new scores with the best of the old data, so that the best it kept and loaded at the end was
        chosen across two test sets."""
        recorded = marker_record(checkpoint)
        changed = [
            field
            for field, sha256 in self._evaluated_data_sha256.items()
            if None not in (sha256, recorded.get(field)) and sha256 != recorded[field]
        ]
        if not changed:
            return
        metric = self.args.metric_for_best_model or ""
        scored_on = "bleu_sample_sha256" if metric.removeprefix("eval_").startswith("sample_") else "validation_sha256"
        forgotten = scored_on in changed and self.state.best_model_checkpoint is not None
        logger.warning(
            "Resuming %s with another %s than its evaluations scored (validation files edited, or another "
            "--max_length or --bleu_sample_size): the scores logged before and after it compare two test sets%s",
            checkpoint,
            " and ".join("validation split" if field == "validation_sha256" else "BLEU sample" for field in changed),
            f"; the best checkpoint ({metric}) is chosen anew from this launch's evaluations" if forgotten else "",
        )
        if forgotten:
            self.state.best_metric = self.state.best_global_step = self.state.best_model_checkpoint = None

    def adopt_checkpoint_batching(self, checkpoint: str | os.PathLike) -> None:
        """Keep `checkpoint`'s batches per update and batch size where `tokens_per_update` now derives others (from
        other data, another number of processes, or an earlier version of this code): one run, one update size. On
        another number of processes, its batches per update are split over them where they divide evenly. Not
        where the run now asks for other batches (another `tokens_per_update` or `max_tokens_per_device` than the
        checkpoint records): those are derived, with `_check_resumable`'s warning. Never batches larger than
        `max_tokens_per_device`. `train` calls it when resuming; call it first to record the batching that the run
        will use."""
        record = marker_record(checkpoint)
        saved, batching = _checkpoint_batching(checkpoint), self._batching()
        if (
            self.args.tokens_per_update is None
            or record.get("batching_asked", self._batching_asked()) != self._batching_asked()
            or not saved
            or saved["max_tokens_per_device"] > self.max_tokens_limit
        ):
            return
        adopted = _split_over(saved, batching["processes"])
        if adopted is None or adopted == batching:  # they do not divide; or the same batches (adopted already)
            return
        logger.info(
            "Resuming %s with its own batches (%s) rather than those derived now (%s)",
            checkpoint,
            _describe_batching(adopted),
            _describe_batching(batching),
        )
        self.args.gradient_accumulation_steps = adopted["micro_batches_per_update"]
        self.args.max_tokens_per_device = adopted["max_tokens_per_device"]

    def _total_updates(self) -> int:
        """The run's number of updates: `max_steps`, or what the Trainer derives from `num_train_epochs` and the
        batches each process gets per epoch (accelerate gives every process the same number)."""
        if self.args.max_steps > 0:
            return self.args.max_steps
        sampler = self._train_sampler(self._token_dataset(self.train_dataset, "training"))
        batches = math.ceil(len(sampler) / self.args.world_size)
        per_epoch = max(math.ceil(batches / self.args.gradient_accumulation_steps), 1)
        return math.ceil(self.args.num_train_epochs * per_epoch)

    def _check_resumable(self, checkpoint: Path, total: int) -> None:
        """Refuse to resume from a checkpoint without the optimizer's and the schedule's state
        (`_missing_optimizer_state`), or with a learning rate or warmup that its scheduler state would override
        without a word (the Trainer restores it whole: the new values would be logged and recorded, the old ones
        used; the optimizer's own settings are compared in `_load_optimizer_and_scheduler`). Batches other than the
        checkpoint's: the same batches per update split over another number of processes resume as the same updates
        (but for the repeats closing an epoch); on another number of processes with micro-batches fixed by the
        arguments, other updates are refused (saying what keeps them); otherwise a warning, since the Trainer then
        skips a count of the new batches, not the data already seen. `total` is the run's number of updates."""
        if not self.is_deepspeed_enabled and (missing := _missing_optimizer_state(checkpoint)):
            raise ValueError(
                f"Cannot resume from {checkpoint}: it holds no {' and no '.join(missing)} (saved with "
                "--save_only_model?), so Adam's moments and the learning-rate warmup would start over in the middle "
                f"of the run. Train on from its weights as a new run (--model_name_or_path {checkpoint}, another "
                "--output_dir)"
            )
        given: list[tuple[str, Any, Any]] = []
        scheduler = checkpoint / "scheduler.pt"
        if scheduler.is_file():
            state = torch.load(scheduler, map_location="cpu", weights_only=True)
            if state.get("base_lrs"):
                given.append(("--learning_rate", self.args.learning_rate, state["base_lrs"][0]))
            noam = (state.get("lr_lambdas") or [None])[0]
            if self.args.paper_schedule and isinstance(noam, dict) and "warmup_steps" in noam:
                warmup = self.args.warmup_steps
                # A ratio's count changes with the run's length: named, or the refusal named a count nobody gave.
                flag = "--warmup_steps" if warmup >= 1 else f"--warmup_steps {warmup:g} of {total} updates:"
                given.append((flag, self.args.get_warmup_steps(total), noam["warmup_steps"]))
        used = [
            f"{flag} {_shown(value)} (the checkpoint's: {_shown(saved_value)})"
            for flag, value, saved_value in given
            if not _same(value, saved_value)
        ]
        if used:
            raise _override_refusal(checkpoint, used)
        self._warn_of_other_update_settings(checkpoint)  # not before a refusal: nothing is applied then
        saved_batching = _checkpoint_batching(checkpoint)
        batching = self._batching()
        if not saved_batching or saved_batching == batching:
            return
        if _split_over(saved_batching, batching["processes"]) == batching:  # the same updates
            logger.info(
                "Resuming %s as %s, trained as %s: the same batches per update, in the same order, but for the "
                "repeats that fill an epoch's last update",
                checkpoint,
                _describe_batching(batching),
                _describe_batching(saved_batching),
            )
        elif self.args.tokens_per_update is None and saved_batching["processes"] != batching["processes"]:
            raise _other_processes_refusal(checkpoint, saved_batching, batching)
        else:
            logger.warning(
                "Resuming %s with other batches (%s) than it was trained with (%s): the Trainer skips the updates "
                "done in this epoch as counted in the new batches, so part of the epoch is skipped or seen twice",
                checkpoint,
                _describe_batching(batching),
                _describe_batching(saved_batching),
            )

    def _warn_of_other_update_settings(self, checkpoint: Path) -> None:
        """A resume in another precision than the checkpoint's updates so far (`--bf16`, `--fp16`, or neither) is
        allowed, since a run may move to other hardware, and so is another label smoothing or gradient clipping;
        said, since from here on the run's records (training_args.json, the model card) name the new settings only."""
        saved = saved_training_arguments(checkpoint)
        if saved is None:
            return
        before, now = _precision(saved), _precision(vars(self.args))
        if before != now:
            logger.warning(
                "Resuming %s in %s, where its updates so far were in %s: the run's records will say %s only",
                checkpoint,
                now,
                before,
                now,
            )
        changed = [
            f"{flag} {_shown(getattr(self.args, key))} (its updates so far: {_shown(saved[key])})"
            for key, flag in _APPLIED_FROM_THE_RESUME.items()
            if key in saved and not _same(getattr(self.args, key), saved[key])
        ]
        if changed:
            logger.warning(
                "Resuming %s with %s: applied from here on, but the run's records will show the new values only",
                checkpoint,
                ", ".join(changed),
            )

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """The Trainer's loading of the checkpoint's optimizer state, refused where it would override the optimizer
        the arguments just built (another `--optim`, Adam's betas or epsilon, weight decay, `--optim_args`): the
        saved settings would be used where the new ones are logged and recorded."""
        if checkpoint is not None:
            _require_still_there(checkpoint)
        optimizer = Path(checkpoint) / "optimizer.pt" if checkpoint is not None else None
        if optimizer is not None and optimizer.is_file() and self.optimizer is not None:
            groups = torch.load(optimizer, map_location="cpu", weights_only=True, mmap=True).get("param_groups")
            saved_counts = [len(group.get("params", ())) for group in groups or []]
            built_counts = [len(group["params"]) for group in self.optimizer.param_groups]
            if groups and saved_counts != built_counts:  # else torch's "doesn't match the size of optimizer's group"
                raise ValueError(
                    f"cannot resume {checkpoint}: its optimizer state holds {sum(saved_counts)} parameters "
                    f"({saved_counts} by group), this model trains {sum(built_counts)} ({built_counts}); it was saved "
                    "for a model of other parameters (an untied model saved before 2026-12-04 holds an unused "
                    "`model.shared`): start a new run from its weights (--model_name_or_path) or resume with the "
                    "code that saved it"
                )
            saved, built = (groups or [{}])[0], self.optimizer.param_groups[0]
            saved_keys = saved.keys() - _SCHEDULED_OR_IMPLEMENTATION
            built_keys = built.keys() - _SCHEDULED_OR_IMPLEMENTATION
            if saved_keys - built_keys and built_keys - saved_keys:  # settings of another optimizer on both sides
                optim = getattr(self.args.optim, "value", self.args.optim)
                raise _override_refusal(Path(checkpoint), [f"--optim {optim} (not the checkpoint's optimizer)"])
            # Settings only one side has: a newer torch's (a saved state loads into them with their defaults).
            used = [
                f"{_OPTIMIZER_FLAGS.get(key, f'optimizer {key}')} {_shown(built[key])} "
                f"(the checkpoint's: {_shown(saved[key])})"
                for key in sorted(saved_keys & built_keys)
                if not _same(built[key], saved[key])
            ]
            if used:
                raise _override_refusal(Path(checkpoint), used)
        super()._load_optimizer_and_scheduler(checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if checkpoint is not None:
            _require_still_there(checkpoint)
        super()._load_rng_state(checkpoint)

    def _batching_asked(self) -> dict[str, int | None]:
        """What the arguments ask of the batches, from which `_batching` is derived."""
        return {"tokens_per_update": self.args.tokens_per_update, "max_tokens_per_device": self.max_tokens_limit}

    def _batching(self) -> dict[str, int]:
        """What makes an update: how many batches of at most how many tokens, on how many processes."""
        return {
            "processes": self.args.world_size,
            "micro_batches_per_update": self.args.gradient_accumulation_steps,
            "max_tokens_per_device": self.args.max_tokens_per_device,
        }

    @property
    def preempted(self) -> dict | None:
        return self.preemption.preempted

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """The Trainer's warning after it loads a checkpoint (resuming, or the best one at the end), without the
        tied copies of the shared embedding among the "missing keys": `save_pretrained` stores the matrix once, and
        loading it fills every copy. transformers recognises only `_keys_to_ignore_on_save` as such."""
        model = self.accelerator.unwrap_model(self.model)
        tied = set(getattr(model, "all_tied_weights_keys", None) or {})
        missing = [key for key in load_result.missing_keys if key not in tied]
        if len(missing) < len(load_result.missing_keys):
            model.tie_weights()
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def _get_output_dir(self, trial: Any) -> str:
        # While `_save_checkpoint` runs, the Trainer's own saving goes to the staging directory.
        return str(self._staging_root) if self._staging_root is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """The Trainer's checkpoint, written into `OUT/.checkpoint-N.partial/checkpoint-N`, then made complete
        and renamed to `OUT/checkpoint-N` by the main process (see the module docstring); then the rotation.

        Every process takes part (each writes its RNG state); a failure on any of them, a full disk for
        instance, is raised on all of them, the staging directory removed and the older checkpoints left intact.
        """
        run_dir = Path(super()._get_output_dir(trial))
        final = run_dir / f"checkpoint-{self.state.global_step}"
        staging_root = run_dir / f".{final.name}.partial"
        if self.args.should_save:
            _remove_interrupted_saves(run_dir)  # this very save's killed attempt among them
        self.accelerator.wait_for_everyone()
        failure: Exception | None = None
        self._staging_root = staging_root
        try:
            super()._save_checkpoint(model, trial)
        except Exception as error:
            failure = error
        finally:
            self._staging_root = None
        # The Trainer found "the best" in staging, on every process: each loads it at the end (load_best_model_at_end)
        best = self.state.best_model_checkpoint
        best_in_staging = best is not None and Path(best).parent == staging_root
        if best_in_staging:
            self.state.best_model_checkpoint = str(run_dir / Path(best).name)
        # Once every process has written its part (or failed), the main process completes the checkpoint.
        if not any_rank(failure is not None, self.args.device) and self.args.should_save:
            try:
                self._finish_checkpoint(staging_root / final.name, final, rewrite_state=best_in_staging)
            except Exception as error:
                failure = error
        if any_rank(failure is not None, self.args.device):
            self._abandon_checkpoint(staging_root, final, failure)
        self.last_checkpoint = final
        if self.args.should_save:
            self._rotate_complete_checkpoints(run_dir, final)

    def _abandon_checkpoint(self, staging_root: Path, final: Path, failure: Exception | None) -> None:
        unwritable = write_error(failure, final) if failure is not None else None
        if self.args.should_save:
            shutil.rmtree(staging_root, ignore_errors=True)
        if unwritable is not None:
            raise unwritable from failure
        if failure is not None:
            raise failure
        raise SaveFailedOnAnotherProcessError(
            f"Saving {final} failed on another process (its error says why); the earlier checkpoints are intact."
        )

    def _finish_checkpoint(self, staged: Path, final: Path, rewrite_state: bool) -> None:
        """Main process: flush the staged checkpoint (its trainer state written again when `rewrite_state`: it names
        the best checkpoint by its staging path), write its completeness marker, rename it into place."""
        staging_root = staged.parent
        if rewrite_state:
            write_text(staged / TRAINER_STATE_NAME, self._state_json())
        identity = final.parent / RUN_IDENTITY_FILE
        if identity.is_file():
            shutil.copy2(identity, staged / RUN_IDENTITY_FILE)
        publish_tree(staged)
        strategy = getattr(self.args.save_strategy, "value", self.args.save_strategy)  # for averaging's judgement
        write_completeness_marker(
            staged,
            step=self.state.global_step,
            batching=self._batching(),
            batching_asked=self._batching_asked(),
            save_strategy=strategy,
            **self._evaluated_data_sha256,
        )
        swap_directory(staged, final)
        os.rmdir(staging_root)
        logger.info("Saved the complete checkpoint %s", final)

    def _rotate_complete_checkpoints(self, run_dir: Path, newest: Path) -> None:
        """`save_total_limit` over complete checkpoints only: the newest one and the best one are always kept;
        incomplete `checkpoint-N` directories are neither counted nor deleted (their listing warns about them)."""
        limit = self.args.save_total_limit
        if limit is None or limit <= 0:
            return
        complete = complete_checkpoints(run_dir, warn=False)
        protected = {newest.resolve()}
        if complete:
            protected.add(complete[-1].resolve())
        if self.state.best_model_checkpoint is not None:
            protected.add(Path(self.state.best_model_checkpoint).resolve())
        # Another user's checkpoint (a run resumed from a colleague's, written under a umask of 022) cannot be
        # deleted: logged as deleted, it stayed as `.checkpoint-N.deleting`, removed again, in vain, at every save.
        for checkpoint in list(complete):
            blocked = undeletable(checkpoint)
            if blocked is None:
                continue
            complete.remove(checkpoint)
            if checkpoint not in self._kept_undeletable:
                self._kept_undeletable.add(checkpoint)
                logger.warning(
                    "Keeping %s beyond save_total_limit=%d: this user may not delete what %s holds (another "
                    "user's files)",
                    checkpoint,
                    limit,
                    blocked,
                )
        excess = len(complete) - max(limit, len(protected & {path.resolve() for path in complete}))
        for checkpoint in complete:
            if excess <= 0:
                break
            if checkpoint.resolve() in protected:
                continue
            doomed = checkpoint.with_name(f".{checkpoint.name}.deleting")  # never half-deleted under its name
            remove_tree(doomed)
            os.replace(checkpoint, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            logger.info("Deleted %s (save_total_limit=%d)", checkpoint, limit)
            excess -= 1

    def _state_json(self) -> str:
        return json.dumps(dataclasses.asdict(self.state), indent=2, sort_keys=True) + "\n"

    def save_state(self) -> None:
        """`trainer_state.json` in output_dir, written atomically (main process only)."""
        if self.is_world_process_zero():
            write_text(Path(self.args.output_dir) / TRAINER_STATE_NAME, self._state_json())

    def save_metrics(self, split: str, metrics: dict[str, float], combined: bool = True) -> None:
        """`{split}_results.json` (and `all_results.json`), written atomically (main process only)."""
        if not self.is_world_process_zero():
            return
        output_dir = Path(self.args.output_dir)
        write_json(output_dir / f"{split}_results.json", metrics, indent=4, sort_keys=True)
        if combined:
            path = output_dir / "all_results.json"
            combined_metrics = read_json(path) if path.is_file() else {}
            write_json(path, {**combined_metrics, **metrics}, indent=4, sort_keys=True)

    def save_final_model(self) -> Path:
        """`save_model` into a staging directory, then each file moved into `output_dir` with an atomic rename,
        config.json last: output_dir also holds the checkpoints and the run's records, so it is not swapped whole.
        """
        output_dir = Path(self.args.output_dir)
        staging = output_dir / ".final-model.partial"
        if self.args.should_save:
            remove_tree(staging)
        self.accelerator.wait_for_everyone()
        failure: Exception | None = None
        try:
            self.save_model(str(staging))
            if self.args.should_save:
                publish_tree(staging)
                replace_files(staging, output_dir)
                self._remove_earlier_card(output_dir)
        except Exception as error:
            failure = error
        if any_rank(failure is not None, self.args.device):
            unwritable = write_error(failure, output_dir) if failure is not None else None
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)
            if unwritable is not None:
                raise unwritable from failure
            raise failure or SaveFailedOnAnotherProcessError(
                f"Saving the model to {output_dir} failed on another process (its error says why)."
            )
        return output_dir

    @staticmethod
    def _remove_earlier_card(output_dir: Path) -> None:
        """A model card in output_dir describes the final model saved before this one: a run pushed at its end, then
        trained on, kept its card ("steps: 2", that model's loss) beside the new weights, and a push without
        --card-from uploaded it as theirs."""
        stale = model_card_files(output_dir)
        for path in stale:
            if path.is_dir():
                remove_tree(path)
            else:
                path.unlink()
        if stale:
            logger.info(
                "Removed the model card of the earlier final model from %s (%s): a push renders this model's",
                output_dir,
                ", ".join(path.name for path in stale),
            )

    # --- optimisation ---

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """The schedule of Sec. 5.3 with `learning_rate` as its multiplier, unless `paper_schedule=False`."""
        if not self.args.paper_schedule:
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            warmup = self.args.get_warmup_steps(num_training_steps)
            check_warmup_steps(warmup)
            d_model = self.model.config.d_model
            self.lr_scheduler = noam_scheduler(optimizer or self.optimizer, d_model, warmup)
            self._created_lr_scheduler = True  # the Trainer rebuilds it on the next train() call
            peak = self.args.learning_rate * noam_learning_rate(warmup, d_model, warmup)
            logger.info(
                "Learning rate: %g × d_model^-0.5 × min(step^-0.5, step × %d^-1.5), peak %.3g at update %d",
                self.args.learning_rate,
                warmup,
                peak,
                warmup,
            )
            if peak < 1e-5:
                logger.warning(
                    "learning_rate=%g multiplies the schedule of Sec. 5.3 (1.0 is the paper), giving a peak rate of "
                    "%.2g; for a peak rate of %g use --no_paper_schedule.",
                    self.args.learning_rate,
                    peak,
                    self.args.learning_rate,
                )
        return self.lr_scheduler

    # --- logging ---

    def _reset_throughput(self) -> None:
        self._token_totals = torch.zeros(4, dtype=torch.int64, device=self.args.device)
        self._interval_start: float | None = None
        self._interval_first_update = 0

    def training_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        if self._interval_start is None:  # from its first batch: an evaluation or a save just before it is not counted
            self._interval_start = time.perf_counter()
            self._interval_first_update = self.state.global_step
        self._token_totals += _token_counts(inputs).to(self._token_totals.device)
        self._sentences_trained += len(inputs["input_ids"])
        return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        if self._fused_label_smoothing and "labels" in inputs:
            inputs = {**inputs, "smoothing_epsilon": self.args.label_smoothing_factor}
        if self._evaluation_loss_totals is not None:
            # This batch's mean over its own labelled tokens, which `prediction_step` weighs by their number
            # (divided by the tokens of all processes' batches, the Trainer would scale it by the processes).
            num_items_in_batch = None
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _get_grad_norm(self, model: torch.nn.Module, grad_norm: Any = None) -> Any:
        """The Trainer's gradient norm, which it computes at every update before the optimizer step: a non-finite
        one stops the run there. Else NaN gradients make every weight NaN, the Trainer's `logging_nan_inf_filter`
        logs a loss of 0.0 from then on, and NaN checkpoints rotate the good ones out. The norm is taken over
        gradients already summed over processes, so every process stops at the same update. With fp16's loss scaler
        such an update is skipped and the scale lowered instead, as the scaler is meant to; so under DeepSpeed, whose
        optimizer has stepped (or skipped an fp16 overflow) inside `backward` already."""
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        skipped_elsewhere = self.accelerator.scaler is not None or self.is_deepspeed_enabled
        if grad_norm is not None and not skipped_elsewhere and not math.isfinite(float(grad_norm)):
            raise self._divergence(float(grad_norm))
        return grad_norm

    def _divergence(self, grad_norm: float) -> TrainingDiverged:
        update, run = self.state.global_step + 1, self.args.output_dir
        stopped = f"Training diverged at update {update} of {run}: its gradient norm is {grad_norm}"
        if self.state.global_step == getattr(self, "_initial_global_step", None):  # no learning rate has acted yet
            return TrainingDiverged(
                f"{stopped}, at the first update of this launch: the weights it started from give non-finite "
                "gradients (the weights of a run that had diverged already?), or its batches do. Nothing was saved."
            )
        newest = latest_complete_checkpoint(self.args.output_dir)
        if newest is None:
            return TrainingDiverged(
                f"{stopped}. The update was not applied; no checkpoint was saved before it. Start again with a lower "
                "--learning_rate or more --warmup_steps."
            )
        return TrainingDiverged(
            f"{stopped}. The update was not applied and nothing was saved after it; the newest complete checkpoint is "
            f"{newest} (its weights may be diverging already: take one saved before the loss rose). Resuming with "
            "the same settings retraces the same updates: start a new run from a checkpoint's weights "
            "(--model_name_or_path CHECKPOINT) with a lower --learning_rate or more --warmup_steps."
        )

    def _throughput_logs(self) -> dict[str, float]:
        source, source_padded, target, target_padded = self.accelerator.reduce(self._token_totals, "sum").tolist()
        seconds = time.perf_counter() - self._interval_start
        updates = max(self.state.global_step - self._interval_first_update, 1)
        self._reset_throughput()
        return {
            "tokens_per_second": (source + target) / seconds,
            "source_tokens_per_update": source / updates,
            "target_tokens_per_update": target / updates,
            "padding_efficiency": (source + target) / max(source_padded + target_padded, 1),
            "gradient_accumulation_steps": self.args.gradient_accumulation_steps,
            "updates_logged": updates,
        }

    def _maybe_log_save_evaluate(self, *args: Any, **kwargs: Any) -> None:
        # An evaluation or a save between two logs (eval_steps or save_steps off the logging steps, a save every so
        # many minutes) is not training: its time is left out of the interval's tokens_per_second, as one just
        # before the interval's first batch is.
        start = time.perf_counter()
        super()._maybe_log_save_evaluate(*args, **kwargs)
        if self._interval_start is not None:  # no log in this call: the interval goes on
            self._interval_start += time.perf_counter() - start

    def _finalize_training(self, trial: Any, num_train_samples: int, start_time: float) -> TrainOutput:
        # train_runtime and its rates by the monotonic clock (`TrainingClockCallback`), not by `time.time()`
        return super()._finalize_training(trial, num_train_samples, self._training_clock.wall_clock_start())

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if start_time is not None:  # a training log's train_runtime (include_num_input_tokens_seen), as above
            start_time = self._training_clock.wall_clock_start()
        # Training logs (those with "loss") are made on every process at the same update: reducing is safe there.
        if "loss" in logs and self._interval_start is not None:
            logs = {**logs, **self._throughput_logs()}
        if "train_samples_per_second" in logs:  # the end of train(), on every process
            # The Trainer counts per_device_train_batch_size sentences per batch, which token-budget batches are
            # not: the sentences trained on instead. In place, so that train()'s metrics say the same.
            sentences = torch.tensor(self._sentences_trained, device=self.args.device)
            sentences = self.accelerator.reduce(sentences, "sum").item()
            logs["train_samples_per_second"] = round(sentences / logs["train_runtime"], 3)
        for key in [key for key in logs if key.endswith("_runtime") and key != "train_runtime"]:
            # An evaluation's (`evaluate` logs its metrics, and returns the dict logged), by the monotonic clock: the
            # Trainer subtracts two `time.time()` readings (see `TrainingClockCallback`). Its steps per second are
            # the batches each process evaluated per second: the Trainer counts per_device_eval_batch_size (8)
            # sentences per batch, which token-budget batches are not.
            prefix, seconds = key.removesuffix("_runtime"), self._evaluation_seconds
            logs[key] = round(seconds, 4)
            logs[f"{prefix}_samples_per_second"] = round(self._evaluation_samples / seconds, 3)
            logs[f"{prefix}_steps_per_second"] = round(self._evaluation_batches / seconds, 3)
        super().log(logs, start_time)

    # --- evaluation ---

    def evaluate(
        self,
        eval_dataset: datasets.Dataset | dict[str, datasets.Dataset] | str | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
        **gen_kwargs: Any,
    ) -> dict[str, float]:
        """Loss on `eval_dataset`, without generating; when evaluating the trainer's own datasets, also BLEU on
        `bleu_dataset`, logged as `{metric_key_prefix}_sample_bleu` (and `_paper_bleu`, `_chrf`, `_sentences`,
        `_loss`).

        `predict` translates and scores whatever it is given. The random state is left as it was (each evaluation
        DataLoader draws its seed from torch's generator): training goes on as without the evaluation, so that a run
        preempted at an evaluation (skipped, or abandoned half-way) resumes with the uninterrupted run's dropout."""
        try:
            with _random_state_kept(self.args.device):
                self._loss_only = True
                try:
                    metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)
                finally:
                    self._loss_only = False
                if eval_dataset is None and self.bleu_dataset is not None:
                    metrics |= super().evaluate(
                        self.bleu_dataset, ignore_keys, f"{metric_key_prefix}_sample", **gen_kwargs
                    )
        except _EvaluationAbandoned as abandoned:
            self._stop_for(abandoned.signal)
            if self.state.global_step == getattr(self, "_initial_global_step", None):
                raise _StoppedBeforeAnUpdate from None  # nothing new to save, and no update to wait for
            return {}
        return metrics

    def _stop_for(self, signal: Any) -> None:
        """A signal came while evaluating during training: what `PreemptionCallback` does at the end of an update,
        at once (the checkpoint of this update is saved next, before the grace period ends)."""
        self.preemption.preempted = {"signal": signal.name, "step": self.state.global_step}
        logger.warning(
            "Preempted (%s) while evaluating at update %d: abandoning the evaluation, saving a checkpoint and "
            "stopping",
            signal.name,
            self.state.global_step,
        )
        self.control.should_training_stop = True
        self.control.should_save = True

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any) -> bool:
        if not metrics and self.preempted is not None:  # an abandoned evaluation ranks nothing
            return self.args.save_strategy == "best"  # and under save_strategy="best" the checkpoint is still due
        return super()._determine_best_metric(metrics, trial)

    def evaluation_loop(
        self,
        dataloader: DataLoader,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """The Trainer's evaluation loop, with `{metric_key_prefix}_loss` the loss per labelled token of the whole
        dataset: the Trainer's is the unweighted mean of its batches' means, which weighs the tokens of a short last
        batch (or of a batch split for several processes) more than the others, and changes with the batching and
        the number of processes."""
        self._evaluation_loss_totals = torch.zeros(3, device=self.args.device)  # float32: MPS has no float64
        self.gather_function = self._gather_each_example_once  # `Seq2SeqTrainer` sets the plain `gather`
        started = time.perf_counter()
        try:
            output = super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
            loss_sum, tokens, left_out = self.accelerator.reduce(self._evaluation_loss_totals, "sum").tolist()
        finally:
            self._evaluation_loss_totals = None
        # What the Trainer's runtime measures: the loop, less the model's preparation in it (if it was the first)
        preparation = output.metrics.get(f"{metric_key_prefix}_model_preparation_time", 0.0)
        self._evaluation_seconds = time.perf_counter() - started - preparation
        self._evaluation_batches, self._evaluation_samples = len(dataloader), output.num_samples
        key = f"{metric_key_prefix}_loss"
        if left_out and tokens:  # the Trainer leaves them out without a word: the loss is that of part of the split
            logger.warning(
                "%s: %d of the %d batches evaluated had a non-finite loss (NaN or inf), left out of %s "
                "(logging_nan_inf_filter): the model may be diverging",
                description,
                left_out,
                self._evaluation_batches * self.accelerator.num_processes,
                key,
            )
        if key in output.metrics and tokens:
            output.metrics[key] = loss_sum / tokens
        return output

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
        **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        if self.preempted is None and self.is_in_train:
            # A signal while evaluating during training (the generating part can take minutes): stop here rather
            # than after the evaluation, which could outlast the grace period before a kill. A collective, as every
            # process runs the same number of evaluation batches.
            agreed = self.preemption.agreed(self.args.device)
            if agreed is not None:
                raise _EvaluationAbandoned(agreed)
        # `Seq2SeqTrainer.prediction_step` fills unset fields of the model's generation config with library defaults,
        # among them max_length=20, which would then cap every later translation (and the saved generation config)
        # at 20 tokens instead of the paper's source length + 50: the config it fills is put back after. This model
        # also undoes that fill itself (`undo_library_default_fill`, for a plain Seq2SeqTrainer); other models given
        # to this trainer (a MarianMTModel) do not.
        generation_config = copy.deepcopy(self.model.generation_config)
        labels_given = inputs.get("labels")  # the Trainer's loss with a label smoother pops them
        loss_only = prediction_loss_only or self._loss_only
        # When it generates, `Seq2SeqTrainer.prediction_step` takes the loss from its own call of the model, smoothed
        # only by `label_smoother`: set for that call, or the loss logged beside BLEU (eval_sample_loss, test_loss)
        # would be unsmoothed while eval_loss, from `compute_loss`, is smoothed.
        smooth_here = self._fused_label_smoothing and self.args.predict_with_generate and not loss_only
        if smooth_here:
            self.label_smoother = LabelSmoother(epsilon=self.args.label_smoothing_factor)
        try:
            loss, generated, labels = super().prediction_step(
                model, inputs, loss_only, ignore_keys=ignore_keys, **gen_kwargs
            )
        finally:
            self.model.generation_config = generation_config
            if smooth_here:
                self.label_smoother = None
        if loss is not None and self._evaluation_loss_totals is not None and labels_given is not None:
            once, counted = self._rows_evaluated_once(len(labels_given)), loss
            if 0 < once < len(labels_given):  # the loss of the rows counted once, from another call of the model
                # `compute_loss`, not `prediction_step`: this process alone makes the call, with no collective
                with torch.no_grad(), self.compute_loss_context_manager():
                    counted = self.compute_loss(model, {name: value[:once] for name, value in inputs.items()})
            if once:
                self._add_to_evaluation_loss(counted, labels_given[:once])
        return loss, generated, labels

    def _gather_each_example_once(self, tensors: Any) -> Any:
        """`accelerator.gather`, less the rows of the examples that accelerate repeats to complete the last batch of a
        loader of fixed-size batches (`predict`'s) on several processes, which `predict` returned as translations of
        their own. `Seq2SeqTrainer` gathers with `gather`, not `gather_for_metrics`, whose `remainder` rows would cut
        a batch of `num_return_sequences` rows per example short: each example keeps all its rows here."""
        if self.accelerator.num_processes == 1:
            return self.accelerator.gather(tensors)
        gathered = recursively_apply(self._gather_rows, tensors)
        remainder = self._examples_in_repeated_last_batches()
        if remainder is None:
            return gathered
        examples = self.accelerator.gradient_state.active_dataloader.total_batch_size  # of the processes, in turn
        return recursively_apply(lambda rows: rows[: len(rows) // examples * remainder], gathered)

    def _gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The `rows` of every process, in the order of the processes. Token batches hold different numbers of
        sentences on different processes, and `gather` takes equal shapes only: they are padded to the same number
        to be gathered, and the padding dropped, so that a `compute_metrics` sees each example once (padding rows
        of -100 were scored as empty sentences)."""
        counts = self.accelerator.gather(torch.tensor([len(rows)], device=rows.device)).tolist()
        gathered = self.accelerator.gather(self.accelerator.pad_across_processes(rows, dim=0, pad_index=-100))
        most = max(counts)
        return torch.cat([gathered[rank * most : rank * most + count] for rank, count in enumerate(counts)])

    def _rows_evaluated_once(self, rows: int) -> int:
        """How many of this process's batch of `rows` are not repeats (`_examples_in_repeated_last_batches`)."""
        remainder = self._examples_in_repeated_last_batches()
        if remainder is None:
            return rows
        return min(max(remainder - self.args.process_index * rows, 0), rows)

    def _examples_in_repeated_last_batches(self) -> int | None:
        """On several processes, accelerate completes the last batch of a loader of fixed-size batches (`predict`'s:
        the Trainer's own) with the first examples: of the rows of the processes in turn, the first `remainder` are
        the split's last examples, the others repeats. That number in such a batch; None in any other (evaluation's
        token-budget batches are never repeated: `split_batches_to_multiple`)."""
        state = self.accelerator.gradient_state
        if self.accelerator.num_processes == 1 or not state.end_of_dataloader or state.remainder <= 0:
            return None
        return state.remainder

    def _add_to_evaluation_loss(self, loss: torch.Tensor, labels: torch.Tensor) -> None:
        """Count a batch's mean loss for each of its labelled tokens. Not a batch without any (its loss is 0 / 0),
        nor, as the Trainer leaves them out (`logging_nan_inf_filter`), a non-finite loss: that is counted apart."""
        totals = self._evaluation_loss_totals
        tokens = labels.ne(-100).sum().to(totals)
        loss = loss.detach().to(totals)
        # On the device, without asking it for a value: on a GPU that would wait for every batch.
        counted = tokens > 0
        if self.args.logging_nan_inf_filter:
            finite = torch.isfinite(loss)
            totals[2] += counted & ~finite  # warned of after the loop
            counted &= finite
        zero = torch.zeros_like(loss)
        totals[:2] += torch.stack([torch.where(counted, loss * tokens, zero), torch.where(counted, tokens, zero)])


def bleu_metrics(tokenizer: PreTrainedTokenizerBase, target_lang: str) -> Callable[[EvalPrediction], dict]:
    """`compute_metrics` for `Seq2SeqTrainer`: sacreBLEU, the paper's tokenised BLEU (not into a language written
    without spaces between words) and chrF of the generations, and the number of sentences scored.

    References are the decoded labels: the detokenised target up to the BPE's unknown characters, good enough to
    follow training; final scores come from `modeling.evaluation` on the raw text. Rows whose labels are all -100
    (no reference: padding rows, which `TokenBudgetSeq2SeqTrainer` drops before `compute_metrics`) are not scored.
    """
    pad = tokenizer.pad_token_id
    unscored = _unscored_metrics(target_lang)

    def compute(prediction: EvalPrediction) -> dict[str, float]:
        predictions, labels = prediction.predictions, prediction.label_ids
        if len(predictions) > len(labels):  # num_return_sequences rows per example, the best first: that one is scored
            predictions = predictions[:: len(predictions) // len(labels)]
        real = (labels != -100).any(axis=1)
        predictions, labels = predictions[real], labels[real]
        predictions = np.where(predictions != -100, predictions, pad)
        labels = np.where(labels != -100, labels, pad)
        hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        scores = corpus_scores(hypotheses, references, target_lang)
        metrics = {
            "bleu": scores["sacrebleu"],
            "paper_bleu": scores["paper_bleu"],
            "chrf": scores["chrf"],
            "sentences": len(hypotheses),
        }
        # Not logged as None: the log's curves and metric_for_best_model take numbers.
        return {name: value for name, value in metrics.items() if name not in unscored}

    return compute
