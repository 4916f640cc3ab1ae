"""Trainer callbacks for long runs: time-based checkpoints, a wall-clock budget, stopping cleanly when the job is
preempted, the sampler's epoch, TensorBoard's log given up rather than the run when it cannot be written.

Decisions that lead to collectives (saving, stopping) must be the same on every process: rank 0's clock decides and
broadcasts its decision after every update (one integer, negligible next to an update); a signal, which may reach
one process only, is agreed on by all of them (the maximum of their flags).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import torch
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.integrations import TensorBoardCallback

from .batching import TokenBudgetBatchSampler

logger = logging.getLogger(__name__)


def _rank_zero_decides(flag: bool, device: torch.device) -> bool:
    """Rank 0's `flag`, on every rank: decisions that lead to collectives must be the same everywhere."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    decision = torch.tensor([int(flag)], device=device)
    dist.broadcast(decision, src=0)
    return bool(decision.item())


def max_over_ranks(value: int, device: torch.device) -> int:
    """The largest of every rank's `value`, on every rank: one all_reduce (MAX) of one integer."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    reduced = torch.tensor([value], device=device)
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX)
    return int(reduced.item())


def lowest_and_highest_over_ranks(value: int, device: torch.device) -> tuple[int, int]:
    """The smallest and the largest of every rank's `value`, on every rank: one all_reduce (MAX) of two integers."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value, value
    reduced = torch.tensor([-value, value], device=device)
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX)
    return -int(reduced[0].item()), int(reduced[1].item())


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank if `flag` is true on any."""
    return bool(max_over_ranks(int(flag), device))


def leave_process_group() -> None:
    """Destroy this process's process group, if it has one, while the interpreter is still whole: for a process
    that has done its last collective and holds no trainer any more. Left to interpreter shutdown, gloo's worker
    threads can abort a finished run (SIGABRT, "terminate called without an active exception":
    pytorch/pytorch#190489). A DistributedDataParallel wrapper holds the group too, so what is left of a trainer
    (reference cycles) is collected first. Local to the process: a rank that leaves does not wait for the others."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


class SaveEveryMinutesCallback(TrainerCallback):
    """Save a checkpoint once `minutes` have passed since the last one (Sec. 6.1: "written at 10-minute intervals").

    Saving involves collectives, so all processes must save after the same update: rank 0's clock decides after
    every update and broadcasts its decision (one integer, negligible next to an update). The clock restarts at
    every save, step-based ones included, and when training (re)starts.
    """

    def __init__(self, minutes: float):
        if not minutes > 0:  # NaN too: no clock time would ever reach it
            raise ValueError(f"minutes must be positive, got {minutes}.")
        self.interval = 60.0 * minutes
        self.last_save = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_save = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if _rank_zero_decides(time.monotonic() - self.last_save >= self.interval, args.device):
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        self.last_save = time.monotonic()


class StopAfterMinutesCallback(TrainerCallback):
    """Stop training, with a last checkpoint, once `minutes` have passed since it started (a wall-clock budget).

    As for `SaveEveryMinutesCallback`, rank 0's clock decides for every process. A resumed run gets the budget anew.
    """

    def __init__(self, minutes: float):
        if not minutes > 0:  # NaN too: no clock time would ever reach it
            raise ValueError(f"minutes must be positive, got {minutes}.")
        self.minutes = minutes
        self.start = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if _rank_zero_decides(time.monotonic() - self.start >= 60.0 * self.minutes, args.device):
            logger.info("Stopping at update %d: the budget of %g minutes is spent", state.global_step, self.minutes)
            control.should_training_stop = True
            control.should_save = True


class TrainingClockCallback(TrainerCallback):
    """When the updates of the last `train()` began, by the monotonic clock. The Trainer's train_runtime, and the
    rates divided by it, subtract two `time.time()` readings, which a step of the system clock between them (NTP,
    a clock set by hand, a VM's clock set right after a pause) shifts by the whole step: set back an hour during a
    run, it logged train_runtime -3599 s and negative samples and steps per second, which the card showed."""

    def __init__(self):
        self.started = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def wall_clock_start(self) -> float:
        """The `time.time()` start from which the Trainer's `time.time() - start` is the monotonic time since the
        updates began."""
        return time.time() - (time.perf_counter() - self.started)


class SamplerEpochCallback(TrainerCallback):
    """Tells the token-budget sampler which epoch starts, so that its order depends on (seed, epoch) only.

    The Trainer and accelerate forward `set_epoch` themselves, except in one case: after resuming mid-epoch under
    several processes, the sampler sits below `SkipBatchSampler` and `BatchSamplerShard`, which do not forward it.
    The epoch is computed as the Trainer does when resuming: completed updates // updates per epoch.
    """

    def __init__(self):
        self.sampler: TokenBudgetBatchSampler | None = None

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        if self.sampler is None or train_dataloader is None:
            return
        updates_per_epoch = max(math.ceil(len(train_dataloader) / args.gradient_accumulation_steps), 1)
        self.sampler.set_epoch(state.global_step // updates_per_epoch)


# SIGHUP: the terminal of an interactive run hung up (a dropped ssh connection). Its default action killed the run
# with everything since the last checkpoint; torchrun, which gets it too, forwards it to its workers.
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)
# A launcher (torchrun, srun) forwards the signal it got to workers that may have got it too: the same signal
# twice within this many seconds counts once.
DUPLICATE_SIGNAL_SECONDS = 1.0


# Whether `ignore_signals_at_exit` has registered its atexit callback in this process.
_IGNORING_AT_EXIT = False


def ignore_signals_at_exit() -> None:
    """From the interpreter's exit on (its atexit callbacks, then its shutdown), the preemption signals are ignored:
    the run is over and the process exits with the code it chose, which the shutdown (about a second) would let a
    signal's default action replace, putting it back in place of every Python handler. Registered once however many
    times scripts/train.py runs in the process (IPython's `%run` executes the file anew, so the script's own atexit
    callbacks were new functions each time and piled up)."""
    global _IGNORING_AT_EXIT
    if not _IGNORING_AT_EXIT:
        atexit.register(_ignore_signals)
        _IGNORING_AT_EXIT = True


def _ignore_signals() -> None:
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def ignored(sig: signal.Signals) -> bool:
    """Whether the process ignores `sig`: started so (SIGHUP under `nohup`, SIGINT for a job started with `&` by a
    script), for the preemption signals, which are ignored otherwise only once the run is over."""
    return signal.getsignal(sig) is signal.SIG_IGN


# The callback within `stopping_at_once`, if any, and the process it runs in: see `_restore_in_forked_child`.
_STOPPING_AT_ONCE: PreemptionCallback | None = None
_PREPARING_PROCESS = 0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


# The forking thread's signal mask from before a fork within `stopping_at_once`: see `_block_signals_for_fork`.
_MASK_BEFORE_FORK = threading.local()


def _block_signals_for_fork() -> None:
    """Before a fork within `stopping_at_once`, the forking thread blocks the preemption signals, until the child
    has the previous handlers back (`_restore_in_forked_child`): a signal in between (the SIGTERM of a pool that
    terminates as it replaces a worker) waits for them. Caught by the parent's handler, whose copy in the child
    takes it for a duplicate, or by Python's after the default was put back, it was lost: the worker lived on,
    and the pool's parent waited for it forever."""
    if _STOPPING_AT_ONCE is not None:
        _MASK_BEFORE_FORK.mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING_AT_ONCE.signals)
        _MASK_BEFORE_FORK.main_thread = threading.current_thread() is threading.main_thread()


def _unblock_signals_after_fork() -> None:
    mask = getattr(_MASK_BEFORE_FORK, "mask", None)
    if mask is not None:
        _MASK_BEFORE_FORK.mask = None
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _restore_in_forked_child() -> None:
    """A worker forked while the data is prepared (datasets' pool) does not stop the run: it takes the handlers
    back that were there before, so that SIGTERM ends it. With ours, the pool's `terminate()` after the parent
    stopped could not end it, and the parent waited for it forever. It also ends with the parent
    (`_end_with_the_parent`)."""
    global _STOPPING_AT_ONCE
    if _STOPPING_AT_ONCE is not None:
        _STOPPING_AT_ONCE.restore()
        _STOPPING_AT_ONCE = None
        # Forked by another thread (a pool's replacing a dead worker), the kernel would kill it when that thread
        # ends: the pool's own thread, as the pool terminates, while the worker held the pool's queue lock.
        if getattr(_MASK_BEFORE_FORK, "main_thread", False):
            _end_with_the_parent(_PREPARING_PROCESS)
    _unblock_signals_after_fork()  # a signal that came meanwhile is delivered now, to the previous handlers


def _end_with_the_parent(parent: int) -> None:
    """Have the kernel kill this forked worker when `parent` (its main thread) dies (Linux). A parent killed
    outright (the OOM killer picks the largest process, the one holding the data; `kill -9`) cannot end its pool:
    its tokenising workers waited forever on the pool's pipes, each holding a copy of the parent's memory and the
    job's output (a `train.py | tee log` never ended)."""
    if sys.platform != "linux":
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request
        os.kill(os.getpid(), signal.SIGKILL)


os.register_at_fork(
    before=_block_signals_for_fork,
    after_in_parent=_unblock_signals_after_fork,
    after_in_child=_restore_in_forked_child,
)


class SignalledBeforeTraining(Exception):
    """A preemption signal that came while the data was being prepared (`PreemptionCallback.stopping_at_once`)."""

    def __init__(self, received: signal.Signals):
        super().__init__(received.name)
        self.signal = received


class PreemptionCallback(TrainerCallback):
    """Stop cleanly when the job is asked to stop: the first SIGTERM, SIGINT or SIGUSR1 (what schedulers send
    before killing a job), or SIGHUP (its terminal hung up), only sets a flag; at the end of the update under way
    every process agrees (any rank's flag counts, one all_reduce per update), the trainer saves a complete checkpoint
    and stops, and `self.preempted` holds the signal and the update. Nothing is lost beyond the update in flight: it
    finishes.

    A second SIGINT or SIGTERM (another one, or the same a second or more after the first: a launcher forwarding
    the signal it got does not count) restores the previous handler and re-raises it: an impatient user still gets
    out at once. After a SIGHUP, the first SIGINT or SIGTERM is a request like the first: no user at the terminal
    that hung up sent it, but the system ending the session's processes (systemd-logind with KillUserProcesses=yes:
    its SIGTERM after the shell's SIGHUP), which then waits for them.

    A signal that the process was started ignoring (SIGINT for a job started with `&` by a script, SIGHUP under
    `nohup`) stays ignored. `handling()` installs the handlers and restores the previous ones when it ends; the
    callback installs them at `on_train_begin` and restores them at `on_train_end` if no one did before. Handlers can
    only be installed from the main thread; elsewhere the callback does nothing. Within `stopping_at_once()`, before
    training, the first signal raises `SignalledBeforeTraining` at once instead: there is no update to finish, and
    preparing WMT's data takes longer than a scheduler waits before it kills.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = PREEMPTION_SIGNALS):
        self.signals = signals
        self.requested: signal.Signals | None = None  # the request to stop, on this process: the first signal (or
        # the SIGINT or SIGTERM that came after a SIGHUP)
        self.preempted: dict | None = None  # {"signal", "step"} once all processes agreed to stop
        self._requested_at = 0.0
        self._previous: dict[signal.Signals, object] = {}
        self._installed_by_callback = False
        self._at_once = False

    # --- signal handlers ---

    def _handle(self, signum: int, frame) -> None:
        received = signal.Signals(signum)
        now = time.monotonic()
        if self.requested is None:
            self.requested, self._requested_at = received, now
            if self._at_once:
                logger.warning("Got %s before training: stopping now (no update to finish)", received.name)
                raise SignalledBeforeTraining(received)
            logger.warning(
                "Got %s: finishing the update under way, then saving a checkpoint and stopping (%s)",
                received.name,
                "a SIGINT or SIGTERM after it asks the same, one more stops at once, without a checkpoint"
                if received == signal.SIGHUP
                else "a second SIGINT or SIGTERM stops at once, without a checkpoint",
            )
            return
        duplicate = received == self.requested and now - self._requested_at < DUPLICATE_SIGNAL_SECONDS
        if duplicate or received not in (signal.SIGINT, signal.SIGTERM):
            return
        if self.requested == signal.SIGHUP:  # no user's second: see the class's docstring
            self.requested, self._requested_at = received, now
            logger.warning(
                "Got %s after SIGHUP: the same request to stop (a second SIGINT or SIGTERM stops at once, without a "
                "checkpoint)",
                received.name,
            )
            return
        logger.warning("Got %s again: stopping now, without a checkpoint", received.name)
        self.restore()
        signal.raise_signal(received)

    def install(self) -> bool:
        """Install the handlers (main thread only); False where they cannot be installed."""
        if self._previous:
            return True
        try:
            self._previous = {
                sig: self._take_over(signal.signal(sig, self._handle), sig)
                for sig in self.signals
                # What the process was started ignoring stays ignored, as Python leaves it: a shell starts `train &`
                # in a script with SIGINT ignored, so that Ctrl-C in the script's terminal does not reach it.
                if signal.getsignal(sig) is not signal.SIG_IGN
            }
        except ValueError:  # not the main thread
            self._previous = {}
            return False
        return True

    def _take_over(self, replaced, sig: signal.Signals):
        """The handler to restore in place of `replaced`. A handler that kept the signals while the libraries loaded
        (scripts/train.py's `SignalsAtLaunch`: it has `received`, `received_at` and `replaced`) hands over: what it
        received counts as received here when it was (a second one is timed from it), so that the run stops before
        training, and what it replaced is restored in its place."""
        if not all(hasattr(replaced, name) for name in ("received", "received_at", "replaced")):
            return replaced
        if replaced.received is not None and self.requested is None:
            self.requested, self._requested_at = replaced.received, replaced.received_at
            logger.warning("Got %s while the run was starting: stopping before training", replaced.received.name)
        return replaced.replaced.get(sig, signal.SIG_DFL)

    def restore(self) -> None:
        """Put the previous handlers back."""
        previous, self._previous = self._previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    @contextmanager
    def handling(self) -> Iterator[PreemptionCallback]:
        """Handle the signals for the duration of the block, then restore the previous handlers (those that were
        there when the outermost block began: blocks nest)."""
        installed_here = not self._previous and self.install()
        try:
            yield self
        finally:
            if installed_here:
                self.restore()

    @contextmanager
    def stopping_at_once(self) -> Iterator[None]:
        """Within the block, the first signal raises `SignalledBeforeTraining` where the process is, at once (also
        one that came before the block). Processes forked within it (datasets' tokenising workers) take the
        previous handlers back and end with this one (`_restore_in_forked_child`)."""
        global _STOPPING_AT_ONCE, _PREPARING_PROCESS
        if self.requested is not None:
            raise SignalledBeforeTraining(self.requested)
        self._at_once, _STOPPING_AT_ONCE, _PREPARING_PROCESS = True, self, os.getpid()
        try:
            yield
        finally:
            self._at_once, _STOPPING_AT_ONCE = False, None

    def agreed(self, device: torch.device) -> signal.Signals | None:
        """The signal any process got (the highest-numbered one if several), or None: a collective, to call on
        every process at the same point."""
        number = max_over_ranks(int(self.requested) if self.requested is not None else 0, device)
        return signal.Signals(number) if number else None

    # --- callback events ---

    def on_train_begin(self, args, state, control, **kwargs):
        if self.preempted is not None:  # the last train() stopped on its signal: a new one starts without it
            self.requested, self._requested_at = None, 0.0
        self.preempted = None
        if not self._previous:
            self._installed_by_callback = self.install()

    def on_step_end(self, args, state, control, **kwargs):
        agreed = self.agreed(args.device) if self.preempted is None else None
        if agreed is not None:
            self.preempted = {"signal": agreed.name, "step": state.global_step}
            logger.warning(
                "Preempted (%s%s) at update %d: saving a checkpoint and stopping",
                agreed.name,
                "" if self.requested is not None else ", sent to another process",
                state.global_step,
            )
            control.should_training_stop = True
            control.should_save = True
            control.should_evaluate = False  # the checkpoint first: the grace period before a kill is short

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.preempted is not None:  # already saved at this update
            control.should_save = False
            control.should_evaluate = False

    def on_train_end(self, args, state, control, **kwargs):
        if self._installed_by_callback:
            self._installed_by_callback = False
            self.restore()


class TensorBoardGivenUpCallback(TensorBoardCallback):
    """`TensorBoardCallback`, which gives up TensorBoard's event file when the file system refuses it (a full disk
    or quota, an I/O error), with a warning naming the directory and why, rather than the run. The logs stay in the
    trainer state, which every checkpoint holds; the checkpoints then say whether there is room for them. Raised, the
    error of a log step stopped a multi-day run as "[Errno 28] No space left on device" (naming no file), losing
    the updates since its last checkpoint: also where TensorBoard's directory (TENSORBOARD_LOGGING_DIR) lies on
    another file system than the checkpoints, which had room."""

    def __init__(self, tb_writer=None):
        super().__init__(tb_writer)
        self.given_up = False

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.given_up:
            self._guarded(super().on_train_begin, args, state, control, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self.given_up:
            self._guarded(super().on_log, args, state, control, logs=logs, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        self._guarded(super().on_train_end, args, state, control, **kwargs)

    def _guarded(self, event, *args, **kwargs) -> None:
        try:
            event(*args, **kwargs)
        except OSError as error:
            self.given_up = True
            writer, self.tb_writer = self.tb_writer, None
            if writer is not None:
                with suppress(OSError):  # its last events cannot be written either
                    writer.close()
            logger.warning("Not logging to TensorBoard any more: cannot write into %s (%s)", self.logging_dir, error)
