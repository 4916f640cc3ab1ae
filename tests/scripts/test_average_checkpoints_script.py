"""scripts/average_checkpoints.py end to end."""

import runpy
import sys

import pytest
import torch
from helpers import SCRIPTS, run_script, save_trainer_checkpoint, script_error, training_run_holding
from safetensors.torch import load_file

SCRIPT = SCRIPTS / "average_checkpoints.py"


def test_script_averages_the_last_checkpoints(tmp_path, monkeypatch, capsys):
    for step, seed in ((1, 0), (2, 1), (3, 2)):
        save_trainer_checkpoint(tmp_path / f"checkpoint-{step}", seed=seed)
    arguments = ["--checkpoint-dir", str(tmp_path), "--last", "2", "--output-dir", str(tmp_path / "averaged")]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *arguments])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    assert "checkpoint-2, checkpoint-3" in capsys.readouterr().out
    expected = [load_file(tmp_path / f"checkpoint-{step}" / "model.safetensors") for step in (2, 3)]
    averaged = load_file(tmp_path / "averaged" / "model.safetensors")
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (expected[0][name] + expected[1][name]) / 2, atol=1e-7, rtol=0)


def test_script_refuses_fewer_than_one_checkpoint(tmp_path, monkeypatch, capsys):
    arguments = ["--checkpoint-dir", str(tmp_path), "--last", "0", "--output-dir", str(tmp_path / "averaged")]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *arguments])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert exit_info.value.code == 2
    assert "argument --last: must be at least 1, got 0" in capsys.readouterr().err


def test_script_averages_the_checkpoints_named_and_refuses_an_incomplete_one(tmp_path, monkeypatch, capsys):
    for step, seed in ((1, 0), (2, 1), (3, 2)):
        save_trainer_checkpoint(tmp_path / f"checkpoint-{step}", seed=seed)
    named = [str(tmp_path / "checkpoint-1"), str(tmp_path / "checkpoint-3")]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--checkpoints", *named, "--output-dir", str(tmp_path / "avg")])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    assert "checkpoint-1, checkpoint-3" in capsys.readouterr().out
    expected = [load_file(tmp_path / f"checkpoint-{step}" / "model.safetensors") for step in (1, 3)]
    for name, tensor in load_file(tmp_path / "avg" / "model.safetensors").items():
        torch.testing.assert_close(tensor, (expected[0][name] + expected[1][name]) / 2, atol=1e-7, rtol=0)

    weights = tmp_path / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    named = [str(tmp_path / "checkpoint-2"), str(tmp_path / "checkpoint-3")]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--checkpoints", *named, "--output-dir", str(tmp_path / "avg")])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert str(exit_info.value.code).startswith(f"error: {tmp_path / 'checkpoint-2'} is incomplete: ")
    assert "model.safetensors is truncated" in str(exit_info.value.code)


def test_script_takes_last_with_a_checkpoint_dir_and_checkpoints_without(tmp_path, monkeypatch, capsys):
    cases = [
        ["--last", "2"],
        ["--checkpoint-dir", str(tmp_path), "--checkpoints", str(tmp_path)],
        ["--checkpoint-dir", str(tmp_path), "--last", "2", "--checkpoints", str(tmp_path)],
    ]
    for arguments in cases:
        monkeypatch.setattr(sys, "argv", [str(SCRIPT), *arguments, "--output-dir", str(tmp_path / "avg")])
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path(str(SCRIPT), run_name="__main__")
        assert exit_info.value.code == 2
    errors = capsys.readouterr().err
    assert errors.count("--checkpoint-dir goes with --last") == 2
    assert "not allowed with argument" in errors


def test_a_run_directory_and_a_checkpoint_given_for_each_other_are_named(tmp_path, monkeypatch):
    """A run's directory named as a checkpoint was "averaged" alone: a copy of its final model, printed as "Averaged
    run into ...". A checkpoint named as the run's directory: "found 0 complete: []"; a file: "does not exist"."""
    for step, seed in ((1, 0), (2, 1)):
        save_trainer_checkpoint(tmp_path / "run" / f"checkpoint-{step}", seed=seed)
    save_trainer_checkpoint(tmp_path / "run", seed=2)  # the final model beside them
    (tmp_path / "notes.txt").write_text("")
    output = ["--output-dir", tmp_path / "averaged"]
    message = script_error(
        "average_checkpoints.py", "--checkpoints", tmp_path / "run", *output, monkeypatch=monkeypatch
    )
    assert message == (
        f"error: {tmp_path / 'run'} is a run's directory, not a checkpoint: name its checkpoints "
        f"({tmp_path / 'run' / 'checkpoint-2'}, ...), or average its last N (--checkpoint-dir {tmp_path / 'run'} "
        "--last N)"
    )
    one = tmp_path / "run" / "checkpoint-2"
    message = script_error(
        "average_checkpoints.py", "--checkpoint-dir", one, "--last", "2", *output, monkeypatch=monkeypatch
    )
    assert message == (
        f"error: Asked for the last 2 checkpoints of {one}, found 0 complete: [] (it is itself a checkpoint: give the "
        "run's directory, which holds it)."
    )
    notes = tmp_path / "notes.txt"
    message = script_error(
        "average_checkpoints.py", "--checkpoint-dir", notes, "--last", "2", *output, monkeypatch=monkeypatch
    )
    assert message == f"error: Checkpoint directory {notes} is a file: give the directory that holds it."
    assert not (tmp_path / "averaged").exists()


def test_an_output_inside_a_checkpoint_of_a_run_still_training_is_refused(tmp_path, monkeypatch):
    """`--output-dir runs/x/checkpoint-N/averaged` while the run goes on: its rotation deleted the average."""
    run = tmp_path / "run"
    for step in (1, 2):
        save_trainer_checkpoint(run / f"checkpoint-{step}", seed=step)
    with training_run_holding(run) as holder:
        flags = ["--checkpoint-dir", run, "--last", "2", "--output-dir", run / "checkpoint-1" / "averaged"]
        message = script_error("average_checkpoints.py", *flags, monkeypatch=monkeypatch)
        assert message == (
            f"error: --output-dir {run / 'checkpoint-1' / 'averaged'} lies inside {run / 'checkpoint-1'}, which the "
            f"training run in {run} ({holder}) deletes when it rotates its checkpoints: write it outside that "
            "directory"
        )
        assert not (run / "checkpoint-1" / "averaged").exists()
        run_script("average_checkpoints.py", *flags[:-1], run / "averaged", monkeypatch=monkeypatch)  # beside: kept
    assert (run / "averaged" / "model.safetensors").is_file()
