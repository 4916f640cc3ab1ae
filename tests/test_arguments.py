"""Tests of modeling/arguments.py: each setting taken at the edge of its range and refused past it, when the
arguments are made; how --resume_from_checkpoint is read; checkpoint rotation against averaging. The script's
parsing (presets, config files, flags) is tested in tests/scripts/test_train_script.py, and the launcher's settings
(ddp_backend, mixed precision) in tests/test_trainer.py."""

import re

import pytest
from helpers import training_args

from modeling.arguments import checkpoint_to_resume


@pytest.mark.parametrize(
    "setting",
    [
        {"max_tokens_per_device": 1},
        {"tokens_per_update": 1},
        {"label_smoothing_factor": 0.0},
        {"label_smoothing_factor": 1.0},
        {"save_every_minutes": 0.5},
        {"max_train_minutes": 0.5},
        {"average_last_checkpoints": 0},
    ],
)
def test_each_setting_is_taken_at_the_edge_of_its_range(setting, tmp_path):
    ((name, value),) = setting.items()
    assert getattr(training_args(tmp_path, **setting), name) == value


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"max_tokens_per_device": 0}, "max_tokens_per_device must be positive, got 0."),
        ({"max_train_minutes": 0}, "max_train_minutes must be positive, got 0."),
        ({"average_last_checkpoints": -1}, "average_last_checkpoints must not be negative, got -1."),
    ],
)
def test_a_setting_past_the_edge_of_its_range_is_refused_naming_it(setting, message, tmp_path):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        training_args(tmp_path, **setting)


@pytest.mark.parametrize(
    ("value", "asked"),
    [
        (None, None),
        ("", None),
        (" None ", None),
        ("false", None),
        ("last", "last"),
        ("TRUE", "last"),
        ("run/checkpoint-8", "run/checkpoint-8"),
    ],
)
def test_resume_from_checkpoint_is_read_as_last_a_path_or_a_fresh_run(value, asked):
    assert checkpoint_to_resume(value) == asked


@pytest.mark.parametrize(
    ("limit", "averaged", "best", "refusal"),
    [
        (1, 2, None, "save_total_limit 1 keeps fewer checkpoints than average_last_checkpoints 2 averages"),
        (
            3,
            3,
            "eval_loss",
            "save_total_limit 3 with metric_for_best_model keeps the best checkpoint and only the 2 newest, fewer "
            "than average_last_checkpoints 3 averages",
        ),
        (4, 3, "eval_loss", None),  # the best and the 3 newest
        (1, 1, "eval_loss", None),  # nothing averaged
    ],
)
def test_a_rotation_that_keeps_fewer_checkpoints_than_the_average_needs_is_refused(
    limit, averaged, best, refusal, tmp_path
):
    """With metric_for_best_model, rotation keeps the best checkpoint in one of the limit's places: an old best
    would be averaged with the newest ones."""
    settings = {"save_total_limit": limit, "average_last_checkpoints": averaged, "metric_for_best_model": best}
    if refusal is None:
        assert training_args(tmp_path, **settings).save_total_limit == limit
    else:
        with pytest.raises(ValueError, match=f"^{re.escape(refusal)}: raise save_total_limit"):
            training_args(tmp_path, **settings)
