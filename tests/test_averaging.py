"""Tests of modeling/averaging.py (checkpoint averaging, Sec. 6.1): the mean, complete checkpoints of one run
only, the output swapped in whole."""

import errno
import json
import logging

import pytest
import torch
from helpers import save_trainer_checkpoint
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import modeling.averaging as averaging
from modeling.averaging import average_checkpoints, last_checkpoints, list_checkpoints
from modeling.checkpoints import RunMismatchError, write_completeness_marker
from modeling.files import DiskFullError


def test_average_of_two_checkpoints_is_their_mean_and_loads(tmp_path):
    first = save_trainer_checkpoint(tmp_path / "checkpoint-1000", seed=0)
    second = save_trainer_checkpoint(tmp_path / "checkpoint-2000", seed=1)

    output_dir = average_checkpoints(last_checkpoints(tmp_path, 2), tmp_path / "averaged")

    averaged = load_file(output_dir / "model.safetensors")
    assert averaged.keys() == first.keys()
    assert "lm_head.weight" not in averaged, "the tied output projection is stored (and averaged) once"
    for name, tensor in averaged.items():
        assert tensor.dtype == first[name].dtype
        torch.testing.assert_close(tensor, (first[name] + second[name]) / 2, atol=1e-7, rtol=0, msg=name)
    assert not any((output_dir / name).exists() for name in ("optimizer.pt", "trainer_state.json", "rng_state.pth"))

    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir).eval()
    torch.testing.assert_close(model.lm_head.weight, model.model.shared.weight, atol=0, rtol=0)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    generated = model.generate(**tokenizer(["the small dog"], return_tensors="pt"), max_new_tokens=4)
    assert generated.shape[0] == 1
    assert model.generation_config.num_beams == 4, "the generation config travels with the average"


def test_checkpoints_are_ordered_by_step_not_by_name(tmp_path):
    for name in ("checkpoint-900", "checkpoint-1000", "checkpoint-80", "runs", "checkpoint-best"):
        (tmp_path / name).mkdir()
        write_completeness_marker(tmp_path / name)  # complete, if empty
    assert [path.name for path in list_checkpoints(tmp_path)] == ["checkpoint-80", "checkpoint-900", "checkpoint-1000"]
    assert [path.name for path in last_checkpoints(tmp_path, 2)] == ["checkpoint-900", "checkpoint-1000"]
    with pytest.raises(ValueError, match="last 5 checkpoints"):
        last_checkpoints(tmp_path, 5)


def test_checkpoints_of_different_models_are_refused(tmp_path):
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0, d_model=32)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=0, d_model=64)
    with pytest.raises(ValueError, match="checkpoint-2"):
        average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")


def test_incomplete_checkpoints_are_skipped_naming_them(tmp_path, caplog):
    first = save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    third = save_trainer_checkpoint(tmp_path / "checkpoint-3", seed=2)
    weights = tmp_path / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])  # a copy cut short
    with caplog.at_level(logging.WARNING):
        assert last_checkpoints(tmp_path, 2) == [tmp_path / "checkpoint-1", tmp_path / "checkpoint-3"]
        output_dir = average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    assert "checkpoint-2" in caplog.text and "model.safetensors is truncated" in caplog.text
    averaged = load_file(output_dir / "model.safetensors")
    name = next(iter(averaged))
    torch.testing.assert_close(averaged[name], (first[name] + third[name]) / 2, atol=1e-7, rtol=0)
    assert json.loads((output_dir / "checkpoint_averaging.json").read_text())["checkpoints"] == [
        str(tmp_path / "checkpoint-1"),
        str(tmp_path / "checkpoint-3"),
    ]


def test_checkpoints_of_two_runs_are_refused_naming_both_and_what_differs(tmp_path):
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    for step, seed in ((1, 0), (2, 1)):  # the same architecture and tokenizer, but two runs' records
        (tmp_path / f"checkpoint-{step}" / "run_identity.json").write_text(json.dumps({"seed": seed}))
    mixed = r"checkpoint-1 and .*checkpoint-2 are not checkpoints of one run, they differ in run_identity\.seed"
    with pytest.raises(RunMismatchError, match=mixed):
        average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    assert not (tmp_path / "averaged").exists() and not (tmp_path / "averaged.partial").exists()


def test_a_failed_average_leaves_the_previous_one_intact(tmp_path, monkeypatch):
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    output_dir = average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    before = (output_dir / "model.safetensors").read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(averaging, "save_file", full_disk)
    with pytest.raises(DiskFullError, match=f"No space left on device while writing {output_dir}"):
        average_checkpoints(list_checkpoints(tmp_path)[:1], output_dir)
    assert (output_dir / "model.safetensors").read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["averaged", "checkpoint-1", "checkpoint-2"]


def test_an_average_never_replaces_a_directory_it_did_not_write(tmp_path):
    """`--output-dir runs/base` instead of `runs/base/averaged` must not replace the run it averages."""
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    with pytest.raises(FileExistsError, match="is not an average of checkpoints"):
        average_checkpoints(list_checkpoints(tmp_path), tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-1", "checkpoint-2"]
    average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")  # a previous average: replaced
    assert sorted(path.name for path in tmp_path.iterdir()) == ["averaged", "checkpoint-1", "checkpoint-2"]
