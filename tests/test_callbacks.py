"""Tests of modeling/callbacks.py: checkpoints every N minutes, a wall-clock budget, the sampler's epoch when
resuming."""


import time
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl

from modeling.batching import TokenBudgetBatchSampler
from modeling.callbacks import SamplerEpochCallback, SaveEveryMinutesCallback, StopAfterMinutesCallback


def test_sampler_epoch_follows_completed_updates_when_resuming():
    """Resuming after 7 updates of 2 micro-batches, with 4 batches (2 updates) per epoch, is in epoch 3."""
    callback, sampler = SamplerEpochCallback(), TokenBudgetBatchSampler([3] * 8, [3] * 8, max_tokens=6)
    callback.sampler = sampler
    args, state = SimpleNamespace(gradient_accumulation_steps=2), SimpleNamespace(global_step=7)
    callback.on_epoch_begin(args, state, TrainerControl(), train_dataloader=list(sampler))
    assert (len(sampler), sampler.epoch) == (4, 3)


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """time.monotonic() under the test's control: advance it with `clock[0] += seconds`."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


CPU_ARGS = SimpleNamespace(device=torch.device("cpu"))


def test_checkpoints_every_n_minutes(clock):
    callback = SaveEveryMinutesCallback(minutes=10)
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


def test_training_stops_with_a_checkpoint_when_the_minutes_are_spent(clock):
    callback = StopAfterMinutesCallback(minutes=90)
    callback.on_train_begin(CPU_ARGS, None, None)
    control = TrainerControl()
    clock[0] += 89 * 60
    callback.on_step_end(CPU_ARGS, SimpleNamespace(global_step=7), control)
    assert not (control.should_training_stop or control.should_save)
    clock[0] += 60
    callback.on_step_end(CPU_ARGS, SimpleNamespace(global_step=8), control)
    assert control.should_training_stop and control.should_save
