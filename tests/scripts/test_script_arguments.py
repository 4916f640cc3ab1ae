"""Counts that make no sense are refused by every script before it loads anything; every script starts under
`python -OO`."""

import subprocess
import sys

import pytest
from helpers import SCRIPTS, run_script, subprocess_env

# The scripts load local datasets: their Arrow files go to a temporary cache, not the user's.
pytestmark = pytest.mark.usefixtures("datasets_cache")


@pytest.mark.parametrize(
    ("script", "flag"),
    [
        ("evaluate.py", "--limit"),
        ("evaluate.py", "--max-tokens"),
        ("evaluate.py", "--num-beams"),
        ("evaluate.py", "--workers"),
        ("evaluate.py", "--chunk-lines"),
        ("translate.py", "--max-tokens"),
        ("translate.py", "--num-beams"),
        ("translate.py", "--workers"),
        ("translate.py", "--chunk-lines"),
    ],
)
def test_scripts_refuse_counts_below_one_before_loading_anything(script, flag, tmp_path, monkeypatch, capsys):
    languages = ["--source-lang", "en", "--target-lang", "de", "--data-dir", tmp_path]
    extra = languages if script == "evaluate.py" else ["a cat."]
    with pytest.raises(SystemExit) as exit_info:  # the model directory does not exist: not reached
        run_script(script, "--model", tmp_path / "missing", flag, "0", *extra, monkeypatch=monkeypatch)
    assert exit_info.value.code == 2
    assert f"argument {flag}: must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["evaluate.py", "translate.py"])
def test_scripts_refuse_a_count_that_is_not_an_integer(script, tmp_path, monkeypatch, capsys):
    languages = ["--source-lang", "en", "--target-lang", "de", "--data-dir", tmp_path]
    extra = languages if script == "evaluate.py" else ["a cat."]
    with pytest.raises(SystemExit) as exit_info:
        run_script(script, "--model", tmp_path / "missing", "--workers", "two", *extra, monkeypatch=monkeypatch)
    assert exit_info.value.code == 2
    assert "argument --workers: 'two' is not an integer" in capsys.readouterr().err


# Each script's --help, in one interpreter: its exit code, or the exception that ended it.
HELP_OF_EVERY_SCRIPT = """
import runpy, sys
for script in sys.argv[1:]:
    sys.argv = [script, "--help"]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        print(exit.code, file=sys.stderr)
    except Exception as error:
        print(f"{script}: {error!r}", file=sys.stderr)
"""


def test_every_script_starts_under_python_OO_which_strips_docstrings():
    """PYTHONOPTIMIZE=2 (some production images set it) strips docstrings, argparse's description here: seven of
    the scripts ended in `AttributeError: 'NoneType' object has no attribute 'split'` before reading a flag."""
    scripts = sorted(str(path) for path in SCRIPTS.glob("*.py"))
    command = [sys.executable, "-OO", "-c", HELP_OF_EVERY_SCRIPT, *scripts]
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert result.stderr.splitlines()[-len(scripts) :] == ["0"] * len(scripts), result.stderr[-3000:]
    assert result.stdout.count("usage:") == len(scripts)
