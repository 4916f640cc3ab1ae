"""Trainer callbacks for long runs: time-based checkpoints, a wall-clock budget, the sampler's epoch.

Decisions that lead to collectives (saving, stopping) must be the same on every process: rank 0's clock decides and
broadcasts its decision after every update (one integer, negligible next to an update).
"""

from __future__ import annotations

import logging
import math
import time

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from .batching import TokenBudgetBatchSampler

logger = logging.getLogger(__name__)


def _rank_zero_decides(flag: bool, device: torch.device) -> bool:
    """Rank 0's `flag`, on every rank: decisions that lead to collectives must be the same everywhere."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    decision = torch.tensor([int(flag)], device=device)
    dist.broadcast(decision, src=0)
    return bool(decision.item())


class SaveEveryMinutesCallback(TrainerCallback):
    """Save a checkpoint once `minutes` have passed since the last one (Sec. 6.1: "written at 10-minute intervals").

    Saving involves collectives, so all processes must save after the same update: rank 0's clock decides after
    every update and broadcasts its decision (one integer, negligible next to an update). The clock restarts at
    every save, step-based ones included, and when training (re)starts.
    """

    def __init__(self, minutes: float):
        if minutes <= 0:
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
        if minutes <= 0:
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
