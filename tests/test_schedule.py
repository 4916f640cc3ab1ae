"""Tests of modeling/schedule.py: the learning rate of Sec. 5.3, exactly."""

import pytest
import torch

from modeling.schedule import check_warmup_steps, noam_learning_rate, noam_scheduler


def test_schedule_values_equal_the_formula():
    def formula(step):
        return 512**-0.5 * min(step**-0.5, step * 4000**-1.5)

    for step in (1, 4000, 100_000):
        assert noam_learning_rate(step, 512, 4000) == formula(step)
    assert noam_learning_rate(4000, 512, 4000) == pytest.approx(6.98771e-4, rel=1e-5)  # the peak
    assert noam_learning_rate(1, 512, 4000) == pytest.approx(1.74693e-7, rel=1e-5)
    assert noam_learning_rate(100_000, 512, 4000) == pytest.approx(1.39754e-4, rel=1e-5)

    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    scheduler = noam_scheduler(optimizer, d_model=512, warmup_steps=4000)
    for step in (1, 4000, 100_000):  # the factor for update `step` is asked with the scheduler's counter step - 1
        assert scheduler.lr_lambdas[0](step - 1) == formula(step)
    for step in (1, 2, 3):  # update 1 uses the rate of step 1, update 2 that of step 2, ...
        assert optimizer.param_groups[0]["lr"] == formula(step)
        optimizer.step()
        scheduler.step()


def test_a_warmup_of_less_than_one_update_is_refused_in_one_line():
    for warmup in (0, -1, float("nan")):
        with pytest.raises(ValueError, match=r"^The schedule of Sec\. 5\.3 needs a warmup of at least one update"):
            check_warmup_steps(warmup)
    check_warmup_steps(0.1)  # a ratio of the run's updates, as Hugging Face reads it; its count is checked again
    check_warmup_steps(4000)


def test_a_step_or_warmup_below_one_is_refused_in_one_line_and_one_is_the_least():
    for step, warmup in ((0, 4000), (1, 0), (-1, 4000)):
        with pytest.raises(
            ValueError, match=rf"^step \({step}\) and warmup_steps \({warmup}\) count updates from 1\.$"
        ):
            noam_learning_rate(step, 512, warmup)
    assert noam_learning_rate(1, 512, 1) == 512**-0.5  # a warmup of one update peaks at the first
