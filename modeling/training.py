"""`train()`: the whole pipeline that `scripts/train.py` runs, from parallel text to a saved (and pushed) model.

Steps: load and clean the parallel text (`modeling.data`), train the shared BPE unless one is given
(`modeling.tokenization`), build the preset's model (`modeling.presets`) or load one to fine-tune, train with
`TokenBudgetSeq2SeqTrainer` (`modeling.trainer`), save the final model, average the last checkpoints
(`modeling.averaging`, Sec. 6.1), and with `push_to_hub` push the result with this project's card (`modeling.hub`).

What makes it safe for long runs that get preempted and requeued:

- one command serves the first launch and every requeue: `--resume_from_checkpoint last` resumes from the newest
  complete checkpoint, or starts fresh (logged) where there is none;
- a signal (SIGTERM, SIGINT, SIGUSR1, SIGHUP) stops training after the update under way with a complete checkpoint,
  writes `OUTPUT_DIR/preempted.json` and raises `TrainingPreempted` (which `scripts/train.py` turns into exit code 75);
- an update whose gradients are not finite stops the run before it is applied (`modeling.trainer.TrainingDiverged`),
  so that no NaN checkpoint rotates a good one out and nothing is averaged or pushed;
- `run_identity.json` (architecture, tokenizer, data, seed, preset) is written into the output directory and every
  checkpoint: a new run into a directory that holds another's checkpoints is refused (resume it, or start over
  with `--overwrite_output_dir`), and so is resuming checkpoints of a different run, naming what differs.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import glob
import importlib.metadata
import json
import logging
import os
import platform
import random
import shutil
import socket
import time
import traceback
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    set_seed,
)
from transformers.utils import cached_file

from .arguments import (
    ARCHITECTURE_FLAGS,
    DataArguments,
    ModelArguments,
    TranslationTrainingArguments,
    checkpoint_to_resume,
)
from .averaging import AVERAGING_RECORD_NAME, REPLACEABLE, average_checkpoints, last_checkpoints
from .callbacks import PreemptionCallback, any_rank, lowest_and_highest_over_ranks
from .checkpoints import (
    CHECKPOINT_RE,
    COMPLETE_MARKER,
    CONVERSION_FILE,
    DATA_STATS_FILE,
    PREEMPTED_FILE,
    RUN_IDENTITY_FILE,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_FILE,
    TRAINING_LOCK_FILE,
    RunMismatchError,
    checkpoint_step,
    config_identity,
    describe_differences,
    describe_files,
    identity_differences,
    latest_complete_checkpoint,
    list_checkpoints,
    model_card_files,
    read_run_identity,
    require_complete_checkpoint,
    saved_update,
    staging_directories,
    training_lock_holder,
    vocabulary_fingerprint,
    weights_problems,
    weights_record,
)
from .configuration_transformer import TransformerConfig
from .data import (
    SplitNotFoundError,
    clean_parallel_dataset,
    discover_parallel_files,
    load_parallel_dataset,
    pinned_dataset_commit,
    require_rows,
    split_source,
    tokenize_counting_truncations,
)
from .files import (
    check_replaceable,
    check_writable,
    is_open_as,
    open_lock_file,
    read_json,
    write_files_into,
    write_json,
    write_text,
)
from .hub_client import (
    MODEL_REPO_FILES,
    TOKENIZER_FILES,
    has_any_file,
    holds_tokenizer,
    is_commit,
    looks_like_local_path,
    naming_hub_failures,
    offline_cache_error,
    pinned_commit,
    use_hub_timeouts,
)
from .modeling_transformer import TransformerForConditionalGeneration
from .presets import TrainingPreset, get_preset
from .schedule import check_warmup_steps
from .scoring import check_scorable
from .tokenization import (
    LOADING_ARGUMENTS,
    VOCAB_MULTIPLE,
    check_vocab_size,
    iter_corpus_text,
    missing_tokenizer_files,
    round_up,
    train_shared_bpe,
)
from .tokenization_fairseq import FairseqTokenizer
from .trainer import TokenBudgetSeq2SeqTrainer, bleu_metrics, check_sharding, evaluation_metrics

if TYPE_CHECKING:  # imported for a push only: the Hub extras (jinja2, matplotlib)
    from .hub import HubTarget

logger = logging.getLogger(__name__)

# Recorded in training_args.json: what computes the weights, the data order and the BPE from the same seed.
REPRODUCIBILITY_PACKAGES = ("torch", "transformers", "accelerate", "datasets", "tokenizers", "numpy")
BLEU_SAMPLE_SEED = 0  # the validation sample scored by BLEU is the same for every run, whatever the training seed
MARIAN_MODEL_TYPE = "marian"
# A given tokenizer is tried on this many training pairs; a side with more than this share of its tokens unknown is
# warned of (a BPE trained on both sides has none; a tokenizer trained on one language, a whole script of the other).
UNKNOWN_TOKEN_SAMPLE_PAIRS = 1000
UNKNOWN_TOKEN_WARNING_SHARE = 0.01
# The share of validation pairs found in the training data past which they are warned of: a large corpus may hold a
# few short ones ("Thank you.") by chance.
VALIDATION_IN_TRAINING_WARNING_SHARE = 0.01
# The share of training pairs with the same text on both sides past which they are warned of: names, numbers and URLs
# are the same in both languages; a tenth of a corpus is copy noise, or one language's file given for both.
COPIED_PAIRS_WARNING_SHARE = 0.1
# What `train()` writes into output_dir, removed by --overwrite_output_dir (other files are left alone).
RUN_RECORD_FILES = (
    RUN_IDENTITY_FILE,
    PREEMPTED_FILE,
    TRAINING_ARGS_FILE,
    DATA_STATS_FILE,
    TRAINER_STATE_NAME,
    "train_results.json",
    "all_results.json",
)
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "training_args.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "configuration_transformer.py",
    "modeling_transformer.py",
    "generation_transformer.py",
    "cache_transformer.py",
    "onednn_transformer.py",
    "model.safetensors.index.json",
)
# A fine-tuned converted fairseq model's tokenizer, its code the sign of one (names such as merges.txt may be a
# user's otherwise): left behind, the run that replaced it pushed them too.
FAIRSEQ_TOKENIZER_CODE = "tokenization_fairseq.py"
FAIRSEQ_TOKENIZER_FILES = (FAIRSEQ_TOKENIZER_CODE, *FairseqTokenizer.vocab_files_names.values())


class TrainingPreempted(Exception):
    """Training stopped on a signal, after saving a complete checkpoint (None if it stopped before any update).

    `scripts/train.py` exits with code 75 (EX_TEMPFAIL: "try again later") on it; `OUTPUT_DIR/preempted.json`
    holds the same information for a requeue script when a launcher hides the workers' exit codes."""

    def __init__(self, signal_name: str, step: int, checkpoint: str | None):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        where = f"the checkpoint {checkpoint}" if checkpoint else "no checkpoint (no update was made)"
        super().__init__(
            f"Training was preempted ({signal_name}) at update {step}, with "
            f"{where}; run the same command with --resume_from_checkpoint last to continue."
        )


# Where a collective's failure is raised: torch.distributed's functions and DistributedDataParallel's.
_COLLECTIVE_CODE = ("/torch/distributed/", "/torch/nn/parallel/distributed.py")


def lost_process_message(error: BaseException, training_args: TranslationTrainingArguments) -> str | None:
    """The line that says what a collective's failure on a run of several processes means, or None for any other
    error. A process that died (killed by the OOM killer, a node lost, a crash of its own) left the others with
    gloo's "Connection reset by peer" from deep inside torch.distributed or DistributedDataParallel, a traceback
    naming neither the run, nor that another process had stopped, nor the checkpoint a requeue resumes."""
    frames = traceback.extract_tb(error.__traceback__)
    from_a_collective = isinstance(error, torch.distributed.DistError) or (
        isinstance(error, RuntimeError)
        and bool(frames)
        and any(part in Path(frames[-1].filename).as_posix() for part in _COLLECTIVE_CODE)
    )
    if not from_a_collective or training_args.world_size < 2:
        return None
    output_dir, others = training_args.output_dir, training_args.world_size - 1
    newest = latest_complete_checkpoint(output_dir)
    resumes = (
        f"the newest complete checkpoint is {newest}, which --resume_from_checkpoint last resumes"
        if newest is not None
        else "no complete checkpoint was saved: --resume_from_checkpoint last starts the run again"
    )
    return (
        f"error: A collective operation of process {training_args.process_index} with the other {others} of the "
        f"run in {output_dir} failed (the {type(error).__name__} above), most likely because one of them stopped or "
        f"hung (its own log says why); {resumes}."
    )


class OutputDirectoryInUseError(ValueError):
    """A new run was pointed at an output directory that holds another run's checkpoints, or that another training
    process is writing into."""


# The training locks this process holds: a forked child (a DataLoader worker) closes its copies at once.
_HELD_TRAINING_LOCKS: set[IO[str]] = set()


def _release_training_locks_in_child() -> None:
    """A process forked while a training lock is held (a DataLoader worker, datasets' pool) does not hold it: its
    copy of the file shared the lock, so a worker that outlived the run (a notebook keeps the interrupted run's
    traceback, and with it the DataLoader and its workers) made the next run in that process refuse its own
    directory as `in use by another training run`, naming that very process."""
    for handle in _HELD_TRAINING_LOCKS:
        handle.close()
    _HELD_TRAINING_LOCKS.clear()


os.register_at_fork(after_in_child=_release_training_locks_in_child)


@contextlib.contextmanager
def training_lock(training_args: TranslationTrainingArguments) -> Iterator[None]:
    """The main process holds an exclusive lock on `output_dir/.training.lock` while it trains, averages and pushes:
    a second run into the same directory (a job requeued while the first one still runs) is refused at once, on
    every process, naming the holder, before it reads, deletes or writes anything.

    The lock is `flock`'s: released by the kernel when its holder ends, however it ends (processes it forks close
    their copy at once: `_release_training_locks_in_child`). It guards across machines where the file system gives
    locks across machines (local disks; NFSv4; Lustre mounted with `flock`); a file system that refuses locks gets a
    warning, one that grants them locally only (NFS mounted `nolock`, Lustre `localflock`) guards each machine
    alone."""
    output_dir = Path(training_args.output_dir)
    refusal, handle = None, None
    if training_args.process_index == 0:  # the world's main process, also with save_on_each_node
        try:
            check_writable(output_dir / RUN_IDENTITY_FILE)  # a file in the way or no permission: named now
            handle = _locked_for_training(output_dir)  # held to the end
            _HELD_TRAINING_LOCKS.add(handle)
        except (OSError, ValueError) as error:
            refusal = error
    # Every process stops when the main one cannot train here: the others would wait for it at the next barrier.
    try:
        if any_rank(refusal is not None, training_args.device):
            raise refusal or OutputDirectoryInUseError(
                f"{output_dir}: the main process cannot train there (it says why)"
            )
        yield
    finally:
        if handle is not None:
            _HELD_TRAINING_LOCKS.discard(handle)
            handle.close()


@contextlib.contextmanager
def _callers_random_state() -> Iterator[None]:
    """Python's, NumPy's and torch's global generators as the caller left them, however the run ends: a run seeds
    them (`set_seed`, and the Trainer again), which left a notebook or a service drawing the same numbers after
    every `train()` whatever it had seeded. CUDA's are put back where CUDA was started before the run (reading
    them would start it)."""
    cuda = torch.cuda.is_initialized()
    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    devices = torch.cuda.get_rng_state_all() if cuda else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if devices is not None:
            torch.cuda.set_rng_state_all(devices)


# What transformers' `enable_full_determinism` (`full_determinism`, called by the Trainer) sets in the process.
FULL_DETERMINISM_ENVIRONMENT = (
    "CUDA_LAUNCH_BLOCKING",
    "CUBLAS_WORKSPACE_CONFIG",
    "ASCEND_LAUNCH_BLOCKING",
    "HCCL_DETERMINISTIC",
    "FLASH_ATTENTION_DETERMINISTIC",
)


@contextlib.contextmanager
def _callers_determinism() -> Iterator[None]:
    """torch's deterministic-algorithms and cuDNN settings, and the environment variables of `full_determinism`, as
    the caller left them, however the run ends: a run that asked for it left a notebook or a service raising on
    every operation without a deterministic implementation (`index_add_` on a GPU, say), and the CUDA processes it
    started later launching every kernel synchronously (`CUDA_LAUNCH_BLOCKING=1`)."""
    environment = {name: os.environ.get(name) for name in FULL_DETERMINISM_ENVIRONMENT}
    algorithms = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    try:
        yield
    finally:
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        torch.use_deterministic_algorithms(algorithms[0], warn_only=algorithms[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def _locked_for_training(output_dir: Path) -> IO[str]:
    """`output_dir/.training.lock`, open, locked and recording this process, or `OutputDirectoryInUseError` naming
    its holder. A lock file another user made (0644 under a umask of 022, in a directory a group shares) cannot be
    opened for writing: it is locked through a read-only handle, which refuses while that user's run goes on, then
    removed, still locked, for one of this process's own (both were `Permission denied`: a colleague's running
    run not named, a resume of their finished one refused). A process that opened the removed file finds that its
    lock is not on the file at the path, and opens that one instead. In a directory with the sticky bit, where only
    its owner may remove it, their file stays this run's lock, read-only, naming its last holder."""
    lock = output_dir / TRAINING_LOCK_FILE
    while True:
        try:
            handle = open_lock_file(lock, "a+")
        except FileNotFoundError:
            if not output_dir.is_dir():
                raise
            continue  # another user's, removed meanwhile by another process doing the same
        try:
            _lock_for_training(handle, output_dir)
        except BaseException:
            handle.close()
            raise
        if not is_open_as(handle, lock):
            handle.close()  # the file another process removed after this one opened it
            continue
        if handle.writable():
            break
        try:
            lock.unlink(missing_ok=True)  # still locked: whoever opened it meanwhile is refused, or finds it gone
        except PermissionError:  # a directory with the sticky bit: only its owner may remove it
            logger.warning(
                "Locking %s read-only: another user's, in a sticky directory, it names its last holder", lock
            )
            return handle
        handle.close()
    handle.truncate(0)
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n")
    handle.flush()
    return handle


def _lock_for_training(handle: IO[str], output_dir: Path) -> None:
    """Take the lock on the open `handle`, or raise `OutputDirectoryInUseError` naming its holder."""
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutputDirectoryInUseError(
            f"{output_dir} is in use by another training run ({training_lock_holder(handle)}): wait for it to end or "
            "stop it, then run this command again"
        ) from None
    except OSError as error:
        logger.warning("Cannot lock %s (%s): a second run into it is not refused", handle.name, error)


def _wait_for_everyone(training_args: TranslationTrainingArguments) -> None:
    if training_args.world_size > 1 and training_args.distributed_state is not None:
        training_args.distributed_state.wait_for_everyone()


# --- the output directory: a new run, a resumed one, or a fresh start ---------------------------------------


def _earlier_run_contents(output_dir: Path) -> list[str]:
    """What shows that an earlier run wrote into output_dir: its checkpoints (complete or not), its identity, or
    the BPE of a run that stopped before recording its identity (whose data nothing tells)."""
    if not output_dir.is_dir():
        return []
    found = [path.name for path in list_checkpoints(output_dir)]
    found += [path.name for path in staging_directories(output_dir)]
    if (output_dir / RUN_IDENTITY_FILE).is_file():
        found.append(RUN_IDENTITY_FILE)
    elif (output_dir / "tokenizer.json").is_file():
        found.append("tokenizer.json")
    return found


def _earlier_run_paths(output_dir: Path) -> list[Path]:
    """What --overwrite_output_dir removes: the directories (checkpoints, averaged/) and files an earlier run wrote."""
    directories = [*list_checkpoints(output_dir), *staging_directories(output_dir)]
    if (output_dir / "averaged" / AVERAGING_RECORD_NAME).is_file():  # an average; a user's own averaged/ stays
        directories.append(output_dir / "averaged")
    logs = output_dir / "runs"  # the Trainer's TensorBoard logs, OUT/runs/<date>_<host>: else the new run is shown
    if logs.is_dir():  # beside the one it replaces
        directories += [path for path in logs.iterdir() if path.is_dir() and any(path.glob("events.out.tfevents.*"))]
    names = [*RUN_RECORD_FILES, *MODEL_FILES]
    if (output_dir / FAIRSEQ_TOKENIZER_CODE).is_file():
        names += FAIRSEQ_TOKENIZER_FILES
    files = [*(output_dir / name for name in names), *output_dir.glob("model*.safetensors")]
    return [
        *(path for path in directories if path.is_dir()),
        *(path for path in files if path.is_file()),
        *model_card_files(output_dir),
    ]


def _remove_earlier_run(output_dir: Path) -> None:
    """--overwrite_output_dir: remove what an earlier run wrote (checkpoints, averaged/, records, model)."""
    removed = []
    for path in _earlier_run_paths(output_dir):
        if path.is_dir():
            shutil.rmtree(path)
            removed.append(path.name + "/")
        else:
            path.unlink()
            removed.append(path.name)
    if removed:
        logger.warning("--overwrite_output_dir: removed the earlier run's %s from %s", ", ".join(removed), output_dir)


def _check_inputs_survive(output_dir: Path, model_args: ModelArguments) -> None:
    """--overwrite_output_dir must not delete the model or tokenizer that this run starts from (the model would be
    gone, and the run would then fail for want of it)."""
    removed = [path.resolve() for path in _earlier_run_paths(output_dir)]
    given = {"model": model_args.model_name_or_path, "tokenizer": model_args.tokenizer_name_or_path}
    for what, name in given.items():
        if name is None or not Path(name).exists():  # a Hub repo id
            continue
        path = Path(name).resolve()
        if path == output_dir.resolve() or any(path == gone or gone in path.parents for gone in removed):
            raise ValueError(
                f"--overwrite_output_dir would delete {name}, the {what} this run starts from "
                f"(--{what}_name_or_path): copy it out of {output_dir} first, or choose another --output_dir."
            )


def prepare_output_dir(
    training_args: TranslationTrainingArguments, model_args: ModelArguments | None = None
) -> str | None:
    """Check output_dir before anything is written into it; return the checkpoint to resume from, or None.

    - No `resume_from_checkpoint`: a directory holding an earlier run's checkpoints is refused, saying how to
      resume or start over; with `overwrite_output_dir` they are removed (logged), and so are averaged/, the run
      records and the saved model, unless they hold the model or tokenizer of `model_args` (refused).
    - "last" (or "true"): the newest complete checkpoint, skipping incomplete ones with a warning; none at all
      starts a fresh run (logged), so that the first launch and every requeue are the same command.
    - A path: it must be a complete checkpoint; an incomplete one is an error naming what is missing.
    With `average_last_checkpoints` > 1, an averaged/ that the average may not replace is refused now, not after
    training. Every process checks (they read the same directory); the main process checks that it can write
    there, removes files and preempted.json.
    """
    output_dir = Path(training_args.output_dir)
    _refuse_a_checkpoint_as_output_dir(output_dir)
    if training_args.should_save:  # a file in the way or no permission: said now, naming the directory
        check_writable(output_dir / RUN_IDENTITY_FILE)
    if training_args.average_last_checkpoints > 1:
        check_replaceable(output_dir / "averaged", AVERAGING_RECORD_NAME, REPLACEABLE)
    resume = checkpoint_to_resume(training_args.resume_from_checkpoint)
    if resume is None:
        earlier = _earlier_run_contents(output_dir)
        if earlier and not training_args.overwrite_output_dir:
            raise OutputDirectoryInUseError(
                f"{output_dir} holds an earlier run ({', '.join(earlier[:6])}{', ...' if len(earlier) > 6 else ''}):"
                " resume it with --resume_from_checkpoint last, or start over with --overwrite_output_dir "
                "(which deletes its checkpoints)."
            )
        if earlier and model_args is not None:
            _check_inputs_survive(output_dir, model_args)
        if earlier and training_args.should_save:
            _remove_earlier_run(output_dir)
        checkpoint = None
    elif resume == "last":
        checkpoint = latest_complete_checkpoint(output_dir)
        if checkpoint is None:
            logger.info("No complete checkpoint in %s: starting a fresh run", output_dir)
        _check_same_checkpoint_everywhere(checkpoint, training_args)
    else:  # one path for every process, which each checks
        _refuse_a_run_directory(resume)
        checkpoint = require_complete_checkpoint(resume)
    if training_args.should_save:
        (output_dir / PREEMPTED_FILE).unlink(missing_ok=True)
    _wait_for_everyone(training_args)
    if checkpoint is not None:
        logger.info("Resuming from %s", checkpoint)
    return str(checkpoint) if checkpoint is not None else None


def _refuse_a_checkpoint_as_output_dir(output_dir: Path) -> None:
    """One of a run's checkpoints named as --output_dir: a run there (a fresh one, "resumed" with "last", which finds
    no checkpoint in it) wrote its weights, trainer state and checkpoints over the checkpoint's, whose marker then
    listed sizes they no longer had: the checkpoint was lost."""
    if CHECKPOINT_RE.match(output_dir.name) and (output_dir / COMPLETE_MARKER).is_file():
        raise ValueError(
            f"--output_dir {output_dir} is a checkpoint of the run in {output_dir.parent}: give the run's directory "
            f"(--output_dir {output_dir.parent}), whose newest checkpoint --resume_from_checkpoint last resumes from"
        )


def _refuse_a_run_directory(path: str) -> None:
    """A run's directory named where one of its checkpoints is meant: it holds the final model and trainer state, and
    passes for a complete checkpoint, but no optimizer, scheduler or random states; resumed from, the run went on
    with all three started over (the learning rate back at the warmup's first update), and said nothing."""
    checkpoints = list_checkpoints(path) if Path(path).is_dir() else []
    if checkpoints:
        raise ValueError(
            f"--resume_from_checkpoint {path} is a run's directory, not one of its checkpoints: give "
            f"{checkpoints[-1]}, or --output_dir {path} --resume_from_checkpoint last"
        )


def _check_same_checkpoint_everywhere(checkpoint: Path | None, training_args: TranslationTrainingArguments) -> None:
    """Every process resumes from the same checkpoint it found in output_dir, or none does. Where they found different
    ones, output_dir is not one file system that every node shares (each node's own disk: rank 0's checkpoints on
    one, the others' RNG states on another), and ranks resuming from different updates would hang or fail apart."""
    if training_args.world_size <= 1:
        return
    step = checkpoint_step(checkpoint) if checkpoint is not None else -1
    oldest, newest = lowest_and_highest_over_ranks(step, training_args.device)
    if newest != oldest:
        one, another = (f"checkpoint-{seen}" if seen >= 0 else "no checkpoint" for seen in (oldest, newest))
        raise ValueError(
            f"{training_args.output_dir}: the processes do not see the same checkpoints (one resumes from {one}, "
            f"another from {another}): output_dir must be on a file system every node shares"
        )


def _check_same_run(identity: dict[str, Any], output_dir: Path, checkpoint: str | None) -> None:
    """Resuming (or restarting fresh with "last") must continue the same run: same architecture, tokenizer,
    data, seed and preset as recorded in the checkpoint, or in output_dir for a checkpoint that predates them.
    An `identity` with some of the fields (the data, before it is read) is checked on those."""
    source, recorded = _recorded_identity(output_dir, checkpoint)
    if recorded is None:
        return
    differences = identity_differences({key: recorded[key] for key in identity if key in recorded}, identity)
    if differences:
        raise RunMismatchError(
            f"{source / RUN_IDENTITY_FILE} was written by a different run: "
            f"{describe_differences(recorded, identity, differences)} (recorded vs now). Resume with the "
            "settings of that run, or start over with --overwrite_output_dir."
        )


def _recorded_identity(output_dir: Path, checkpoint: str | None) -> tuple[Path | None, dict[str, Any] | None]:
    """The identity a resumed run continues, and where it is recorded: the checkpoint's, else output_dir's."""
    for source in ([Path(checkpoint)] if checkpoint else []) + [output_dir]:
        recorded = read_run_identity(source)
        if recorded is not None:
            return source, recorded
    return None, None


def _dataset_commit(data_args: DataArguments, output_dir: Path, checkpoint: str | None) -> str | None:
    """The commit of `--dataset` to read (`pinned_dataset_commit`): of `--dataset_revision`, else the one a resumed
    run's launch read, so that a requeue after a push to the dataset does not train the rest of the run on other
    data, else main's. None for local data."""
    if data_args.dataset is None:
        return None
    revision = data_args.dataset_revision
    if revision is None:
        revision = (_recorded_identity(output_dir, checkpoint)[1] or {}).get("dataset_commit")
        if revision is not None:
            logger.info("Reading %s at commit %s, as the run's launch did", data_args.dataset, revision)
    return pinned_dataset_commit(data_args.dataset, data_args.language_pair, revision)


def _pin_model_to_launch(model_args: ModelArguments, output_dir: Path, checkpoint: str | None) -> None:
    """Read a Hub `--model_name_or_path` given without `--model_revision` at the commit a resumed run's launch read
    (its identity's `model_commit`), as `_dataset_commit` reads the dataset: a requeue after a push to the model's
    repo took its tokenizer and generation config from the new commit (the weights come from the checkpoint) and
    saved them in the rest of the run's checkpoints and its final model, without a word."""
    name = model_args.model_name_or_path
    if name is None or model_args.model_revision is not None or os.path.isdir(name):
        return
    recorded = (_recorded_identity(output_dir, checkpoint)[1] or {}).get("model_commit")
    if recorded is not None and recorded != model_args.model_commit:
        logger.info("Reading %s at commit %s, as the run's launch did", name, recorded)
        model_args.model_commit = recorded


# --- data, tokenizer, model -----------------------------------------------------------------------------------


def _data_source(data_args: DataArguments) -> dict[str, str | None]:
    """Where the pairs come from, as `load_parallel_dataset` and `split_source` take it."""
    return {
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "dataset": data_args.dataset,
        "language_pair": data_args.language_pair,
        "data_dir": data_args.data_dir,
    }


def _load_text(
    data_args: DataArguments, *, evaluate: bool, revision: str | None = None
) -> tuple[datasets.DatasetDict, dict[str, int]]:
    """Training (and validation) pairs, as `{"train", "validation"}` splits of untokenised text, and the counts of
    training pairs removed by cleaning; `revision`: of the Hub dataset.

    Only these splits are read (validation only when evaluating, the only use of it, BLEU included): a test set
    training never sees, blind or with unaligned files, is no obstacle."""
    where = _data_source(data_args)
    keys = ("train", "validation") if evaluate else ("train",)
    try:  # one load: from the Hub, each load asks it for the split names
        raw = load_parallel_dataset(**where, splits=list(keys), revision=revision)
    except SplitNotFoundError as err:
        if err.name == "train":
            raise ValueError(f"Training needs a training split ({err.args[0]}).") from None
        raise ValueError(f"Evaluation needs a validation split ({err.args[0]}); or pass --eval_strategy no.") from None
    splits = {  # the real names (val, newstest2013, ...) in the order asked for
        key: require_rows(part, name, split_source(name, **where))
        for key, (name, part) in zip(keys, raw.items(), strict=True)
    }
    _warn_of_copied_pairs(splits["train"], split_source(next(iter(raw)), **where), where)
    if evaluate:
        _warn_of_validation_pairs_in_training(splits, raw, where)
    text, cleaning = datasets.DatasetDict(splits), {}
    if data_args.clean:
        text, counts = clean_parallel_dataset(
            text, data_args.source_lang, data_args.target_lang, num_proc=data_args.preprocessing_num_workers
        )
        cleaning = counts["train"]
    if data_args.max_train_samples is not None:
        text["train"] = text["train"].select(range(min(data_args.max_train_samples, len(text["train"]))))
    return text, cleaning


def _warn_of_copied_pairs(train: datasets.Dataset, source: str, where: dict[str, Any]) -> None:
    """Warn where more than `COPIED_PAIRS_WARNING_SHARE` of the training pairs have the same text on both sides
    (`source`: where they come from): cleaning keeps them, as Moses' does, and a model trained on them learns to copy
    its input; the same file under both languages' names trained one that translates nothing, without a word."""
    pairs = train.with_format("arrow")["translation"]
    sides = (pc.struct_field(pairs, where[language]) for language in ("source_lang", "target_lang"))
    copies = pc.sum(pc.equal(*sides)).as_py() or 0
    if copies > COPIED_PAIRS_WARNING_SHARE * len(train):
        logger.warning(
            "%d of the %d training pairs (%s) have the same text on both sides: a model learns to copy its input. "
            "Copy noise, or one language's text given for both?",
            copies,
            len(train),
            source,
        )


def _warn_of_validation_pairs_in_training(
    splits: dict[str, datasets.Dataset], raw: datasets.DatasetDict, where: dict[str, Any]
) -> None:
    """Warn where more than `VALIDATION_IN_TRAINING_WARNING_SHARE` of the validation pairs are training pairs too (a
    validation set sampled from the corpus and left in it): its loss and BLEU, and the checkpoint they pick, measured
    what the model learnt by heart, without a word. Counted before cleaning, whose selection would copy the corpus."""
    languages = where["source_lang"], where["target_lang"]

    def pairs(translations: Any) -> list[tuple[str, str]]:
        sides = (pc.struct_field(translations, language).to_pylist() for language in languages)
        return list(zip(*sides, strict=True))

    validation = splits["validation"].with_format("arrow")["translation"]
    train = splits["train"].with_format("arrow")["translation"]
    # Sources first, in Arrow: only the few training pairs with a validation source (of WMT's 4.5M) reach Python.
    sources = pc.struct_field(validation, languages[0])
    trained = set(pairs(train.filter(pc.is_in(pc.struct_field(train, languages[0]), value_set=sources))))
    count = sum(pair in trained for pair in pairs(validation))
    if count > VALIDATION_IN_TRAINING_WARNING_SHARE * len(validation):
        names = list(raw)
        logger.warning(
            "%d of the %d validation pairs (%s) are training pairs too (%s): the validation loss and BLEU, and the "
            "checkpoint they pick, measure what the model learnt by heart; take them out of the training data",
            count,
            len(validation),
            split_source(names[1], **where),
            split_source(names[0], **where),
        )


def _check_earlier_bpe(tokenizer: PreTrainedTokenizerBase, path: Path, vocab_size: int) -> None:
    """The BPE of an earlier run in output_dir must be the one this run asks for.

    The BPE that run trained (its run identity records this `vocab_size` and this vocabulary) may be larger than
    `vocab_size` allows: BPE keeps every character of the corpus. Any other tokenizer may not."""
    identity = read_run_identity(path.parent) or {}
    recorded = identity.get("vocab_size")
    if recorded is not None and recorded != vocab_size:
        raise ValueError(
            f"{path} is the BPE of --vocab_size {recorded} ({len(tokenizer)} tokens), but this run asks for "
            f"--vocab_size {vocab_size}: pass --vocab_size {recorded} to continue, or start over with "
            "--overwrite_output_dir."
        )
    fingerprint = vocabulary_fingerprint(tokenizer.get_vocab())
    trained_here = recorded == vocab_size and identity.get("tokenizer") == fingerprint
    if not trained_here and len(tokenizer) > round_up(vocab_size, VOCAB_MULTIPLE):
        raise ValueError(
            f"{path} has {len(tokenizer)} tokens, more than --vocab_size {vocab_size} allows: pass the vocab_size "
            "it was trained with, or start over with --overwrite_output_dir."
        )


def _train_bpe(data_args: DataArguments, train_text: datasets.Dataset, vocab_size: int) -> PreTrainedTokenizerBase:
    """A shared BPE of `vocab_size` over both sides of the training text (`train_shared_bpe` warns when the
    corpus's characters alone make it larger)."""
    languages = [data_args.source_lang, data_args.target_lang]
    source = split_source("train", **_data_source(data_args))  # named where the text is all blank (--no_clean)
    return train_shared_bpe(iter_corpus_text(train_text, languages), vocab_size, source=source)


def _check_unrecorded_bpe(
    tokenizer: PreTrainedTokenizerBase,
    path: Path,
    data_args: DataArguments,
    train_text: datasets.Dataset,
    vocab_size: int,
) -> None:
    """A BPE in output_dir without a run identity (a run stopped between saving it and recording its identity)
    says nothing of the data it was trained on: it is used only if training the BPE again gives the same one."""
    again = _train_bpe(data_args, train_text, vocab_size)
    if vocabulary_fingerprint(again.get_vocab()) != vocabulary_fingerprint(tokenizer.get_vocab()):
        raise ValueError(
            f"{path} was left by a run that stopped before recording its identity ({RUN_IDENTITY_FILE}), and it is "
            f"not the BPE of this run's data and --vocab_size {vocab_size}: start over with --overwrite_output_dir, "
            "or pass it as --tokenizer_name_or_path from another directory."
        )
    logger.info("%s has no %s, but it is the BPE of this run's data: using it", path, RUN_IDENTITY_FILE)


def _take_the_run_languages(tokenizer: PreTrainedTokenizerBase, name: str, data_args: DataArguments) -> None:
    """A converted fairseq model's tokenizer applies the Moses rules of its languages (FSMT's `langs`, the pair it
    was converted for): fine-tuned on another pair or direction, it takes the run's, which it saves, when its
    source and target vocabularies are one (a joined dictionary, as fairseq's WMT models have). With two, the
    vocabularies belong to their sides and the pair must stay."""
    if not isinstance(tokenizer, FairseqTokenizer):
        return
    pair = [data_args.source_lang, data_args.target_lang]
    languages = [tokenizer.src_lang, tokenizer.tgt_lang]
    if languages == pair:
        return
    if tokenizer.encoder != {token: index for index, token in tokenizer.decoder.items()}:
        raise ValueError(
            f"{name}: its tokenizer is for {'-'.join(languages)} with a dictionary for each side; it cannot tokenise "
            f"{'-'.join(pair)}: fine-tune it on {'-'.join(languages)}"
        )
    logger.info("%s: tokenising with the Moses rules of %s (its tokenizer had %s)", name, pair, languages)
    tokenizer.src_lang, tokenizer.tgt_lang = pair
    tokenizer.init_kwargs["langs"] = pair


def _tokenizer(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: TranslationTrainingArguments,
    train_text: datasets.Dataset,
    vocab_size: int,
) -> PreTrainedTokenizerBase:
    """The given tokenizer, the fine-tuned model's, the one of an earlier run in output_dir, or a new shared BPE.

    A new BPE (Sec. 5.1: "a shared source-target vocabulary") is trained by the main process and saved to
    output_dir at once, so that other processes, and a resumed run, load the very same vocabulary. One found
    there must match `vocab_size` (an error names both sizes and the file otherwise); one found there without a
    run identity is checked by the main process against a BPE trained again (`_check_unrecorded_bpe`).
    """
    name = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    if name is not None:
        tokenizer = _without_loading_arguments(AutoTokenizer.from_pretrained(name, **_revision_of(name, model_args)))
        _take_the_run_languages(tokenizer, name, data_args)
        _check_given_tokenizer(tokenizer, name, train_text[0]["translation"], data_args)
        _warn_of_unknown_tokens(tokenizer, name, train_text, data_args)
        _warn_of_special_tokens_read_in_text(tokenizer, name, train_text, data_args)
        return tokenizer
    output_dir = Path(training_args.output_dir)
    with training_args.main_process_first(local=False, desc="shared BPE"):
        path = output_dir / "tokenizer.json"
        if path.is_file():
            logger.info("Using the tokenizer of the earlier run in %s", output_dir)
            tokenizer = _without_loading_arguments(AutoTokenizer.from_pretrained(output_dir))
            if read_run_identity(output_dir) is not None:
                _check_earlier_bpe(tokenizer, path, vocab_size)
            # Without an identity, the main process finds a BPE that was there before this run started (a plain
            # run refuses one, --overwrite_output_dir removes it); the others, the one the main process just
            # trained or checked.
            elif training_args.process_index == 0:
                _check_unrecorded_bpe(tokenizer, path, data_args, train_text, vocab_size)
            return tokenizer
        tokenizer = _train_bpe(data_args, train_text, vocab_size)
        # tokenizer.json last: its presence is what tells a later run that the BPE is there, whole.
        write_files_into(output_dir, tokenizer.save_pretrained, last=("tokenizer.json",), name="tokenizer")
        return tokenizer


def _without_loading_arguments(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """`tokenizer` without what transformers' `from_pretrained` adds to the arguments `save_pretrained` writes to
    tokenizer_config.json (`is_local`, `local_files_only`): how it was loaded, not what it is. A resumed run's
    tokenizer_config.json, in its later checkpoints and final model, differed from the uninterrupted run's."""
    for name in LOADING_ARGUMENTS:
        tokenizer.init_kwargs.pop(name, None)
    return tokenizer


def _check_given_tokenizer(
    tokenizer: PreTrainedTokenizerBase, name: str, pair: dict[str, str], data_args: DataArguments
) -> None:
    """A tokenizer to train with must pad, and end every target with its end-of-sentence token, the one token from
    which the model learns where a translation ends: refused in one line otherwise. Before, one without a pad token
    failed at the first batch, the run already recorded; one without an eos token (BERT's WordPiece ends with [SEP])
    trained a model that generate() stopped at the config's default id 2, one that never appended it a model that
    never learns to stop."""
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"The tokenizer {name} has no pad_token, which batches are padded with: give it one "
            "(tokenizer.add_special_tokens({'pad_token': '<pad>'}), saved)"
        )
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(
            f"The tokenizer {name} has no eos_token: the model learns to end a translation with it, and generate() "
            "stops there; give it one that it appends to every sentence"
        )
    # The first training pair, encoded as `modeling.data` encodes every pair (a word of one's own could be unknown to
    # a vocabulary without an unknown token).
    labels = tokenizer(pair[data_args.source_lang], text_target=pair[data_args.target_lang])["labels"]
    if not labels or labels[-1] != eos:
        raise ValueError(
            f"The tokenizer {name} does not end a sentence with its eos_token {tokenizer.eos_token!r} (id {eos}): the "
            f"first training target ends with {labels[-5:]}, and a model trained on such targets never learns to "
            "stop; append it in the tokenizer's post-processor"
        )


def _warn_of_unknown_tokens(
    tokenizer: PreTrainedTokenizerBase, name: str, train_text: datasets.Dataset, data_args: DataArguments
) -> None:
    """Warn of a side of the training pairs that the given tokenizer reads largely as its unknown token: characters it
    never saw (a tokenizer trained on one side's files alone, a model fine-tuned on a language of another script),
    which the model can neither read nor learn to write. The run went on without a word, a Russian target learnt as a
    row of `<unk>`."""
    if tokenizer.unk_token_id is None:
        return
    pairs = train_text.select(range(min(UNKNOWN_TOKEN_SAMPLE_PAIRS, len(train_text))))["translation"]
    languages = data_args.source_lang, data_args.target_lang
    encoded = tokenizer([pair[languages[0]] for pair in pairs], text_target=[pair[languages[1]] for pair in pairs])
    for language, sequences in zip(languages, (encoded["input_ids"], encoded["labels"]), strict=True):
        ids = [token for sequence in sequences for token in sequence]
        share = ids.count(tokenizer.unk_token_id) / max(len(ids), 1)
        if share > UNKNOWN_TOKEN_WARNING_SHARE:
            logger.warning(
                "The tokenizer %s reads %.0f%% of the %r tokens of the first %d training pairs as %s: text it never "
                "saw, which the model can neither read nor learn to write. Was it trained on the other language "
                "alone? Train one on both sides (scripts/train_tokenizer.py --data-dir).",
                name,
                100 * share,
                language,
                len(pairs),
                tokenizer.unk_token,
            )


def _warn_of_special_tokens_read_in_text(
    tokenizer: PreTrainedTokenizerBase, name: str, train_text: datasets.Dataset, data_args: DataArguments
) -> None:
    """Warn of training sentences holding a special token's text ("</s>": HTML's strikethrough in web-crawled text)
    that the given tokenizer reads as that token, as one built with 🤗 tokenizers does unless told to split them (this
    project's BPE reads them as text): a target holding "</s>" taught the model to stop there, without a word."""
    # Not the additional special tokens: a multilingual model's language tags (">>de<<") are written in its sources.
    roles = (tokenizer.pad_token, tokenizer.unk_token, tokenizer.eos_token, tokenizer.bos_token)
    read_as_control = [
        token
        for token in dict.fromkeys(role for role in roles if role is not None)
        if tokenizer(token, add_special_tokens=False)["input_ids"] == [tokenizer.convert_tokens_to_ids(token)]
    ]
    if not read_as_control:
        return
    pairs = train_text.data.column("translation")  # the corpus before cleaning: selecting from it would copy it
    for language in (data_args.source_lang, data_args.target_lang):
        sentences = pc.struct_field(pairs, language)
        for token in read_as_control:
            count = pc.sum(pc.match_substring(sentences, token)).as_py() or 0
            if count:
                logger.warning(
                    "%d %r sentences of the training data hold %r, which the tokenizer %s reads as its special token "
                    "(id %d), not as text: a target holding '</s>' teaches the model to stop there. To read them as "
                    "text, save it so: AutoTokenizer.from_pretrained(%r, split_special_tokens=True)"
                    ".save_pretrained(...)",
                    count,
                    language,
                    token,
                    name,
                    tokenizer.convert_tokens_to_ids(token),
                    name,
                )


def _revision_of(name: str, model_args: ModelArguments) -> dict[str, str]:
    """`from_pretrained`'s revision argument for loading `name`: the commit `model_revision` was pinned to, else
    `model_revision` itself, when `name` is the model's repo."""
    revision = model_args.model_commit or model_args.model_revision
    return {"revision": revision} if revision is not None and name == model_args.model_name_or_path else {}


def check_fine_tuning_source(model_args: ModelArguments) -> str | None:
    """The model_type of `model_name_or_path`, refused in one line unless it is this project's or MarianMT's.
    Offline (HF_HUB_OFFLINE=1), a Hub cache that lacks the files to load it is named first.

    A Hub repo's revision is pinned here to the commit it is at (`model_args.model_commit`, see `pinned_commit`):
    its tokenizer, weights and conversion record are read minutes apart, and a push landing in between would mix
    two models."""
    name, revision = model_args.model_name_or_path, model_args.model_revision
    if name is None:
        if revision is not None:
            raise ValueError("--model_revision names a version of --model_name_or_path's Hub repo: give that too.")
        return None
    local = os.path.isdir(name)
    if local and revision is not None:
        raise ValueError(f"{name} is a local directory: --model_revision names a version of a Hub repo only.")
    hub_id = not (local or looks_like_local_path(name))
    if not local and not hub_id and not os.path.exists(name):  # transformers would call it a malformed repo id
        raise ValueError(f"--model_name_or_path {name} does not exist")
    not_cached = offline_cache_error(name, revision, MODEL_REPO_FILES[:1]) if hub_id else None
    if not_cached:
        raise not_cached
    try:
        if hub_id:
            model_args.model_commit = pinned_commit(name, revision)
        # the dict, as translation.load_model_and_tokenizer reads it: AutoConfig names a Hub repo without
        # config.json "Unrecognized model", and a model type it does not know in ten lines
        config, _ = TransformerConfig.get_config_dict(name, **_revision_of(name, model_args))
    except (OSError, ValueError) as error:
        raise ValueError(f"Cannot fine-tune {name}: its config does not load ({str(error).splitlines()[0]})") from None
    model_type = config.get("model_type")
    if model_type is None:
        raise ValueError(
            f"Cannot fine-tune {name}: it has no config.json naming a model_type (not a model saved with "
            "save_pretrained)"
        )
    if model_type == TransformerConfig.model_type and hub_id:
        # the model's weights, and its tokenizer unless another one is given
        wanted = MODEL_REPO_FILES[1:] if model_args.tokenizer_name_or_path is None else MODEL_REPO_FILES[1:2]
        not_cached = offline_cache_error(name, revision, wanted)
        if not_cached:
            raise not_cached
    if model_type not in (TransformerConfig.model_type, MARIAN_MODEL_TYPE):
        raise ValueError(
            f"Cannot fine-tune {name}: it is a {model_type!r} model; only this project's "
            f"({TransformerConfig.model_type!r}) and MarianMT ({MARIAN_MODEL_TYPE!r}, converted exactly) can be "
            "fine-tuned."
        )
    if local and (problems := _local_weights_problems(name)):
        # else safetensors' traceback, "header too small", after the data is read
        raise ValueError(f"Cannot fine-tune {name}: its weights are incomplete: {'; '.join(problems)}")
    if local and model_args.tokenizer_name_or_path is None and not holds_tokenizer(name):
        # else transformers' message, after the data is read, names another tokenizer class's missing argument
        raise ValueError(
            f"Cannot fine-tune {name}: it holds no tokenizer ({' or '.join(TOKENIZER_FILES)}); give the model's "
            "tokenizer with --tokenizer_name_or_path"
        )
    if local and model_args.tokenizer_name_or_path is None and (missing := missing_tokenizer_files(name)):
        raise ValueError(
            f"Cannot fine-tune {name}: it holds a tokenizer without {', '.join(missing)}; copy the model directory "
            "whole, or give the model's tokenizer with --tokenizer_name_or_path"
        )
    return model_type


def _local_weights_problems(directory: str) -> list[str]:
    """What is wrong with the safetensors weights of a local model directory (`weights_problems`); none judged in
    one without them (a MarianMT directory's pytorch_model.bin, whose loading names its own faults)."""
    if not glob.glob(os.path.join(glob.escape(directory), "*.safetensors")):
        return []
    return weights_problems(directory)


def _check_run_arguments(
    model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments
) -> None:
    """Arguments that would fail the run only after work (a BPE trained and saved, a directory cleared, the run
    recorded, so that the corrected command finds an earlier run there): refused first, in one line."""
    tokenizer = model_args.tokenizer_name_or_path
    _check_tokenizer_path(tokenizer, _revision_of(tokenizer, model_args).get("revision") if tokenizer else None)
    if training_args.paper_schedule:
        check_warmup_steps(training_args.warmup_steps)
    output_dir = Path(training_args.output_dir).resolve()
    if data_args.data_dir is not None and Path(data_args.data_dir).resolve() == output_dir:
        raise ValueError(
            f"--output_dir {training_args.output_dir} is --data_dir: the run's files would mix with the corpus "
            "(and --overwrite_output_dir remove some); give the run a directory of its own"
        )
    _check_data_sizes(data_args)
    check_sharding(training_args, training_args.world_size)
    preset = get_preset(model_args.preset)
    _check_evaluation(data_args, training_args, preset)
    if model_args.model_name_or_path is None:  # the preset's config, checked before the BPE is trained for it
        if data_args.vocab_size is not None:
            check_vocab_size(data_args.vocab_size)
        preset.model_config(_vocab_size(data_args, preset), **model_args.config_overrides())
    else:
        resized = [f"--{name}" for name in ARCHITECTURE_FLAGS if getattr(model_args, name) is not None]
        if resized:
            raise ValueError(
                f"{', '.join(resized)}: the architecture of {model_args.model_name_or_path} cannot change when "
                "fine-tuning it (--dropout can)"
            )
        if model_args.dropout is not None:  # set when the model loads, after the data: checked by the same rule now
            TransformerConfig(dropout=model_args.dropout)


def _check_evaluation(
    data_args: DataArguments, training_args: TranslationTrainingArguments, preset: TrainingPreset
) -> None:
    """Evaluation settings that would fail at the first evaluation, hours into the run."""
    if training_args.eval_strategy == "no":
        return
    sample = _bleu_sample_size(data_args, preset)
    if sample > 0 and not training_args.predict_with_generate:
        raise ValueError(
            f"BLEU on {sample} validation sentences (--bleu_sample_size) needs --predict_with_generate; or give "
            "--bleu_sample_size 0 to evaluate the loss alone"
        )
    if sample > 0:  # BLEU into Japanese or Korean needs MeCab
        try:
            check_scorable(data_args.target_lang)
        except ValueError as error:
            raise ValueError(f"{error}; or give --bleu_sample_size 0 to evaluate the loss alone") from error
    metric = training_args.metric_for_best_model
    reported = evaluation_metrics(bleu=sample > 0, target_lang=data_args.target_lang)
    if metric is not None and (metric if metric.startswith("eval_") else f"eval_{metric}") not in reported:
        raise ValueError(
            f"--metric_for_best_model {metric}: this run's evaluations report {', '.join(sorted(reported))}"
            + ("" if sample > 0 else " (BLEU needs a --bleu_sample_size above 0)")
        )


def _bleu_sample_size(data_args: DataArguments, preset: TrainingPreset) -> int:
    """--bleu_sample_size, else the preset's."""
    return data_args.bleu_sample_size if data_args.bleu_sample_size is not None else preset.bleu_sample_size


def _check_tokenizer_path(tokenizer: str | None, revision: str | None = None) -> None:
    """A --tokenizer_name_or_path, local directory or Hub repo (at `revision`, the model's where it is the model's
    repo), that holds no tokenizer (or, offline, one the Hub cache lacks): named now, not after the data is read in
    transformers' two lines ("We couldn't connect to 'https://huggingface.co' ... Check your internet connection
    ...") whatever the cause."""
    if tokenizer is None:
        return
    path = Path(tokenizer)
    if not path.exists():
        _check_hub_tokenizer(tokenizer, revision)
        return
    if path.is_file():
        raise ValueError(f"--tokenizer_name_or_path {tokenizer} is a file: give the directory that holds it")
    if path.is_dir() and not holds_tokenizer(path):
        raise ValueError(
            f"--tokenizer_name_or_path {tokenizer} holds no tokenizer (no {' or '.join(TOKENIZER_FILES)})"
        )
    if path.is_dir() and (missing := missing_tokenizer_files(path)):
        raise ValueError(f"--tokenizer_name_or_path {tokenizer} holds a tokenizer without {', '.join(missing)}")


def _check_hub_tokenizer(tokenizer: str, revision: str | None) -> None:
    if looks_like_local_path(tokenizer):
        raise ValueError(f"--tokenizer_name_or_path {tokenizer} does not exist")
    if not_cached := offline_cache_error(tokenizer, revision, [TOKENIZER_FILES]):
        raise not_cached
    with naming_hub_failures(f"--tokenizer_name_or_path {tokenizer}"):
        if not has_any_file(tokenizer, revision, TOKENIZER_FILES):
            at = f" at revision {revision}" if revision else ""
            raise ValueError(
                f"--tokenizer_name_or_path {tokenizer} is no local directory, and no Hub repo you can read holds a "
                f"tokenizer ({' or '.join(TOKENIZER_FILES)}) there{at}"
            )


def _check_data_sizes(data_args: DataArguments) -> None:
    if data_args.max_train_samples is not None and data_args.max_train_samples < 1:
        raise ValueError(f"--max_train_samples must be at least 1, got {data_args.max_train_samples}.")
    if data_args.bleu_sample_size is not None and data_args.bleu_sample_size < 0:  # 0: none scored
        raise ValueError(f"--bleu_sample_size must not be negative, got {data_args.bleu_sample_size}.")
    if data_args.max_length is not None and data_args.max_length < 2:  # tokenize_parallel_dataset's own limit
        raise ValueError(f"--max_length must be at least 2 (a token and </s>), got {data_args.max_length}.")


def _vocab_size(data_args: DataArguments, preset: TrainingPreset) -> int:
    """--vocab_size, else the preset's (0 is a size given, and refused, not a request for the preset's)."""
    return data_args.vocab_size if data_args.vocab_size is not None else preset.vocab_size


def _match_vocabulary(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, model_args: ModelArguments) -> None:
    """Fine-tuning with a tokenizer other than the model's own: one that extends it (the model's tokens with their
    ids, then added ones: language tags, say) grows the embedding matrix to hold them (new rows the mean of the
    others, the three-way tie kept); one with another vocabulary is refused, as the model's embedding rows would
    stand for other tokens."""
    name = model_args.model_name_or_path
    if name is None:
        return
    own = _own_vocabulary(name, model_args) if model_args.tokenizer_name_or_path is not None else None
    if own is not None:
        given = tokenizer.get_vocab()
        moved = [token for token, index in own.items() if given.get(token) != index]
        if moved:
            raise ValueError(
                f"The tokenizer {model_args.tokenizer_name_or_path} is not the vocabulary {name} was trained with: "
                f"{len(moved)} of its {len(own)} tokens ({moved[0]!r}, ...) are missing or have other ids, so its "
                "embedding rows would stand for other tokens. Fine-tune with the model's tokenizer, or one that "
                "extends it (tokenizer.add_tokens, saved)"
            )
    if len(tokenizer) > model.config.vocab_size:
        if own is None:
            raise ValueError(
                f"The tokenizer has {len(tokenizer)} tokens, the vocabulary of {name} {model.config.vocab_size}; "
                "only a tokenizer that extends the model's own (its tokens with their ids first) can add rows"
            )
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=VOCAB_MULTIPLE)
        logger.info("Grew the vocabulary of %s to %d rows for the added tokens", name, model.config.vocab_size)


def _own_vocabulary(name: str, model_args: ModelArguments) -> dict[str, int] | None:
    """The vocabulary of the tokenizer saved with the model `name`, None if it has none."""
    try:
        return AutoTokenizer.from_pretrained(name, **_revision_of(name, model_args)).get_vocab()
    except (OSError, ValueError):
        return None


def _model(
    model_args: ModelArguments,
    preset: TrainingPreset,
    tokenizer: PreTrainedTokenizerBase,
    source_type: str | None,
    recorded_config: dict[str, Any] | None = None,
) -> PreTrainedModel:
    """The preset's model for `tokenizer`, freshly initialised, or the weights of `model_name_or_path` to fine-tune,
    whose model_type `check_fine_tuning_source` returned as `source_type` (a MarianMT checkpoint is converted exactly,
    keeping Marian's concatenated sinusoid layout). `recorded_config` is the config of the run being resumed."""
    overrides = model_args.config_overrides()
    if model_args.model_name_or_path is None:
        special_ids = _special_token_ids(tokenizer, recorded_config)
        config = preset.model_config(len(tokenizer), **special_ids, **overrides)
        return TransformerForConditionalGeneration(config)
    hub = _revision_of(model_args.model_name_or_path, model_args)
    if source_type == MARIAN_MODEL_TYPE:
        from transformers import MarianMTModel

        from .convert import from_marian

        marian = MarianMTModel.from_pretrained(model_args.model_name_or_path, **hub, **overrides)
        model = from_marian(marian, positional_encoding_layout="concatenated")
        logger.info("Converted the MarianMT model %s exactly (concatenated sinusoids)", model_args.model_name_or_path)
    else:
        model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, **hub, **overrides)
    return model


def _padding_on_the_right(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """`tokenizer`, or a copy of it that pads on the right where it pads on the left: the collator pads sources and
    labels on the tokenizer's side, and left padding shifted every sentence's positions in the encoder and put
    padding between the decoder's start token and the target (decoder inputs `</s> <pad> <pad> y1 ...`), which
    generate() never gives it."""
    if tokenizer.padding_side == "right":
        return tokenizer
    right = copy.deepcopy(tokenizer)
    right.padding_side = "right"
    return right


def _special_token_ids(
    tokenizer: PreTrainedTokenizerBase, recorded_config: dict[str, Any] | None = None
) -> dict[str, int | None]:
    """A new model's special token ids: the tokenizer's, the decoder starting from its end-of-sentence (fairseq's
    convention, the shared BPE's ids by default). A given tokenizer's </s> at another id than the BPE's 2 (T5's order:
    <pad>, </s>, <unk>) left the decoder starting from, and generate() stopping at, the token at 2 (<unk> there) too:
    the Trainer aligns eos and pad only, and keeps the config's eos as a second one.

    A resumed run (`recorded_config`, its recorded config) that started and ended sentences at the tokenizer's eos
    keeps its recorded pad and bos: runs begun before these ids were the tokenizer's recorded pad 0 and no bos
    whatever the tokenizer (fairseq's order <s>, <pad>, </s>), a model that learns the same, and were refused."""
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.eos_token_id,
    }
    if recorded_config is not None and all(recorded_config.get(key) == ids[key] for key in _SENTENCE_BOUNDARY_IDS):
        ids.update({key: recorded_config.get(key) for key in ("pad_token_id", "bos_token_id")})
    return ids


_SENTENCE_BOUNDARY_IDS = ("eos_token_id", "decoder_start_token_id")


def bleu_sample(dataset: datasets.Dataset, size: int) -> datasets.Dataset:
    """A fixed random sample of `size` examples (the whole dataset if smaller), the same for every run."""
    if size >= len(dataset):
        return dataset
    indices = np.random.default_rng(BLEU_SAMPLE_SEED).choice(len(dataset), size, replace=False)
    return dataset.select(np.sort(indices))


# --- records --------------------------------------------------------------------------------------------------


def _data_description(data_args: DataArguments) -> dict[str, Any]:
    """What identifies the training data: the Hub dataset, or the local training files' names, sizes and sha256
    (not their directory or mtimes: a corpus copied to another machine is the same corpus)."""
    description: dict[str, Any] = {
        "dataset": data_args.dataset,
        "language_pair": data_args.language_pair,
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "max_train_samples": data_args.max_train_samples,
        "max_length": data_args.max_length,
        "clean": data_args.clean,
    }
    if data_args.data_dir is not None:
        files = discover_parallel_files(data_args.data_dir, data_args.source_lang, data_args.target_lang, ["train"])
        description["files"] = describe_files(path for spec in files.values() for path in spec.paths)
    return description


def run_identity(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: TranslationTrainingArguments,
    vocab_size: int | None,
    *,
    data: dict[str, Any] | None = None,
    conversion: dict[str, Any] | None = None,
    dataset_commit: str | None = None,
) -> dict[str, Any]:
    """What makes checkpoints part of one run (see `modeling.checkpoints`); `data`: `_data_description` of
    `data_args`, when already computed; `conversion`: the `_conversion_record` of the model fine-tuned, which
    travels with the run's every checkpoint and average, so that a fine-tune of them finds what they came from;
    `dataset_commit`: the commit of the Hub dataset the training split was read at (`pinned_dataset_commit`)."""
    trained_bpe = model_args.tokenizer_name_or_path is None and model_args.model_name_or_path is None
    local_model = model_args.model_name_or_path is not None and os.path.isdir(model_args.model_name_or_path)
    identity = {
        "config": config_identity(model.config.to_dict()),
        "tokenizer": vocabulary_fingerprint(tokenizer.get_vocab()),
        "vocab_size": vocab_size if trained_bpe else None,
        "data": data if data is not None else _data_description(data_args),
        "seed": training_args.seed,
        "data_seed": training_args.data_seed,
        "preset": model_args.preset,
        "model_name_or_path": model_args.model_name_or_path,
        "model_revision": model_args.model_revision,
        # A directory's weights identify it wherever it is moved; a Hub repo is its name (and revision).
        "model_weights": weights_record(model_args.model_name_or_path) if local_model else None,
        "fairseq_conversion": conversion,
        "dataset_commit": dataset_commit,
    }
    if is_commit(model_args.model_commit):  # a Hub repo's, where the Hub told it; offline, a branch's name or none
        identity["model_commit"] = model_args.model_commit
    return json.loads(json.dumps(identity, default=str))  # as it reads back from run_identity.json


def _write_run_records(
    trainer: TokenBudgetSeq2SeqTrainer,
    model_args: ModelArguments,
    data_args: DataArguments,
    text: datasets.DatasetDict,
    cleaning: dict[str, int],
    truncations: dict[str, int],
    *,
    hub_model_id: str | None = None,
    conversion: dict[str, Any] | None = None,
    dataset_commit: str | None = None,
) -> None:
    """`training_args.json` and `data_stats.json` in output_dir, which the model card (`modeling.model_card`) reads;
    `truncations`: each split's sequences cut to `max_length` tokens (`tokenize_counting_truncations`);
    `conversion`: the `_conversion_record` of the model fine-tuned; `dataset_commit`: the Hub dataset's commit read.

    `TrainingArguments.to_dict` writes every `*_token` field as a placeholder (`"<HUB_TOKEN>"`), never its value.
    `hub_model_id` is the repo of a push at the end of training, which the trainer's own arguments don't request.
    """
    args = trainer.args
    shown = {
        k: v
        for k, v in args.to_dict().items()
        if k not in ("per_device_train_batch_size", "per_device_eval_batch_size")
    }
    if hub_model_id is not None:
        shown |= {"push_to_hub": True, "hub_model_id": hub_model_id}
    if args.paper_schedule:
        shown.pop("lr_scheduler_type")
        shown["learning_rate_schedule"] = "learning_rate × d_model^-0.5 × min(step^-0.5, step × warmup^-1.5)"
    name = model_args.model_name_or_path
    run = {"preset": model_args.preset, "model_name_or_path": name, "world_size": args.world_size}
    run["library_versions"] = _library_versions()
    if model_args.model_revision is not None:
        run["model_revision"] = model_args.model_revision
    if trainer.max_tokens_limit != args.max_tokens_per_device:  # batches made smaller for tokens_per_update
        run["max_tokens_per_device_given"] = trainer.max_tokens_limit
    if name is not None and not os.path.isdir(name):
        run["base_model"] = name  # a Hub repo: the card links it
    if conversion is not None:  # the card says what the fine-tuned model came from, and its fairseq tokenizer
        run["fairseq_conversion"] = conversion
    write_json(Path(args.output_dir) / TRAINING_ARGS_FILE, {**shown, **run})
    stats = {
        "dataset": data_args.dataset or data_args.data_dir,
        "language_pair": f"{data_args.source_lang}-{data_args.target_lang}",
        # Each by itself too: a code with a hyphen ("pt-BR") makes the pair ambiguous for the card's language tags.
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "sentence_pairs": {split: len(part) for split, part in text.items()},
        "cleaning": cleaning,
        # Cut to max_length tokens, </s> kept: a cut training target teaches the model to stop there.
        "truncated_to_max_length": {"max_length": data_args.max_length, "sequences": truncations},
        "vocab_size": len(trainer.processing_class),
    }
    if dataset_commit is not None:  # the card's data table shows it
        stats["dataset_commit"] = dataset_commit
    write_json(Path(args.output_dir) / DATA_STATS_FILE, stats)


@contextlib.contextmanager
def _earlier_records_unless_an_update(
    trainer: TokenBudgetSeq2SeqTrainer, output_dir: Path, checkpoint: str | None
) -> Iterator[None]:
    """A resumed launch that stops before its first update (the trainer refused its settings: another learning
    rate, fewer updates than the checkpoint holds) puts back the records of the launches that made the run's
    updates: its own, written before the trainer's checks, named settings no update used (a card pushed from the
    run said --learning_rate 2 of a run trained at 1)."""
    names = (TRAINING_ARGS_FILE, DATA_STATS_FILE)
    earlier, resumed = {}, 0
    if checkpoint is not None and trainer.is_world_process_zero():
        earlier = {name: (output_dir / name).read_text("utf-8") for name in names if (output_dir / name).is_file()}
        resumed = saved_update(checkpoint)
    try:
        yield
    except BaseException:
        if earlier and trainer.state.global_step <= resumed:
            for name, content in earlier.items():
                write_text(output_dir / name, content)
        raise


def _library_versions() -> dict[str, str]:
    """The versions a rerun needs for the same weights: the same seed gives other initial weights, data order (numpy's
    Generator), BPE or kernels under another torch, numpy, tokenizers or transformers."""
    versions = {"python": platform.python_version()}
    for package in REPRODUCIBILITY_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def _warn_of_another_training_set(output_dir: Path, train: datasets.Dataset) -> None:
    """A resumed run whose cleaned training split has another number of pairs than its earlier launch recorded:
    the same files (the run identity compares them), cleaned by another version of this code. Said, since the
    batches from here on are not those of the run's data position."""
    path = output_dir / DATA_STATS_FILE
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["sentence_pairs"]["train"]
    except (OSError, ValueError, KeyError, TypeError):  # not recorded: nothing to compare
        return
    if recorded != len(train):
        logger.warning(
            "The cleaned training split has %d pairs, the run's earlier launch trained on %d (%s): the same files, "
            "cleaned by another version of this code; the batches from the checkpoint's data position on differ "
            "from those it would have trained on",
            len(train),
            recorded,
            path,
        )


def _conversion_record(model_args: ModelArguments) -> dict | None:
    """The `fairseq_conversion.json` of the model fine-tuned (a directory, or a Hub repo at `model_revision`), if it
    has one; else the record its own training kept in its run identity, when it is a fine-tune of such a model
    (its checkpoints, its average and the repo it was pushed to hold no conversion record of their own)."""
    name = model_args.model_name_or_path
    if name is None:
        return None
    for record in (CONVERSION_FILE, RUN_IDENTITY_FILE):
        path = cached_file(
            name,
            record,
            **_revision_of(name, model_args),
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
        if path:
            content = read_json(path)
            return content if record == CONVERSION_FILE else content.get("fairseq_conversion")
    return None


def _average_last_checkpoints(output_dir: str, n: int, identity: dict[str, Any] | None = None) -> Path | None:
    """Average the last `n` complete checkpoints of this run into output_dir/averaged; return that directory, or
    None without any. Incomplete checkpoints are skipped with a warning naming them, and so are checkpoints of
    another run (a different run_identity.json): `last_checkpoints` with `at_most=True`, which averages fewer than
    `n` with a warning rather than refusing."""
    checkpoints = last_checkpoints(output_dir, n, identity=identity, at_most=True)
    if not checkpoints:
        return None
    averaged = average_checkpoints(checkpoints, os.path.join(output_dir, "averaged"))
    logger.info("Averaged %s into %s", ", ".join(path.name for path in checkpoints), averaged)
    return averaged


def _without_hub_push(training_args: TranslationTrainingArguments) -> TranslationTrainingArguments:
    """The Trainer's copy of the arguments: it must not push (its card has no translation task and drops BLEU),
    and, since it saves its arguments in every checkpoint (`training_args.bin`), holds no token either."""
    if not training_args.push_to_hub and training_args.hub_token is None:
        return training_args
    args = copy.copy(training_args)
    args.push_to_hub = False
    args.hub_token = None
    return args


def _stop_preempted(
    training_args: TranslationTrainingArguments,
    signal_name: str,
    step: int,
    checkpoint: str | None,
    *,
    together: bool = True,
) -> TrainingPreempted:
    """Record the preemption in output_dir/preempted.json (the main process; every process that stops alone, as
    the main one may not be stopping), wait for every process (`together`: they agreed to stop at the same point),
    and return the exception they all raise."""
    if training_args.should_save or not together:
        record = {
            "signal": signal_name,
            "step": step,
            "checkpoint": checkpoint,
            # ISO 8601 with the offset as "+01:00": strftime's "+0100" is refused by RFC 3339 parsers and Python < 3.11
            "time": datetime.now().astimezone().isoformat(timespec="seconds"),
            "resume": "--resume_from_checkpoint last",
        }
        write_json(Path(training_args.output_dir) / PREEMPTED_FILE, record)
    if together:
        _wait_for_everyone(training_args)
    preempted = TrainingPreempted(signal_name, step, checkpoint)
    logger.warning("%s", preempted)
    return preempted


def _finish_run(
    trainer: TokenBudgetSeq2SeqTrainer,
    metrics: dict[str, float],
    training_args: TranslationTrainingArguments,
    preemption: PreemptionCallback,
    identity: dict[str, Any],
) -> Path | None:
    """The end of a run whose training is done: save its metrics, the final model and the Trainer's state, average
    the last checkpoints (main process); return the average's directory, or None without one.

    A signal after the last update then stops the run (`TrainingPreempted`) if a checkpoint holds that update (the
    requeue finds training done); without one (save_strategy "no", say), the run finishes."""
    output_dir = Path(training_args.output_dir)
    if metrics:  # none when the checkpoint was at max_steps: the launch that trained wrote them
        trainer.log_metrics("train", metrics)
        # First: a requeue after a failed save of the model trains nothing, so it has none to write.
        trainer.save_metrics("train", metrics)
    trainer.save_final_model()
    trainer.save_state()
    averaged = None
    if training_args.average_last_checkpoints > 1 and trainer.is_world_process_zero():
        n = training_args.average_last_checkpoints
        averaged = _average_last_checkpoints(training_args.output_dir, n, identity)
    agreed = preemption.agreed(training_args.device)
    if agreed is not None:
        step = trainer.state.global_step
        held = trainer.is_world_process_zero() and _last_update_checkpointed(output_dir, step)
        if any_rank(held, training_args.device):
            raise _stop_preempted(training_args, agreed.name, step, str(output_dir / f"checkpoint-{step}"))
        logger.warning("Got %s after the last update, which no checkpoint holds: finishing the run", agreed.name)
    if training_args.should_save:
        (output_dir / PREEMPTED_FILE).unlink(missing_ok=True)
    return averaged


def _last_update_checkpointed(output_dir: Path, step: int) -> bool:
    """Whether the newest complete checkpoint of `output_dir` holds update `step`, the last: a requeue then finds
    training done and trains nothing."""
    return latest_complete_checkpoint(output_dir) == output_dir / f"checkpoint-{step}"


class _PreparedRun(NamedTuple):
    """What `_prepare_run` makes for the trainer."""

    text: datasets.DatasetDict
    cleaning: dict[str, int]
    truncations: dict[str, int]
    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel
    identity: dict[str, Any]
    tokenized: datasets.DatasetDict


def _prepare_run(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: TranslationTrainingArguments,
    preset: TrainingPreset,
    source_type: str | None,
    checkpoint: str | None,
) -> _PreparedRun:
    """The data (loaded, cleaned, tokenised), the tokenizer (trained for a new run) and the model, and the run's
    identity, checked against the checkpoint's and recorded."""
    output_dir = Path(training_args.output_dir)
    # Other data is refused before it is read: loading and cleaning English-French WMT takes about 13 minutes.
    data = _data_description(data_args)
    _check_same_run({"data": data}, output_dir, checkpoint)
    set_seed(training_args.seed)  # the same initial weights on every process and every run
    commit = _dataset_commit(data_args, output_dir, checkpoint)
    _pin_model_to_launch(model_args, output_dir, checkpoint)
    text, cleaning = _load_text(data_args, evaluate=training_args.eval_strategy != "no", revision=commit)
    vocab_size = _vocab_size(data_args, preset)
    tokenizer = _tokenizer(model_args, data_args, training_args, text["train"], vocab_size)
    resumed_config = (_recorded_identity(output_dir, checkpoint)[1] or {}).get("config")  # None for a new run
    model = _model(model_args, preset, tokenizer, source_type, resumed_config)
    _match_vocabulary(model, tokenizer, model_args)
    # The BPE saved and its identity not yet: no sha256 of the corpus here, or a signal in between would leave a
    # BPE that the requeue trains again to check it (English-French: 20-33 minutes).
    conversion = _conversion_record(model_args)  # read once: a Hub model's is a request
    identity = run_identity(
        model,
        tokenizer,
        model_args,
        data_args,
        training_args,
        vocab_size,
        data=data,
        conversion=conversion,
        dataset_commit=commit,
    )
    _check_same_run(identity, output_dir, checkpoint)
    if training_args.should_save:
        write_json(output_dir / RUN_IDENTITY_FILE, identity)
    with training_args.main_process_first(local=False, desc="tokenisation"):
        tokenized, truncations = tokenize_counting_truncations(
            text,
            tokenizer,
            data_args.source_lang,
            data_args.target_lang,
            max_length=data_args.max_length,
            num_proc=data_args.preprocessing_num_workers,
        )
    return _PreparedRun(text, cleaning, truncations, tokenizer, model, identity, tokenized)


def train(model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments) -> str:
    """Train (or fine-tune) a Transformer and save it, with tokenizer and generation config, to `output_dir`.

    Steps: check output_dir (see `prepare_output_dir`), load and clean the parallel text (`modeling.data`), train
    the shared BPE unless one is given, build the preset's model (or load `model_name_or_path`; MarianMT is
    converted exactly), record the run's identity, train with `TokenBudgetSeq2SeqTrainer` (resuming when
    `resume_from_checkpoint` says so), save the final model, and average the last `average_last_checkpoints`
    checkpoints into `output_dir/averaged` (Sec. 6.1). Returns `output_dir`. The run is seeded with
    `training_args.seed`; the caller's global random generators, and the settings of `full_determinism`, are put back
    as they were when it returns or raises.

    From the start to the end of training, SIGTERM, SIGINT, SIGUSR1 and SIGHUP stop the run after the update under way
    with a complete checkpoint (while the data is being prepared, at once: a BPE or a tokenisation of WMT's corpus
    outlasts a scheduler's grace period): then `TrainingPreempted` is raised (and `preempted.json` written), and
    nothing else (final model, averaging, push) is done; the previous signal handlers are restored either way. A signal
    after the last update stops the run the same way once the final model and the average are written, before the
    push, and during the push where a checkpoint holds the last update (`_push_unless_preempted`). Run again, a run
    whose checkpoint is at `max_steps` trains nothing and goes on to what is left.

    With `push_to_hub`, the main process then pushes the averaged model (`average_last_checkpoints` > 1), else the
    final one, to `hub_model_id` (default: output_dir's name), with the model card of `modeling.hub` rendered from
    this run's records, instead of the Trainer's own pushes. The token (`hub_token`, else HF_TOKEN, else
    `hf auth login`) and the repo name are checked before any work: a push that cannot happen fails first.

    The main process holds `output_dir/.training.lock` from the first check of `output_dir` to the end of the push
    (`training_lock`): a second run into the same directory meanwhile is refused, naming this one.
    """
    _check_run_arguments(model_args, data_args, training_args)
    use_hub_timeouts()  # every Hub request (tokenizer, model, dataset, push) has a timeout
    source_type = check_fine_tuning_source(model_args)
    hub = None
    if training_args.push_to_hub:
        from .hub import prepare_push  # the Hub extras (jinja2, matplotlib) are needed only for a push

        hub = prepare_push(training_args)
    preemption = PreemptionCallback()
    with _callers_random_state(), _callers_determinism(), training_lock(training_args):
        with preemption.handling():
            checkpoint = prepare_output_dir(training_args, model_args)
            output_dir = Path(training_args.output_dir)
            preset = get_preset(model_args.preset)
            try:
                with preemption.stopping_at_once():
                    prepared = _prepare_run(model_args, data_args, training_args, preset, source_type, checkpoint)
            except Exception:
                # SignalledBeforeTraining, or what a library made of it (datasets' worker pool: a TimeoutError)
                if preemption.requested is None:
                    raise
                step = saved_update(checkpoint) if checkpoint else 0
                raise _stop_preempted(
                    training_args, preemption.requested.name, step, checkpoint, together=False
                ) from None  # each process stops where it is: no collective
            text, cleaning, truncations, tokenizer, model, identity, tokenized = prepared
            evaluate = training_args.eval_strategy != "no"
            bleu_size = _bleu_sample_size(data_args, preset)
            trainer = TokenBudgetSeq2SeqTrainer(
                model=model,
                args=_without_hub_push(training_args),
                data_collator=DataCollatorForSeq2Seq(_padding_on_the_right(tokenizer), model=model),
                train_dataset=tokenized["train"],
                eval_dataset=tokenized["validation"] if evaluate else None,
                bleu_dataset=bleu_sample(tokenized["validation"], bleu_size) if evaluate and bleu_size > 0 else None,
                processing_class=tokenizer,
                compute_metrics=bleu_metrics(tokenizer, data_args.target_lang),
                preemption=preemption,
            )
            if checkpoint is not None:  # before the records, which say how the run trains
                trainer.adopt_checkpoint_batching(checkpoint)
            with _earlier_records_unless_an_update(trainer, output_dir, checkpoint):
                if trainer.is_world_process_zero():
                    if checkpoint is not None:
                        _warn_of_another_training_set(output_dir, text["train"])
                    hub_model_id = hub.repo_id if hub else None
                    _write_run_records(
                        trainer,
                        model_args,
                        data_args,
                        text,
                        cleaning,
                        truncations,
                        hub_model_id=hub_model_id,
                        conversion=identity["fairseq_conversion"],
                        dataset_commit=identity["dataset_commit"],
                    )
                agreed = preemption.agreed(training_args.device)
                if agreed is not None:  # a signal while the trainer was being made: stop before the first update
                    step = saved_update(checkpoint) if checkpoint else 0
                    raise _stop_preempted(training_args, agreed.name, step, checkpoint)
                result = trainer.train(resume_from_checkpoint=checkpoint)
            if trainer.preempted is not None:
                last = str(trainer.last_checkpoint) if trainer.last_checkpoint else checkpoint
                raise _stop_preempted(training_args, trainer.preempted["signal"], trainer.preempted["step"], last)
            averaged = _finish_run(trainer, result.metrics, training_args, preemption, identity)
        if hub is not None:
            _push_unless_preempted(hub, averaged, training_args, preemption, trainer.state.global_step)
    return training_args.output_dir


def _push_unless_preempted(
    hub: HubTarget,
    averaged: Path | None,
    training_args: TranslationTrainingArguments,
    preemption: PreemptionCallback,
    step: int,
) -> None:
    """Push the averaged model, else the final one (main process). Where a checkpoint holds the last update, a signal
    during the push stops it at once and the run with `TrainingPreempted`, as one before the push does: the requeue
    trains nothing and pushes again (a push commits its files together, or none). Killed by the signal's default
    action instead, the run ended by it (143), which README's requeue loop reports as a failure. Without such a
    checkpoint the handlers from before stay in place: a requeue would train the last updates again."""
    from .hub import push_trained_model

    output_dir = Path(training_args.output_dir)
    pushed, description = (averaged, "the averaged model") if averaged else (output_dir, "the final model")
    if not _last_update_checkpointed(output_dir, step):
        push_trained_model(hub, pushed, output_dir, description, private=training_args.hub_private_repo)
        return
    with preemption.handling():
        try:
            with preemption.stopping_at_once():
                push_trained_model(hub, pushed, output_dir, description, private=training_args.hub_private_repo)
        except Exception:  # SignalledBeforeTraining, or what huggingface_hub made of it
            if preemption.requested is None:
                raise
            final = str(output_dir / f"checkpoint-{step}")
            raise _stop_preempted(training_args, preemption.requested.name, step, final, together=False) from None


__all__ = ["train", "bleu_sample", "prepare_output_dir", "run_identity", "TrainingPreempted"]
