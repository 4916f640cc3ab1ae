"""Tests of modeling/cli.py: counts below one and non-integers are argparse errors naming the flag; translate.py and
evaluate.py get the same decoding flags and defaults; the scripts' logging prints each record once."""

import argparse
import subprocess
import sys

import pytest
from helpers import subprocess_env

from modeling.cli import add_decoding_arguments, positive_int


def test_positive_int_takes_counts_and_refuses_the_rest():
    assert positive_int("1") == 1 and positive_int("4096") == 4096
    for text, message in [("0", "must be at least 1, got 0"), ("-3", "got -3"), ("4.5", "'4.5' is not an integer")]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            positive_int(text)


def test_decoding_arguments_and_their_defaults(capsys):
    parser = argparse.ArgumentParser()
    add_decoding_arguments(parser, chunk_lines_help="lines at a time")
    defaults = vars(parser.parse_args([]))
    assert defaults == {"max_tokens": 4096, "num_beams": None, "int8": False, "workers": 1, "chunk_lines": 10_000}
    given = parser.parse_args(["--num-beams", "5", "--int8", "--workers", "2", "--chunk-lines", "7"])
    assert (given.num_beams, given.int8, given.workers, given.chunk_lines) == (5, True, 2, 7)
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-tokens", "0"])
    assert "argument --max-tokens: must be at least 1, got 0" in capsys.readouterr().err


def test_the_scripts_logging_prints_a_huggingface_hub_warning_once():
    """huggingface_hub prints its records through a handler of its own and passed them on to the root logger's,
    which `logging.basicConfig` gives one: each of a download's retry warnings came twice. (A process of its own:
    pytest's handlers make `basicConfig` do nothing.)"""
    code = (
        "import logging; from modeling.cli import log_to_stderr; log_to_stderr('%(levelname)s: %(message)s'); "
        "import huggingface_hub.utils._http; "
        "logging.getLogger('huggingface_hub.utils._http').warning('retrying in 1s'); "
        "logging.getLogger('modeling.x').warning('ours')"
    )
    result = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("retrying in 1s") == 1
    assert "WARNING: ours" in result.stderr
