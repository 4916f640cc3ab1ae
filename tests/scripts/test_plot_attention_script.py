"""scripts/plot_attention.py end to end on a tiny checkpoint, in this process."""

import shutil

import pytest
from helpers import run_script, script_error, training_run_holding

# The scripts load local datasets: their Arrow files go to a temporary cache, not the user's.
pytestmark = pytest.mark.usefixtures("datasets_cache")


def test_plot_attention_writes_heatmaps_and_checks_indices(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    model_dir, _, _ = tiny_checkpoint
    common = ["--model", model_dir, "--source", "the small dog sees a ball."]
    run_script("plot_attention.py", *common, "--output", tmp_path / "all.png", monkeypatch=monkeypatch)
    assert capsys.readouterr().out.startswith("target: ")
    assert (tmp_path / "all.png").read_bytes().startswith(b"\x89PNG")

    one = ["--target", "der kleine Hund.", "--layer", "1", "--head", "3", "--kinds", "cross"]
    run_script("plot_attention.py", *common, *one, "--output", tmp_path / "one.png", monkeypatch=monkeypatch)
    assert (tmp_path / "one.png").read_bytes().startswith(b"\x89PNG")

    message = script_error("plot_attention.py", *common, "--target", "x", "--head", "9", monkeypatch=monkeypatch)
    assert message == "error: head 9 does not exist: this attention has heads 0 to 3."


def test_a_directory_given_as_the_output_is_named_as_one(tiny_checkpoint, tmp_path, monkeypatch):
    """Before, once drawn: "[Errno 21] Is a directory: '.../.plots.tmp-2708-bc3a828e' -> '.../plots'"."""
    model_dir, _, _ = tiny_checkpoint
    (tmp_path / "plots").mkdir()
    flags = ["--model", model_dir, "--source", "a dog.", "--output", tmp_path / "plots"]
    message = script_error("plot_attention.py", *flags, monkeypatch=monkeypatch)
    assert message == f"error: cannot write {tmp_path / 'plots'}: it is a directory; give a file name"


@pytest.mark.parametrize("name", ["attention.v2", "attention.png.gz"])
def test_an_output_without_an_image_format_is_refused_before_the_model_is_loaded(tmp_path, monkeypatch, name):
    """A .gz name was refused as "the output is plain text", which a plot is not."""
    flags = ["--model", tmp_path / "absent", "--source", "a dog.", "--output", tmp_path / name]
    message = script_error("plot_attention.py", *flags, monkeypatch=monkeypatch)
    suffix = name.rsplit(".", 1)[1]
    assert message.startswith(f"error: cannot write {tmp_path / name}: matplotlib draws no .{suffix} files; end the")


def test_an_output_inside_a_checkpoint_of_a_run_still_training_is_refused(tiny_checkpoint, tmp_path, monkeypatch):
    checkpoint = tmp_path / "run" / "checkpoint-8"
    shutil.copytree(tiny_checkpoint[0], checkpoint)
    with training_run_holding(checkpoint.parent) as holder:
        flags = ["--model", checkpoint, "--source", "a dog.", "--target", "x", "--output", checkpoint / "maps.png"]
        message = script_error("plot_attention.py", *flags, monkeypatch=monkeypatch)
    assert message == (
        f"error: --output {checkpoint / 'maps.png'} lies inside {checkpoint}, which the training run in "
        f"{checkpoint.parent} ({holder}) deletes when it rotates its checkpoints: write it outside that directory"
    )
