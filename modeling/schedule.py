"""The learning-rate schedule of Sec. 5.3, exactly.

`lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)` where `step` is the number of the update being taken,
from 1. (transformers' `inverse_sqrt` is one step late: its first update has lr 0.) The optimizer's learning rate
multiplies it, as tensor2tensor's `learning_rate_constant` does: 1.0 is the paper.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


def check_warmup_steps(warmup_steps: float) -> None:
    """The schedule rises for `warmup_steps` updates, so it needs one at least: refused in one line otherwise. Checked
    on the argument (below 1, Hugging Face reads it as a ratio of the run's updates) and on the count it gives."""
    if not warmup_steps > 0:
        raise ValueError(
            f"The schedule of Sec. 5.3 needs a warmup of at least one update (the paper: 4000), got {warmup_steps:g}."
        )


def noam_learning_rate(step: int, d_model: int, warmup_steps: int) -> float:
    """lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5) (Eq. 3), for the update numbered `step` ≥ 1.

    It rises linearly for the first `warmup_steps` updates, then decays as the inverse square root of the step.
    """
    if step < 1 or warmup_steps < 1:
        raise ValueError(f"step ({step}) and warmup_steps ({warmup_steps}) count updates from 1.")
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


class NoamSchedule:
    """The factor `LambdaLR` multiplies the optimizer's learning rate by.

    `LambdaLR` calls it with its own counter, 0 before the first update and k after k updates; the update that
    follows is number k + 1, so it returns the rate of step k + 1 and update 1 uses the rate of step 1. A class rather
    than a closure so that the scheduler's state dict (saved in every checkpoint) records d_model and warmup.
    """

    def __init__(self, d_model: int, warmup_steps: int):
        self.d_model = d_model
        self.warmup_steps = warmup_steps

    def __call__(self, scheduler_step: int) -> float:
        return noam_learning_rate(scheduler_step + 1, self.d_model, self.warmup_steps)


def noam_scheduler(optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int) -> LambdaLR:
    """The schedule of Sec. 5.3 scaled by the optimizer's learning rate (1.0 gives the formula itself)."""
    return LambdaLR(optimizer, NoamSchedule(d_model, warmup_steps))
