"""Tests of modeling/averaging.py (checkpoint averaging, Sec. 6.1): the mean, complete checkpoints of one run
only, the output swapped in whole."""

import errno
import json
import logging
import os
import shutil
import weakref
from pathlib import Path
from unittest.mock import Mock

import pytest
import torch
from helpers import save_trainer_checkpoint
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import modeling.averaging as averaging
from modeling.averaging import average_checkpoints, last_checkpoints, list_checkpoints, named_checkpoints
from modeling.checkpoints import (
    RUN_IDENTITY_FILE,
    IncompleteCheckpointError,
    RunMismatchError,
    write_completeness_marker,
)
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
    # The Trainer's state and pickled arguments describe one point of training, not the average (nor go to the Hub).
    states = ("optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth", "training_args.bin")
    assert not any((output_dir / name).exists() for name in states)

    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir).eval()
    torch.testing.assert_close(model.lm_head.weight, model.model.shared.weight, atol=0, rtol=0)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    generated = model.generate(**tokenizer(["the small dog"], return_tensors="pt"), max_new_tokens=4)
    assert generated.shape[0] == 1
    assert model.generation_config.num_beams == 4, "the generation config travels with the average"


def test_each_checkpoint_is_let_go_before_the_next_is_loaded(tmp_path, monkeypatch):
    """Memory holds one checkpoint and the float64 sums, however many are averaged: the first checkpoint was kept
    to the end beside the sums, and each one until the next had loaded (5.3 times a model's size at the peak)."""
    for step in (1, 2, 3):
        save_trainer_checkpoint(tmp_path / f"checkpoint-{step}", seed=step)
    loaded: list[weakref.ref] = []
    load_weights = averaging._load_weights

    def loading(checkpoint):
        held = [ref().shape for ref in loaded if ref() is not None]
        assert not held, f"loading {checkpoint.name} while {len(held)} tensors of earlier checkpoints are held"
        weights = load_weights(checkpoint)
        loaded.extend(weakref.ref(tensor) for tensor in weights.values() if tensor.is_floating_point())
        return weights

    monkeypatch.setattr(averaging, "_load_weights", loading)
    average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    assert len(loaded) > 3 * 10, "every checkpoint was loaded"


def test_the_averages_files_get_this_users_umask_not_the_checkpoints_modes(tmp_path):
    """Checkpoints a run under a umask of 000 wrote (world-writable), averaged under 022: the files copied from the
    newest kept their 0666, the remote code that `trust_remote_code` runs among them; read-only ones stayed so."""
    for step, mode in ((1000, 0o666), (2000, 0o444)):
        save_trainer_checkpoint(tmp_path / f"checkpoint-{step}", seed=step)
        for path in (tmp_path / f"checkpoint-{step}").iterdir():
            path.chmod(mode)
    umask = os.umask(0o022)
    try:
        for checkpoint in ("checkpoint-1000", "checkpoint-2000"):
            output_dir = average_checkpoints([tmp_path / checkpoint], tmp_path / f"averaged-{checkpoint}")
            modes = {path.name: path.stat().st_mode & 0o777 for path in output_dir.iterdir()}
            assert "modeling_transformer.py" in modes and set(modes.values()) == {0o644}, modes
    finally:
        os.umask(umask)


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


def test_a_checkpoint_holding_nan_weights_is_refused_naming_it_and_nothing_is_written(tmp_path):
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    diverged = save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    diverged["model.decoder.layers.0.ffn.fc2.weight"][1, 2] = float("inf")
    save_file(diverged, tmp_path / "checkpoint-2" / "model.safetensors", metadata={"format": "pt"})
    assert average_refused(tmp_path, ValueError) == (
        f"{tmp_path / 'checkpoint-2'}: model.decoder.layers.0.ffn.fc2.weight holds NaN or infinite values (its run "
        "had diverged): average checkpoints saved before it."
    )


def test_a_checkpoint_removed_while_averaging_is_named_as_such(tmp_path, monkeypatch):
    """A run still training rotated it out: before, "does not hold the same tensors as the others" and a list of
    every tensor name."""
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    usable = averaging.usable_checkpoints

    def rotated_out_once_listed(paths):
        listed = usable(paths)
        shutil.rmtree(tmp_path / "checkpoint-2")
        return listed

    monkeypatch.setattr(averaging, "usable_checkpoints", rotated_out_once_listed)
    assert average_refused(tmp_path, FileNotFoundError) == (
        f"{tmp_path / 'checkpoint-2'} was removed while the checkpoints were averaged (by the save_total_limit "
        "rotation of a run still training there?): average again, or once the run has ended"
    )


def test_a_checkpoint_rotated_out_between_choosing_and_averaging_is_named_not_skipped(tmp_path):
    """`--last 3` while a run still trains there: its next save rotated the oldest chosen out. Before, it was skipped
    as "incomplete" with a warning, two were averaged, and the script said it had averaged all three."""
    for step in (1, 2, 3):
        save_trainer_checkpoint(tmp_path / f"checkpoint-{step}", seed=step)
    chosen = last_checkpoints(tmp_path, 3)
    save_trainer_checkpoint(tmp_path / "checkpoint-4", seed=4)
    os.replace(tmp_path / "checkpoint-1", tmp_path / ".checkpoint-1.deleting")
    with pytest.raises(FileNotFoundError) as refused:
        average_checkpoints(chosen, tmp_path / "averaged")
    assert str(refused.value) == (
        f"{tmp_path / 'checkpoint-1'} was removed while the checkpoints were averaged (by the save_total_limit "
        "rotation of a run still training there?): average again, or once the run has ended"
    )
    assert not (tmp_path / "averaged").exists()


@pytest.mark.parametrize("removed", ["once its files are listed", "while its files are copied"])
def test_the_newest_checkpoint_removed_while_its_files_are_copied_is_named(tmp_path, monkeypatch, removed):
    """Its weights summed, then rotated out: before, an average of weights alone (no config.json, no tokenizer) was
    written and reported as done, or "[Errno 2] No such file or directory: '.../checkpoint-2/tokenizer.json'"."""
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)

    def rotate_out() -> None:
        if (tmp_path / "checkpoint-2").exists():
            os.replace(tmp_path / "checkpoint-2", tmp_path / ".checkpoint-2.deleting")

    if removed == "once its files are listed":
        pickled = averaging.PICKLED_STATE_RE
        monkeypatch.setattr(
            averaging, "PICKLED_STATE_RE", Mock(match=lambda name: rotate_out() or pickled.match(name))
        )
    else:
        copyfile = shutil.copyfile
        monkeypatch.setattr(shutil, "copyfile", lambda *args: rotate_out() or copyfile(*args))
    assert average_refused(tmp_path, FileNotFoundError) == (
        f"{tmp_path / 'checkpoint-2'} was removed while the checkpoints were averaged (by the save_total_limit "
        "rotation of a run still training there?): average again, or once the run has ended"
    )


def average_refused(run: Path, error: type[Exception]) -> str:
    """The message of averaging `run`'s checkpoints refused with `error`, having written nothing."""
    with pytest.raises(error) as refused:
        average_checkpoints(list_checkpoints(run), run / "averaged")
    assert not (run / "averaged").exists() and not list(run.glob(".averaged*")), "nothing written"
    return str(refused.value)


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
    assert f"Not averaging the incomplete checkpoint {tmp_path / 'checkpoint-2'}" in caplog.text
    averaged = load_file(output_dir / "model.safetensors")
    name = next(iter(averaged))
    torch.testing.assert_close(averaged[name], (first[name] + third[name]) / 2, atol=1e-7, rtol=0)
    record = json.loads((output_dir / "checkpoint_averaging.json").read_text())
    assert record["checkpoints"] == ["../checkpoint-1", "../checkpoint-3"], "relative: no absolute path published"
    assert record["configuration_from"] == "../checkpoint-3"


def test_checkpoints_of_two_runs_are_refused_naming_both_and_what_differs(tmp_path):
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    for step, seed in ((1, 0), (2, 1)):  # the same architecture and tokenizer, but two runs' records
        (tmp_path / f"checkpoint-{step}" / "run_identity.json").write_text(json.dumps({"seed": seed}))
    mixed = r"checkpoint-1 and .*checkpoint-2 are not checkpoints of one run, they differ in run_identity\.seed"
    with pytest.raises(RunMismatchError, match=mixed):
        average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    assert not (tmp_path / "averaged").exists() and not (tmp_path / "averaged.partial").exists()


def test_two_runs_checkpoints_on_either_side_of_one_recording_no_run_are_refused(tmp_path):
    """Neighbours alone were compared: checkpoint-2, recording no run identity (saved before runs recorded one),
    matched each of the two runs around it, and their checkpoints were averaged together."""
    for step in (1, 2, 3):
        save_trainer_checkpoint(tmp_path / f"checkpoint-{step}", seed=step)
    for step, seed in ((1, 0), (3, 1)):
        (tmp_path / f"checkpoint-{step}" / "run_identity.json").write_text(json.dumps({"seed": seed}))
    mixed = r"checkpoint-1 and .*checkpoint-3 are not checkpoints of one run, they differ in run_identity\.seed"
    with pytest.raises(RunMismatchError, match=mixed):
        average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    assert not (tmp_path / "averaged").exists()


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


def saves(directory, steps: list[int], save_strategy: str | None = "steps", **newest_state) -> None:
    """Complete (empty) checkpoints at `steps`, the newest one's trainer_state.json holding `newest_state` and its
    marker the run's `save_strategy` (None: not recorded, as in a plain Trainer's checkpoint without arguments)."""
    for step in steps:
        write_completeness_marker(
            directory / f"checkpoint-{step}", **({"save_strategy": save_strategy} if save_strategy else {})
        )
    (directory / f"checkpoint-{steps[-1]}" / "trainer_state.json").write_text(json.dumps(newest_state))


@pytest.mark.parametrize(
    ("steps", "best"),
    [
        ([100, 400, 500, 600], 100),  # save_total_limit 4, the best at 100: rotation deleted 200 and 300
        ([200, 550], 200),  # max_steps 550, save_total_limit 2: the last update's save after the deleted ones
        ([200, 450, 500], 200),  # a preemption's save at 450
        ([200, 737, 800, 900], 200),  # a timed save (save_every_minutes) at 737
    ],
)
def test_last_checkpoints_refuses_an_old_best_that_rotation_kept_in_place_of_the_last_saves(tmp_path, steps, best):
    saves(tmp_path, steps, best_model_checkpoint=str(tmp_path / f"checkpoint-{best}"), save_steps=100)
    with pytest.raises(ValueError) as refused:
        last_checkpoints(tmp_path, len(steps))
    message = str(refused.value)
    assert f"{tmp_path / f'checkpoint-{best}'} is not one of the last {len(steps)} saves" in message
    assert (
        f"deleted the saves of the {steps[1] - best} updates up to checkpoint-{steps[1]} (saves every 100)" in message
    )
    assert f"average the last {len(steps) - 1} at most" in message
    assert f"(best_model_checkpoint in checkpoint-{steps[-1]}/trainer_state.json)" in message
    assert last_checkpoints(tmp_path, len(steps) - 1) == [tmp_path / f"checkpoint-{step}" for step in steps[1:]]


@pytest.mark.parametrize(
    ("steps", "best", "strategy"),
    [
        ([100, 200, 300, 400], 100, "steps"),  # the best among the last saves, where it belongs
        ([100, 200, 250, 300], 100, "steps"),  # a preemption's save at 250: closer, never farther apart
        ([100, 400, 500], 500, "steps"),  # the newest is the best
        ([100, 400, 500], None, "steps"),  # no best tracked: rotation kept nothing for it
        ([681, 1362], 681, "epoch"),  # epochs of 681 updates; save_steps (500) unused
        ([1000, 2000, 2500], 1000, "epoch"),  # 2.5 epochs of 1,000
        ([1000, 2000, 2400, 3000], 1000, "epoch"),  # and a preemption's save
        ([1000, 2300], 1000, "best"),  # saved at new bests, then a preemption's save
        ([1000, 2000], 1000, None),  # a strategy nobody recorded: warned of, not refused
    ],
)
def test_last_checkpoints_takes_the_last_saves_with_the_best_among_them(tmp_path, steps, best, strategy, caplog):
    best_path = None if best is None else str(tmp_path / f"checkpoint-{best}")
    saves(
        tmp_path,
        steps,
        save_strategy=strategy,
        best_model_checkpoint=best_path,
        save_steps=100 if strategy == "steps" else 500,
    )
    with caplog.at_level(logging.WARNING, logger="modeling.averaging"):
        assert last_checkpoints(tmp_path, len(steps)) == [tmp_path / f"checkpoint-{step}" for step in steps]
    assert ("if save_total_limit deleted the saves between them" in caplog.text) == (strategy is None)


def test_at_most_takes_what_there_is_of_the_run_and_leaves_an_old_best_out(tmp_path, caplog):
    """As a run averages its own checkpoints at its end: warned of, never refused."""
    ours, theirs = {"config": {"d_model": 32}, "seed": 1}, {"config": {"d_model": 32}, "seed": 2}
    saves(tmp_path, [100, 200, 300])
    (tmp_path / "checkpoint-100" / RUN_IDENTITY_FILE).write_text(json.dumps(theirs))
    (tmp_path / "checkpoint-300" / RUN_IDENTITY_FILE).write_text(json.dumps(ours))  # 200 records none: ours
    with caplog.at_level(logging.WARNING, logger="modeling.averaging"):
        taken = last_checkpoints(tmp_path, 3, identity=ours, at_most=True)
    assert taken == [tmp_path / "checkpoint-200", tmp_path / "checkpoint-300"]
    assert "Not averaging" in caplog.text and "checkpoint-100: it belongs to another run" in caplog.text
    assert "Averaging the 2 checkpoints" in caplog.text and "rather than 3" in caplog.text
    with pytest.raises(ValueError, match="found 2 complete"):
        last_checkpoints(tmp_path, 3, identity=ours)
    (tmp_path / "empty").mkdir()
    assert last_checkpoints(tmp_path / "empty", 2, at_most=True) == [], "no checkpoint: nothing to average"

    rotated = tmp_path / "rotated"  # save_total_limit 4, the best at 100: rotation deleted 200 and 300
    saves(rotated, [100, 400, 500, 600], best_model_checkpoint=str(rotated / "checkpoint-100"), save_steps=100)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="modeling.averaging"):
        taken = last_checkpoints(rotated, 4, at_most=True)
    assert taken == [rotated / f"checkpoint-{step}" for step in (400, 500, 600)]
    assert "is not one of the last 4 saves" in caplog.text and "averaging the last 3 only" in caplog.text


def test_a_checkpoint_given_twice_is_refused(tmp_path):
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    twice = [tmp_path / "checkpoint-1", tmp_path / "checkpoint-2", tmp_path / "." / "checkpoint-1"]
    with pytest.raises(ValueError, match="checkpoint-1 is given twice .* it would weigh double"):
        average_checkpoints(twice, tmp_path / "averaged")
    assert not (tmp_path / "averaged").exists()


def test_the_save_strategy_is_read_from_the_trainers_arguments_without_running_their_pickle(tmp_path):
    from transformers import Seq2SeqTrainingArguments

    from modeling.averaging import _save_strategy

    checkpoint = tmp_path / "checkpoint-8"
    checkpoint.mkdir()
    arguments = Seq2SeqTrainingArguments(tmp_path / "out", save_strategy="epoch", use_cpu=True, report_to="none")
    torch.save(arguments, checkpoint / "training_args.bin")  # as the Trainer saves them
    assert _save_strategy(checkpoint) == "epoch"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    torch.save({"save_strategy": Payload()}, checkpoint / "training_args.bin")
    assert _save_strategy(checkpoint) is None and not (tmp_path / "ran").exists()


def test_what_cannot_be_averaged_is_refused_before_any_checkpoint_is_loaded(tmp_path, monkeypatch):
    """Averaging 20 checkpoints of a big model takes minutes: a refusal comes first, not after them."""
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not an average")
    monkeypatch.setattr(averaging, "_load_weights", lambda checkpoint: pytest.fail(f"{checkpoint} was loaded"))
    with pytest.raises(ValueError, match="No checkpoints to average"):
        average_checkpoints([], tmp_path / "averaged")
    with pytest.raises(ValueError, match="The output directory .*checkpoint-1 is one of the checkpoints to average"):
        average_checkpoints([tmp_path / "checkpoint-1"], tmp_path / "checkpoint-1")
    with pytest.raises(FileExistsError, match="mine exists and is not an average of checkpoints"):
        average_checkpoints([tmp_path / "checkpoint-1"], tmp_path / "mine")
    with pytest.raises(ValueError, match="n must be at least 1, got 0"):
        last_checkpoints(tmp_path, 0)


def test_averaging_no_complete_checkpoint_is_refused(tmp_path):
    (tmp_path / "checkpoint-1").mkdir()
    message = average_refused(tmp_path, ValueError)
    assert message == f"None of the checkpoints to average is complete: {[str(tmp_path / 'checkpoint-1')]}."


@pytest.mark.parametrize("change", ["missing", "extra", "shape", "dtype"])
def test_checkpoints_whose_tensors_differ_are_refused_naming_the_tensor(tmp_path, change):
    """The same config, other tensors (a state dict edited by hand): a missing one was averaged over the checkpoints
    that hold it but divided by all of them."""
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    weights = save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    name = "model.encoder.layers.0.ffn.fc1.weight"
    shape = tuple(weights[name].shape)
    if change == "missing":
        del weights[name]
    elif change == "extra":
        weights["extra.weight"] = torch.zeros(2)
    elif change == "shape":
        weights[name] = weights[name][:-1].clone()
    else:
        weights[name] = weights[name].double()
    save_file(weights, tmp_path / "checkpoint-2" / "model.safetensors", metadata={"format": "pt"})
    second = tmp_path / "checkpoint-2"
    expected = {
        "missing": f"{second} does not hold the same tensors as the others; differing: ['{name}'].",
        "extra": f"{second} does not hold the same tensors as the others; differing: ['extra.weight'].",
        "shape": f"{second}: {name} is {(shape[0] - 1, *shape[1:])} torch.float32, elsewhere {shape} torch.float32.",
        "dtype": f"{second}: {name} is {shape} torch.float64, elsewhere {shape} torch.float32.",
    }[change]
    assert average_refused(tmp_path, ValueError) == expected


def test_a_non_float_tensor_is_kept_where_equal_and_refused_where_it_differs(tmp_path):
    for step in (1, 2):
        weights = save_trainer_checkpoint(tmp_path / f"checkpoint-{step}", seed=step)
        weights["counter"] = torch.tensor([7, 8])
        save_file(weights, tmp_path / f"checkpoint-{step}" / "model.safetensors", metadata={"format": "pt"})
    output_dir = average_checkpoints(list_checkpoints(tmp_path), tmp_path / "equal")
    assert torch.equal(load_file(output_dir / "model.safetensors")["counter"], torch.tensor([7, 8]))

    weights["counter"] = torch.tensor([7, 9])
    save_file(weights, tmp_path / "checkpoint-2" / "model.safetensors", metadata={"format": "pt"})
    assert average_refused(tmp_path, ValueError).endswith(
        "checkpoint-2: the non-float tensor counter differs from the other checkpoints'."
    )


def test_named_checkpoints_are_refused_when_missing_or_incomplete(tmp_path):
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    (tmp_path / "checkpoint-1" / "trainer_state.json").unlink()  # a model directory: no training state to check
    (tmp_path / "model").mkdir()
    assert named_checkpoints([str(tmp_path / "checkpoint-1")]) == [tmp_path / "checkpoint-1"]
    with pytest.raises(IncompleteCheckpointError, match="nowhere does not exist"):  # was "is not a directory"
        named_checkpoints([tmp_path / "checkpoint-1", tmp_path / "nowhere"])
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(IncompleteCheckpointError, match="notes.txt is not a directory"):
        named_checkpoints([tmp_path / "notes.txt"])
    with pytest.raises(IncompleteCheckpointError, match="model is incomplete: no checkpoint_complete.json, and"):
        named_checkpoints([tmp_path / "model"])


def test_directories_named_without_a_step_take_the_configuration_of_the_last_one_given(tmp_path):
    for name, seed in (("b", 0), ("a", 1)):
        save_trainer_checkpoint(tmp_path / name, seed=seed)
        (tmp_path / name / "trainer_state.json").unlink()  # model directories: no training state to check
    output_dir = average_checkpoints([tmp_path / "b", tmp_path / "a"], tmp_path / "averaged")
    record = json.loads((output_dir / "checkpoint_averaging.json").read_text())
    assert record == {"checkpoints": ["../b", "../a"], "configuration_from": "../a"}


def test_an_old_best_kept_by_rotation_is_found_at_save_steps_1_too(tmp_path):
    saves(tmp_path, [1, 4, 5, 6], best_model_checkpoint=str(tmp_path / "checkpoint-1"), save_steps=1)
    with pytest.raises(ValueError, match="deleted the saves of the 3 updates up to checkpoint-4 .saves every 1."):
        last_checkpoints(tmp_path, 4)


def test_a_best_followed_by_a_save_at_the_usual_distance_is_not_warned_of(tmp_path, caplog):
    """Where the save strategy is not recorded, only a gap longer than save_steps and the others is suspect."""
    saves(
        tmp_path,
        [100, 200, 300],
        save_strategy=None,
        best_model_checkpoint=str(tmp_path / "checkpoint-100"),
        save_steps=100,
    )
    with caplog.at_level(logging.WARNING, logger="modeling.averaging"):
        assert last_checkpoints(tmp_path, 3) == list_checkpoints(tmp_path)
    assert "if save_total_limit deleted" not in caplog.text


def test_an_unrecorded_strategy_warns_of_a_long_gap_after_the_best_naming_both(tmp_path, caplog):
    saves(
        tmp_path,
        [1000, 2000],
        save_strategy=None,
        best_model_checkpoint=str(tmp_path / "checkpoint-1000"),
        save_steps=500,
    )
    with caplog.at_level(logging.WARNING, logger="modeling.averaging"):
        last_checkpoints(tmp_path, 2)
    assert (
        f"{tmp_path / 'checkpoint-1000'}, the run's best checkpoint, is 1000 updates before checkpoint-2000 where "
        "saves came every 500" in caplog.text
    )


@pytest.mark.parametrize("damage", ["shard removed", "unreadable"])
def test_weights_that_go_missing_or_unreadable_after_listing_are_named(tmp_path, monkeypatch, damage):
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    weights = tmp_path / "checkpoint-2" / "model.safetensors"
    if damage == "shard removed":  # a sharded checkpoint rotated out between its shards
        shard = tmp_path / "checkpoint-2" / "model-00002-of-00002.safetensors"
        monkeypatch.setattr(averaging, "weight_files", lambda checkpoint: [checkpoint / "model.safetensors", shard])
        expected = f"{shard} was removed while the checkpoints were averaged"
    else:
        usable = averaging.usable_checkpoints

        def damaged_once_listed(paths):
            listed = usable(paths)
            weights.write_bytes(weights.read_bytes()[:-10])
            return listed

        monkeypatch.setattr(averaging, "usable_checkpoints", damaged_once_listed)
        expected = f"Cannot read the weights {weights}: "
    error = FileNotFoundError if damage == "shard removed" else ValueError
    assert average_refused(tmp_path, error).startswith(expected)


def test_an_old_best_after_the_oldest_checkpoint_counts_only_the_newer_saves(tmp_path, caplog):
    """Rotation kept the best at 100 and, beside it, the older 50: the saves to average are the 3 after the best."""
    saves(tmp_path, [50, 100, 400, 500, 600], best_model_checkpoint=str(tmp_path / "checkpoint-100"), save_steps=50)
    with pytest.raises(ValueError, match="average the last 3 at most"):
        last_checkpoints(tmp_path, 5)
    with caplog.at_level(logging.WARNING, logger="modeling.averaging"):
        taken = last_checkpoints(tmp_path, 5, at_most=True)
    assert taken == [tmp_path / f"checkpoint-{step}" for step in (400, 500, 600)]
    assert "averaging the last 3 only" in caplog.text


def test_the_averaged_weights_carry_the_metadata_from_pretrained_checks(tmp_path):
    """transformers refuses a safetensors file whose metadata names another format; save_pretrained writes "pt"."""
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    output_dir = average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    with safe_open(output_dir / "model.safetensors", framework="pt") as weights:
        assert weights.metadata() == {"format": "pt"}


def test_a_sharded_newest_checkpoint_leaves_no_shard_beside_the_averaged_weights(tmp_path):
    """The shards describe that checkpoint's own weights; copied, they would sit unused (and unindexed) beside
    model.safetensors, a model's size of stale weights."""
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    sharded = tmp_path / "checkpoint-2"
    model = AutoModelForSeq2SeqLM.from_pretrained(sharded)
    (sharded / "model.safetensors").unlink()
    model.save_pretrained(sharded, max_shard_size="20KB")
    assert len(list(sharded.glob("*.safetensors"))) > 1, "the model was sharded"
    output_dir = average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    record = json.loads((output_dir / "checkpoint_averaging.json").read_text())
    assert record["configuration_from"] == "../checkpoint-2", "the sharded checkpoint was averaged"
    assert [path.name for path in output_dir.glob("*.safetensors")] == ["model.safetensors"]
    assert not (output_dir / "model.safetensors.index.json").exists()


def test_an_average_whose_model_card_was_rendered_is_replaced_all_the_same(tmp_path):
    """A push renders README.md into the average; averaging again must not refuse it as a user's file."""
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    output_dir = average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    (output_dir / "README.md").write_text("# a model card\n")
    average_checkpoints(list_checkpoints(tmp_path), output_dir)
    assert not (output_dir / "README.md").exists(), "the next push renders it again"


def test_a_checkpoint_on_another_drive_is_recorded_by_its_name(tmp_path, monkeypatch):
    """On Windows, no relative path leads from one drive to another: the record names the checkpoint."""

    def other_drive(path, start):
        raise ValueError(f"path is on mount 'D:', start on mount 'C:': {path}, {start}")

    monkeypatch.setattr(averaging.os.path, "relpath", other_drive)
    assert averaging._relative(tmp_path / "checkpoint-5", tmp_path / "averaged") == "checkpoint-5"


def test_a_run_recording_no_save_interval_is_not_refused_for_its_best(tmp_path):
    """save_steps 0 in the Trainer's state says nothing of where saves came: no gap is too long for it."""
    saves(tmp_path, [100, 400, 500], best_model_checkpoint=str(tmp_path / "checkpoint-100"), save_steps=0)
    assert last_checkpoints(tmp_path, 3) == list_checkpoints(tmp_path)


def test_every_name_the_module_exports_exists():
    """`from modeling.averaging import *` fails on a name `__all__` lists that the module does not hold."""
    assert [name for name in averaging.__all__ if not hasattr(averaging, name)] == []


def test_a_directory_inside_the_newest_checkpoint_is_not_copied(tmp_path):
    """DeepSpeed's checkpoints hold their engine's states in a `global_step<N>/` directory: only files are copied,
    and a directory is neither copied nor a failure of the average."""
    save_trainer_checkpoint(tmp_path / "checkpoint-1", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-2", seed=1)
    (tmp_path / "checkpoint-2" / "global_step2").mkdir()
    torch.save({"state": "engine"}, tmp_path / "checkpoint-2" / "global_step2" / "mp_rank_00_model_states.pt")
    output_dir = average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")
    assert not (output_dir / "global_step2").exists()
    assert (output_dir / "config.json").is_file() and (output_dir / "model.safetensors").is_file()


def test_checkpoints_named_out_of_order_take_the_configuration_of_the_newest(tmp_path):
    """`--checkpoints checkpoint-1000 checkpoint-900`: the newest by step (neither the last named nor the last by
    name) gives the config, tokenizer and run records the average carries."""
    save_trainer_checkpoint(tmp_path / "checkpoint-900", seed=0)
    save_trainer_checkpoint(tmp_path / "checkpoint-1000", seed=1)
    named = named_checkpoints([tmp_path / "checkpoint-1000", tmp_path / "checkpoint-900"])
    output_dir = average_checkpoints(named, tmp_path / "averaged")
    record = json.loads((output_dir / "checkpoint_averaging.json").read_text())
    assert record == {
        "checkpoints": ["../checkpoint-1000", "../checkpoint-900"],
        "configuration_from": "../checkpoint-1000",
    }


def test_a_generation_config_that_differs_from_the_newest_checkpoints_is_warned_of_naming_the_fields(tmp_path, caplog):
    """The average decodes with the newest checkpoint's generation config: an older one's edited beam size was
    dropped without a word."""
    for step in (1, 2, 3):
        save_trainer_checkpoint(tmp_path / f"checkpoint-{step}", seed=step)
    edited = tmp_path / "checkpoint-1" / "generation_config.json"
    edited.write_text(json.dumps({**json.loads(edited.read_text()), "num_beams": 5, "transformers_version": "4.0"}))
    with caplog.at_level(logging.WARNING, logger="modeling.averaging"):
        output_dir = average_checkpoints(last_checkpoints(tmp_path, 3), tmp_path / "averaged")
    assert json.loads((output_dir / "generation_config.json").read_text())["num_beams"] == 4
    (warning,) = [record.getMessage() for record in caplog.records if "generation_config.json" in record.getMessage()]
    assert warning == (
        f"{edited} differs from checkpoint-3's in num_beams: the average decodes with the newest checkpoint's"
    )
