"""Tests of modeling/callbacks.py: checkpoints every N minutes, a wall-clock budget, the sampler's epoch when
resuming, stopping on a signal, TensorBoard given up when its disk is full."""

import atexit
import errno
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import suppress
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import subprocess_env
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import TrainerControl, TrainerState, TrainingArguments

from modeling import callbacks
from modeling.batching import TokenBudgetBatchSampler
from modeling.callbacks import (
    PreemptionCallback,
    SamplerEpochCallback,
    SaveEveryMinutesCallback,
    SignalledBeforeTraining,
    StopAfterMinutesCallback,
    TensorBoardGivenUpCallback,
    _rank_zero_decides,
    any_rank,
    ignore_signals_at_exit,
    ignored,
    leave_process_group,
    lowest_and_highest_over_ranks,
    max_over_ranks,
)


def test_sampler_epoch_follows_completed_updates_when_resuming():
    """Resuming after 7 updates of 2 micro-batches, with 4 batches (2 updates) per epoch, is in epoch 3."""
    callback, sampler = SamplerEpochCallback(), TokenBudgetBatchSampler([3] * 8, [3] * 8, max_tokens=6)
    callback.sampler = sampler
    args, state = SimpleNamespace(gradient_accumulation_steps=2), SimpleNamespace(global_step=7)
    callback.on_epoch_begin(args, state, TrainerControl(), train_dataloader=list(sampler))
    assert (len(sampler), sampler.epoch) == (4, 3)
    args.gradient_accumulation_steps = 4  # one update per epoch: the 7 completed updates are 7 epochs
    callback.on_epoch_begin(args, state, TrainerControl(), train_dataloader=list(sampler))
    assert sampler.epoch == 7


def test_sampler_epoch_without_a_token_budget_sampler_does_nothing():
    """A trainer whose get_train_dataloader is a subclass's own has no token-budget sampler to tell the epoch."""
    callback = SamplerEpochCallback()
    args, state = SimpleNamespace(gradient_accumulation_steps=1), SimpleNamespace(global_step=3)
    callback.on_epoch_begin(args, state, TrainerControl(), train_dataloader=[[0], [1]])
    assert callback.sampler is None


def test_sampler_epoch_outside_training_does_nothing():
    """The Trainer's callbacks get no train_dataloader before `train()` builds one (an evaluation first, say)."""
    callback, sampler = SamplerEpochCallback(), TokenBudgetBatchSampler([3] * 8, [3] * 8, max_tokens=6)
    callback.sampler = sampler
    args, state = SimpleNamespace(gradient_accumulation_steps=1), SimpleNamespace(global_step=3)
    callback.on_epoch_begin(args, state, TrainerControl(), train_dataloader=None)
    assert sampler.epoch == 0


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """time.monotonic() under the test's control: advance it with `clock[0] += seconds`."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


CPU_ARGS = SimpleNamespace(device=torch.device("cpu"))


def test_checkpoints_every_n_minutes(clock):
    callback = SaveEveryMinutesCallback(minutes=10)
    clock[0] += 30 * 60  # loading the data: the clock starts with training
    callback.on_train_begin(CPU_ARGS, None, None)
    control = TrainerControl()
    clock[0] += 9 * 60
    callback.on_step_end(CPU_ARGS, None, control)
    assert not control.should_save
    clock[0] += 60
    callback.on_step_end(CPU_ARGS, None, control)
    assert control.should_save
    callback.on_save(CPU_ARGS, None, control)  # the clock restarts at every save, step-based ones too
    control = TrainerControl()
    clock[0] += 60
    callback.on_step_end(CPU_ARGS, None, control)
    assert not control.should_save


def test_training_stops_with_a_checkpoint_when_the_minutes_are_spent(clock, caplog):
    callback = StopAfterMinutesCallback(minutes=90)
    clock[0] += 100 * 60  # loading the data, or a first train(): the budget starts with training, anew
    callback.on_train_begin(CPU_ARGS, None, None)
    control = TrainerControl()
    clock[0] += 89 * 60
    callback.on_step_end(CPU_ARGS, SimpleNamespace(global_step=7), control)
    assert not (control.should_training_stop or control.should_save)
    clock[0] += 60
    with caplog.at_level(logging.INFO, logger="modeling.callbacks"):
        callback.on_step_end(CPU_ARGS, SimpleNamespace(global_step=8), control)
    assert control.should_training_stop and control.should_save
    # The log says why a run stopped early: without it, a budget's stop reads like a crash or a finished run.
    assert "Stopping at update 8: the budget of 90 minutes is spent" in caplog.text


@pytest.mark.parametrize("callback_class", [SaveEveryMinutesCallback, StopAfterMinutesCallback])
def test_minutes_must_be_positive(callback_class):
    with pytest.raises(ValueError, match="minutes must be positive, got 0"):
        callback_class(minutes=0)
    with pytest.raises(ValueError, match="minutes must be positive, got nan"):  # never saved, never stopped
        callback_class(minutes=float("nan"))
    callback_class(minutes=0.5)  # half a minute is a budget like any other


def test_collectives_in_a_single_process_return_its_own_values():
    cpu = torch.device("cpu")
    assert (max_over_ranks(5, cpu), lowest_and_highest_over_ranks(5, cpu), any_rank(True, cpu)) == (5, (5, 5), True)


def test_collectives_on_a_torch_built_without_distributed_return_the_processs_own_values(monkeypatch):
    """A torch built with USE_DISTRIBUTED=0 has `is_available()` False and none of the process-group functions."""
    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    for name in ("is_initialized", "get_world_size", "broadcast", "all_reduce", "destroy_process_group"):
        monkeypatch.delattr(torch.distributed, name)
    cpu = torch.device("cpu")
    decided = (_rank_zero_decides(True, cpu), max_over_ranks(5, cpu), lowest_and_highest_over_ranks(5, cpu))
    assert (*decided, any_rank(True, cpu)) == (True, 5, (5, 5), True)
    leave_process_group()


def test_collectives_between_processes_are_made_on_the_given_device(monkeypatch):
    """NCCL, the GPUs' backend, takes CUDA tensors only: the integers must be made on the trainer's device, not on
    torch's default one (here meta, which stands in for the CPU default next to a GPU). Two processes faked."""
    seen = []
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "broadcast", lambda tensor, src: seen.append(tensor.device))
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op: seen.append(tensor.device))
    cpu = torch.device("cpu")
    with torch.device("meta"):
        decided = (_rank_zero_decides(True, cpu), max_over_ranks(5, cpu), lowest_and_highest_over_ranks(5, cpu))
    assert decided == (True, 5, (5, 5)) and seen == [cpu, cpu, cpu]


def test_leaving_the_process_group_without_one_does_nothing():
    """scripts/train.py leaves it at the end of every run, one-process runs included, which have none."""
    leave_process_group()
    assert not torch.distributed.is_initialized()


def run_python(script: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    """Run `source` (dedented) as `script` in a fresh interpreter that imports this checkout, its output captured."""
    script.write_text(textwrap.dedent(source))
    command = [sys.executable, str(script), *args]
    return subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=120)


def test_two_processes_decide_together(tmp_path):
    """Saving and stopping lead to collectives, so every process must decide the same: rank 0's clock decides, and a
    signal that reached one process only stops both."""
    store = tmp_path / "store"
    done = run_python(
        tmp_path / "ranks.py",
        """
        import signal, sys, time
        from types import SimpleNamespace
        import torch, torch.distributed as dist, torch.multiprocessing as mp
        from transformers import TrainerControl
        from modeling.callbacks import (
            PreemptionCallback, SaveEveryMinutesCallback, StopAfterMinutesCallback, any_rank,
            leave_process_group, lowest_and_highest_over_ranks, max_over_ranks,
        )

        def decisions(rank, late_rank):  # the callbacks' decisions, where only late_rank's clock says it is time
            args, control = SimpleNamespace(device=torch.device("cpu")), TrainerControl()
            saving, stopping = SaveEveryMinutesCallback(minutes=1), StopAfterMinutesCallback(minutes=1)
            if rank == late_rank:
                saving.last_save, stopping.start = time.monotonic() - 120, time.monotonic() - 120
            saving.on_step_end(args, None, control)
            saved = control.should_save
            control = TrainerControl()
            stopping.on_step_end(args, SimpleNamespace(global_step=3), control)
            return saved, control.should_training_stop

        def run(rank, store):
            dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
            cpu = torch.device("cpu")
            preemption, control = PreemptionCallback(), TrainerControl()
            if rank == 1:
                preemption.requested = signal.SIGUSR1  # the scheduler's signal reached this process only
            preemption.on_step_end(SimpleNamespace(device=cpu), SimpleNamespace(global_step=4), control)
            outcome = [
                max_over_ranks(3 + rank, cpu),
                lowest_and_highest_over_ranks(3 + 4 * rank, cpu),
                any_rank(rank == 1, cpu),
                decisions(rank, late_rank=0),
                decisions(rank, late_rank=1),
                (preemption.preempted, control.should_training_stop),
            ]
            leave_process_group()
            with open(f"{store}.rank{rank}", "w") as out:  # one file each: two prints to one pipe can interleave
                out.write(f"{outcome} {dist.is_initialized()}")

        if __name__ == "__main__":
            mp.start_processes(run, args=(sys.argv[1],), nprocs=2, start_method="fork")
        """,
        str(store),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    agreed = "[4, (3, 7), True, (True, True), (False, False), ({'signal': 'SIGUSR1', 'step': 4}, True)] False"
    assert [Path(f"{store}.rank{rank}").read_text() for rank in (0, 1)] == [agreed, agreed]


def test_a_first_signal_asks_to_stop_and_a_later_second_one_stops_at_once(clock, sigint_raises_keyboard_interrupt):
    """SIGINT and SIGTERM alike; SIGINT here, whose default handler raises KeyboardInterrupt in the test."""
    callback = PreemptionCallback()
    previous = signal.getsignal(signal.SIGINT)
    with callback.handling():
        assert signal.getsignal(signal.SIGINT) == callback._handle
        signal.raise_signal(signal.SIGINT)
        assert callback.requested == signal.SIGINT
        control, state = TrainerControl(), SimpleNamespace(global_step=12)
        callback.on_step_end(CPU_ARGS, state, control)
        assert control.should_training_stop and control.should_save and not control.should_evaluate
        assert callback.preempted == {"signal": "SIGINT", "step": 12}
        clock[0] += 0.5
        signal.raise_signal(signal.SIGINT)  # a launcher forwarding the same signal: the same request
        clock[0] += 2.0
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # an impatient user
        assert signal.getsignal(signal.SIGINT) is previous, "the second one restored the previous handler"
    assert signal.getsignal(signal.SIGINT) is previous


def test_a_sigint_or_sigterm_after_a_sighup_asks_to_stop_and_only_a_later_one_stops_at_once(
    clock, sigint_raises_keyboard_interrupt, sighup_handled, caplog
):
    """An ssh connection that drops where systemd-logind ends the session's processes (KillUserProcesses=yes): the
    shell's SIGHUP, then logind's SIGTERM a moment later. Taken for an impatient user's second signal, the SIGTERM
    stopped the run at once, without a checkpoint ("Got SIGTERM again"). SIGINT stands in for SIGTERM here: its
    default handler raises KeyboardInterrupt in the test, where SIGTERM's would kill it."""
    callback = PreemptionCallback(signals=(signal.SIGHUP, signal.SIGINT))
    with callback.handling():
        signal.raise_signal(signal.SIGHUP)
        clock[0] += 0.1
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pytest.fail("the SIGINT after the SIGHUP stopped the run at once")
        # Said as it is: the SIGHUP's warning promised that a second SIGINT or SIGTERM stops at once, and the
        # SIGINT after it, which did not, was silent.
        warnings = [record.getMessage() for record in caplog.records]
        assert "a SIGINT or SIGTERM after it asks the same, one more stops at once" in warnings[0]
        assert warnings[1].startswith("Got SIGINT after SIGHUP: the same request to stop")
        control = TrainerControl()
        callback.on_step_end(CPU_ARGS, SimpleNamespace(global_step=5), control)
        assert control.should_training_stop and control.should_save
        clock[0] += 2.0
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # an impatient user's second


def test_a_preemption_at_the_end_of_an_epoch_neither_saves_again_nor_evaluates():
    """The update that ended the epoch saved the checkpoint already; the epoch's evaluation would delay the stop past
    the grace period before a kill."""
    callback = PreemptionCallback(signals=())
    callback.requested = signal.SIGUSR1
    control = TrainerControl()
    callback.on_step_end(CPU_ARGS, SimpleNamespace(global_step=6), control)
    control.should_save = control.should_evaluate = True  # what save and eval_strategy="epoch" ask at its end
    callback.on_epoch_end(CPU_ARGS, None, control)
    assert not (control.should_save or control.should_evaluate)


def test_the_preemption_warning_says_whether_the_signal_came_to_this_process_or_to_another(monkeypatch, caplog):
    own, others = PreemptionCallback(signals=()), PreemptionCallback(signals=())
    own.requested = signal.SIGUSR1
    own.on_step_end(CPU_ARGS, SimpleNamespace(global_step=6), TrainerControl())
    monkeypatch.setattr(callbacks, "max_over_ranks", lambda value, device: int(signal.SIGUSR1))  # another rank's
    others.on_step_end(CPU_ARGS, SimpleNamespace(global_step=6), TrainerControl())
    assert [record.getMessage() for record in caplog.records] == [
        "Preempted (SIGUSR1) at update 6: saving a checkpoint and stopping",
        "Preempted (SIGUSR1, sent to another process) at update 6: saving a checkpoint and stopping",
    ]


def test_a_second_sigusr1_is_the_same_request_and_does_not_stop_at_once(clock):
    """Only a second SIGINT or SIGTERM is an impatient user's: a scheduler that sends SIGUSR1 again still gets its
    checkpoint. The outer handler stands in for SIGUSR1's default, which would kill the test."""
    outer = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: outer.append(signum))
    try:
        callback = PreemptionCallback(signals=(signal.SIGUSR1,))
        with callback.handling():
            signal.raise_signal(signal.SIGUSR1)
            clock[0] += 2.0
            signal.raise_signal(signal.SIGUSR1)
            assert signal.getsignal(signal.SIGUSR1) == callback._handle and outer == []
            assert callback.requested == signal.SIGUSR1
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_signal_after_the_data_is_prepared_asks_to_stop_at_the_end_of_the_update():
    """Outside `stopping_at_once()` (training), the update under way finishes: no `SignalledBeforeTraining`."""
    callback = PreemptionCallback(signals=(signal.SIGUSR1,))
    with callback.handling():
        with callback.stopping_at_once():
            pass
        signal.raise_signal(signal.SIGUSR1)
        assert callback.requested == signal.SIGUSR1


def test_a_signal_while_the_data_is_prepared_raises_at_once_where_the_process_is():
    """Preparing WMT's data takes longer than a scheduler waits before it kills: no waiting for it to end."""
    callback = PreemptionCallback(signals=(signal.SIGUSR1,))
    with callback.handling():
        with pytest.raises(SignalledBeforeTraining, match="SIGUSR1") as raised:
            with callback.stopping_at_once():
                signal.raise_signal(signal.SIGUSR1)
                pytest.fail("the preparation went on after the signal")
    assert raised.value.signal == signal.SIGUSR1  # the signal itself, for whoever catches it, not only its name


def test_a_signal_before_the_data_is_prepared_raises_as_the_preparation_begins():
    """A request that came earlier (while the run started) stops the run before any of its data is prepared."""
    callback = PreemptionCallback(signals=(signal.SIGUSR1,))
    with callback.handling():
        signal.raise_signal(signal.SIGUSR1)
        with pytest.raises(SignalledBeforeTraining, match="SIGUSR1"):
            with callback.stopping_at_once():
                pytest.fail("the preparation began after the signal")


def test_a_fresh_process_ignores_the_preemption_signals_from_its_exit_on(tmp_path):
    """The run is over at exit: a signal's default action there would replace the exit code the run chose."""
    done = run_python(
        tmp_path / "exit.py",
        """
        import atexit, signal
        from modeling.callbacks import PREEMPTION_SIGNALS, ignore_signals_at_exit

        ignored = lambda: all(signal.getsignal(sig) is signal.SIG_IGN for sig in PREEMPTION_SIGNALS)
        atexit.register(lambda: print("ignored at exit:", ignored()))  # registered first, run last
        ignore_signals_at_exit()
        print("ignored before:", ignored())
        """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["ignored before: False", "ignored at exit: True"]


def test_the_signals_are_ignored_at_exit_by_one_callback_however_many_runs_ask(monkeypatch):
    """IPython's `%run scripts/train.py` runs the script anew each time: its atexit callbacks must not pile up."""
    registered = []
    monkeypatch.setattr(callbacks, "_IGNORING_AT_EXIT", False)  # as in a fresh process
    monkeypatch.setattr(atexit, "register", registered.append)
    for _ in range(3):
        ignore_signals_at_exit()
    assert len(registered) == 1


def test_a_signal_the_process_ignores_stays_ignored():
    """A script's `python scripts/train.py ... &` starts with SIGINT ignored: Ctrl-C typed at the script must not
    reach the run, so the callback leaves SIGINT alone there and still handles the others."""
    outer = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        callback = PreemptionCallback(signals=(signal.SIGINT, signal.SIGUSR1))
        with callback.handling():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGUSR1) == callback._handle
            signal.raise_signal(signal.SIGINT)
            assert callback.requested is None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, outer)


def test_ignored_tells_a_signal_the_process_ignores_from_one_it_handles():
    """scripts/train.py leaves what `ignored` names alone at its end: SIGHUP under `nohup` stays ignored."""
    outer = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        assert ignored(signal.SIGUSR1) is True
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        assert ignored(signal.SIGUSR1) is False
    finally:
        signal.signal(signal.SIGUSR1, outer)


def test_nested_handling_restores_the_outer_handlers_only_at_the_end():
    callback = PreemptionCallback(signals=(signal.SIGUSR1,))
    previous = signal.getsignal(signal.SIGUSR1)
    with callback.handling():
        with callback.handling():
            pass
        assert signal.getsignal(signal.SIGUSR1) == callback._handle, "the inner block leaves them installed"
        signal.raise_signal(signal.SIGUSR1)
        assert callback.requested == signal.SIGUSR1 and callback.agreed(torch.device("cpu"))
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_installing_twice_restores_the_handlers_from_before_the_first():
    """A second `install()` must not take the callback's own handler for the one to restore."""
    callback = PreemptionCallback(signals=(signal.SIGUSR1,))
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        assert callback.install() and callback.install()
        assert signal.getsignal(signal.SIGUSR1) == callback._handle
    finally:
        callback.restore()
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_the_callback_restores_at_the_end_of_training_only_the_handlers_it_installed():
    """A Trainer used without `handling()`: Ctrl-C after train() returned must interrupt again. Within `handling()`,
    the block's handlers outlive train() (scripts/train.py saves and pushes after it)."""
    previous = signal.getsignal(signal.SIGUSR1)
    callback = PreemptionCallback(signals=(signal.SIGUSR1,))
    with callback.handling():
        callback.on_train_begin(CPU_ARGS, None, None)
        callback.on_train_end(CPU_ARGS, None, None)
        assert signal.getsignal(signal.SIGUSR1) == callback._handle
    assert signal.getsignal(signal.SIGUSR1) is previous
    callback.on_train_begin(CPU_ARGS, None, None)
    assert signal.getsignal(signal.SIGUSR1) == callback._handle
    callback.on_train_end(CPU_ARGS, None, None)
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_a_worker_forked_while_the_data_is_prepared_dies_of_a_signal_in_the_instant_after_the_fork(tmp_path):
    """A pool that replaces a worker killed by the job's signal, then is terminated, sends SIGTERM to the new worker
    as it starts: caught there by the parent's handler (a copy, whose signal is already received: a duplicate),
    before the previous handlers were back, it was lost, and the parent waited for the worker forever (4 launches of
    10 hung after a SIGHUP to the job while 2 processes tokenised)."""
    done = run_python(
        tmp_path / "fork.py",
        """
        import os, signal, time

        # Registered first, so run first in the child: the pool's SIGTERM as the worker starts.
        os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))
        from modeling.callbacks import PreemptionCallback

        callback = PreemptionCallback(signals=(signal.SIGTERM,))
        with callback.handling(), callback.stopping_at_once():
            worker = os.fork()
            if worker == 0:
                time.sleep(30)  # a bound: it is ended at once, or lives on
                os._exit(0)
            _, status = os.waitpid(worker, 0)
        print(os.WIFSIGNALED(status) and signal.Signals(os.WTERMSIG(status)).name)
        """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "SIGTERM"


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead and not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's parent-death signal is Linux's")
def test_a_worker_forked_while_the_data_is_prepared_ends_when_the_parent_is_killed(tmp_path):
    """A parent killed outright (the OOM killer, kill -9) while its pool tokenised left the workers waiting on the
    pool's pipes forever, each holding the job's output and a copy of its memory."""
    done = run_python(
        tmp_path / "killed.py",
        """
        import os, signal, time
        from modeling.callbacks import PreemptionCallback

        callback = PreemptionCallback(signals=(signal.SIGTERM,))
        with callback.handling(), callback.stopping_at_once():
            worker = os.fork()
            if worker == 0:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1), os.dup2(null, 2)  # so that the test reads the parent's output to its end
                time.sleep(600)
                os._exit(0)
            print(worker, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    worker = int(done.stdout)
    try:
        for _ in range(300):  # a bound, not a timing: the worker dies at once or never
            if not _alive(worker):
                break
            time.sleep(0.1)
        assert not _alive(worker), "the worker outlived its killed parent"
    finally:
        with suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's parent-death signal is Linux's")
def test_a_worker_whose_parent_died_before_it_asked_to_end_with_it_ends_at_once():
    """The kernel's parent-death signal comes only for a parent that dies after the request: a worker whose parent
    was killed in the instant after the fork would wait on the pool's pipes forever. Here the parent it is told of
    is not its own, as if that one had died and the worker had been re-parented."""
    worker = os.fork()
    if worker == 0:  # the child: ends with SIGKILL, or exits 0 if it lives on
        try:
            callbacks._end_with_the_parent(os.getppid() + 1)
        finally:
            os._exit(0)
    _, status = os.waitpid(worker, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's parent-death signal is Linux's")
def test_a_worker_forked_by_another_thread_outlives_that_thread(tmp_path):
    """The kernel's parent-death signal follows the thread that forked: a worker forked by a pool's own thread (a
    replacement for a dead one) was killed as that thread ended with the pool's termination, holding the pool's
    queue lock, and the parent waited for the lock forever."""
    done = run_python(
        tmp_path / "thread.py",
        """
        import os, signal, threading
        from modeling.callbacks import PreemptionCallback

        callback = PreemptionCallback(signals=(signal.SIGTERM,))
        with callback.handling(), callback.stopping_at_once():
            readable, writable = os.pipe()
            started_reader, started_writer = os.pipe()
            workers = []

            def fork():
                worker = os.fork()
                if worker == 0:  # started, waits until the thread that forked it has ended
                    os.write(started_writer, b"x")
                    os.read(readable, 1)
                    os._exit(0)
                os.read(started_reader, 1)
                workers.append(worker)

            forking = threading.Thread(target=fork)
            forking.start()
            forking.join()
            os.write(writable, b"x")
            _, status = os.waitpid(workers[0], 0)
        print(os.WIFEXITED(status) and os.WEXITSTATUS(status))
        """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0"


def test_a_signal_while_the_data_is_prepared_stops_at_once_and_ends_the_workers_it_forked(tmp_path):
    """datasets' tokenising workers, forked with the parent's handlers, could not be ended by the pool's SIGTERM
    once the parent stopped: it waited for them forever. In a process of its own, so that a hang fails the test."""
    done = run_python(
        tmp_path / "prepare.py",
        """
        import os, signal, threading, time
        import datasets
        from modeling.callbacks import PreemptionCallback, SignalledBeforeTraining

        def slow(batch):
            time.sleep(0.5)
            return batch

        callback = PreemptionCallback(signals=(signal.SIGTERM,))
        rows = datasets.Dataset.from_dict({"x": list(range(40))})
        with callback.handling():
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
            try:
                with callback.stopping_at_once():
                    rows.map(slow, batched=True, batch_size=1, num_proc=2, keep_in_memory=True)
            except Exception:  # SignalledBeforeTraining, or what datasets' pool made of it
                pass
            print("requested:", callback.requested.name)
            try:
                with callback.stopping_at_once():
                    pass
            except SignalledBeforeTraining:
                print("the next block stops at once too")
        """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["requested: SIGTERM", "the next block stops at once too"]


def test_a_process_a_forked_worker_forks_in_turn_lives(tmp_path):
    """A tokenising worker that starts a process of its own: only the worker is tied to the preparing process, its
    own child (whose parent the worker is) runs to its end."""
    done = run_python(
        tmp_path / "grandchild.py",
        """
        import os, signal
        from modeling.callbacks import PreemptionCallback

        callback = PreemptionCallback(signals=(signal.SIGUSR1,))
        with callback.handling(), callback.stopping_at_once():
            worker = os.fork()
            if worker == 0:
                helper = os.fork()
                if helper == 0:
                    os._exit(7)
                _, status = os.waitpid(helper, 0)
                os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 100 + os.WTERMSIG(status))
            _, status = os.waitpid(worker, 0)
        print(os.WIFEXITED(status) and os.WEXITSTATUS(status))
        """,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "7"), done.stderr[-2000:]


def test_a_process_forked_outside_the_data_preparation_starts_quietly(tmp_path):
    """The fork hooks run at every fork of the process (DataLoader's workers, a tokenizer's pool), not only within
    `stopping_at_once`: there they have nothing to do, and must not fail in parent and child alike."""
    done = run_python(
        tmp_path / "quiet.py",
        """
        import os
        import modeling.callbacks

        worker = os.fork()
        if worker == 0:
            os._exit(0)
        _, status = os.waitpid(worker, 0)
        print(os.WIFEXITED(status) and os.WEXITSTATUS(status))
        """,
    )
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "0", "")


def tensorboard_run(tmp_path, monkeypatch) -> tuple[TensorBoardGivenUpCallback, TrainingArguments, TrainerState]:
    """The callback at the start of training, writing into tmp_path/tensorboard (TENSORBOARD_LOGGING_DIR)."""
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tensorboard"))
    callback, args, state = TensorBoardGivenUpCallback(), TrainingArguments(tmp_path / "run"), TrainerState()
    callback.on_train_begin(args, state, TrainerControl())
    return callback, args, state


def test_tensorboard_is_closed_at_the_end_of_training_with_every_logged_value_in_its_file(tmp_path, monkeypatch):
    threads = set(threading.enumerate())
    callback, args, state = tensorboard_run(tmp_path, monkeypatch)
    for state.global_step, loss in ((1, 4.0), (2, 3.5)):
        callback.on_log(args, state, TrainerControl(), logs={"loss": loss})
    assert set(threading.enumerate()) - threads, "the writer's thread writes the event file while training"
    callback.on_train_end(args, state, TrainerControl())
    assert callback.tb_writer is None and not callback.given_up
    assert set(threading.enumerate()) - threads == set(), "and ends with it"
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert [(scalar.step, scalar.value) for scalar in events.Scalars("train/loss")] == [(1, 4.0), (2, 3.5)]


def test_tensorboard_whose_last_write_the_disk_refuses_at_the_end_of_training_is_given_up_with_a_warning(
    tmp_path, monkeypatch, caplog
):
    """The close at the end flushes what is queued: raised, a full disk there ends a finished run in a traceback."""
    callback, args, state = tensorboard_run(tmp_path, monkeypatch)
    writer = callback.tb_writer
    close = writer.close

    def close_on_a_full_disk():
        close()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer, "close", close_on_a_full_disk)
    with caplog.at_level(logging.WARNING, logger="modeling.callbacks"):
        callback.on_train_end(args, state, TrainerControl())
    assert callback.given_up and callback.tb_writer is None
    assert f"Not logging to TensorBoard any more: cannot write into {tmp_path / 'tensorboard'} (" in caplog.text
    assert "No space left on device" in caplog.text


def test_tensorboard_whose_directory_cannot_be_made_is_given_up_with_a_warning(tmp_path, monkeypatch, caplog):
    """TENSORBOARD_LOGGING_DIR below a file: the writer is never made, and the run starts without it."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "file" / "tensorboard"))
    callback, args, state = TensorBoardGivenUpCallback(), TrainingArguments(tmp_path / "run"), TrainerState()
    with caplog.at_level(logging.WARNING, logger="modeling.callbacks"):
        callback.on_train_begin(args, state, TrainerControl())
    assert callback.given_up and callback.tb_writer is None
    assert f"cannot write into {tmp_path / 'file' / 'tensorboard'} (" in caplog.text
    callback.on_log(args, state, TrainerControl(), logs={"loss": 4.0})  # nothing more to write into
    callback.on_train_end(args, state, TrainerControl())


def test_tensorboard_given_up_at_a_log_step_closes_its_writer(tmp_path, monkeypatch):
    """The writer given up is closed: its thread and open event file do not outlive it for the rest of the run."""
    threads = set(threading.enumerate())
    callback, args, state = tensorboard_run(tmp_path, monkeypatch)

    def add_scalar_on_a_full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(callback.tb_writer, "add_scalar", add_scalar_on_a_full_disk)
    state.global_step = 1
    callback.on_log(args, state, TrainerControl(), logs={"loss": 4.0})
    assert callback.given_up and callback.tb_writer is None
    assert set(threading.enumerate()) - threads == set(), "the writer's thread ended with it"
