"""Tests of modeling/cli.py: counts below one and non-integers are argparse errors naming the flag; translate.py and
evaluate.py get the same decoding flags and defaults; the scripts' logging prints each record once; a log stream
that cannot be written is given up rather than the run."""

import argparse
import errno
import io
import logging
import os
import subprocess
import sys

import pytest
from helpers import subprocess_env

from modeling.cli import (
    GivingUpStream,
    add_decoding_arguments,
    giving_up_broken_output,
    positive_int,
    reporting_on_stdout,
)


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


def test_a_stream_whose_reader_is_gone_is_given_up_and_its_descriptor_silenced(caplog):
    """`train | tee log` with tee killed: every write raises EPIPE. Given up, the stream drops its writes, and
    /dev/null takes its descriptor, so that what writes to it directly (a logging handler made before, the flush at
    exit) cannot fail either."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w", buffering=1) as raw:
        stream = GivingUpStream(raw, "standard output")
        with caplog.at_level(logging.WARNING, logger="modeling.cli"):
            assert stream.write("{'loss': 3.2}\n") == len("{'loss': 3.2}\n")
            stream.write("more\n")
            stream.flush()
        assert isinstance(stream.error, BrokenPipeError) and stream.fileno() == write_end
        assert os.write(write_end, b"direct") == len(b"direct"), "the descriptor writes into /dev/null"
        raw.write("the raw stream too\n")
    assert caplog.messages == ["Not writing to standard output any more, the run goes on: [Errno 32] Broken pipe"], (
        "said once"
    )


class TeeToAGoneLog:
    """A caller's `sys.stdout` that writes to the terminal and to a log whose reader is gone (EPIPE), and whose
    fileno() is the terminal's, as such tees' are."""

    def __init__(self, terminal: int):
        self.terminal = terminal

    def write(self, text: str) -> int:
        os.write(self.terminal, text.encode())
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self.terminal


def test_a_callers_stream_given_up_leaves_the_descriptor_it_names_alone():
    """The tee's log failed, and /dev/null took over the descriptor of its terminal, which was fine."""
    screen, terminal = os.pipe()
    try:
        stream = GivingUpStream(TeeToAGoneLog(terminal), "standard output", warn=False)
        stream.write("{'loss': 3.2}\n")
        assert stream.given_up
        os.write(terminal, b"still on the terminal\n")
        assert os.read(screen, 1000) == b"{'loss': 3.2}\nstill on the terminal\n"
    finally:
        os.close(screen)
        os.close(terminal)


class FullDisk:
    """A log file on a full disk, without a descriptor (ENOSPC on every write)."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "no descriptor")

    def isatty(self) -> bool:
        return False


def test_the_scripts_standard_streams_are_given_up_within_the_block_only(caplog):
    before = sys.stdout, sys.stderr
    with giving_up_broken_output():
        assert isinstance(sys.stdout, GivingUpStream) and isinstance(sys.stderr, GivingUpStream)
        sys.stdout.stream = FullDisk()
        print("{'loss': 3.2}")
        assert sys.stdout.error.errno == errno.ENOSPC and not sys.stdout.isatty()
    assert (sys.stdout, sys.stderr) == before
    assert (
        "Could not write to standard output, the run goes on, writing to it when it can: [Errno 28] No space left on "
        "device"
    ) in caplog.messages


class DiskFullForAWhile(io.StringIO):
    """A log file on a disk full until `full` is false: a checkpoint saved before the oldest one is deleted."""

    full = True

    def write(self, text: str) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(text)


def test_a_log_on_a_disk_full_for_a_while_is_written_again_once_the_disk_has_room(caplog, monkeypatch):
    """A multi-day run whose disk was full for a moment: given up on the first ENOSPC, its log got nothing more
    for the rest of the run, the disk free again."""
    log = DiskFullForAWhile()
    monkeypatch.setattr(sys, "stderr", log)
    with caplog.at_level(logging.WARNING, logger="modeling.cli"), giving_up_broken_output():
        sys.stderr.write("lost\n")
        sys.stderr.write("lost too\n")
        log.full = False
        sys.stderr.write("{'loss': 3.2}\n")
    assert log.getvalue() == "{'loss': 3.2}\n"
    assert caplog.messages == [
        "Could not write to standard error, the run goes on, writing to it when it can: [Errno 28] No space left on "
        "device"
    ], "said once"


# A script's `--help`: argparse prints it, then exits (SystemExit) within the block.
HELP_WITHIN = """
import argparse, sys
from modeling.cli import giving_up_broken_output, reporting_on_stdout
with {}():
    argparse.ArgumentParser(description="what it does").parse_args(["--help"])
"""


@pytest.mark.parametrize("block", ["reporting_on_stdout", "giving_up_broken_output"])
def test_a_help_whose_reader_is_gone_ends_quietly(block, tmp_path):
    """`script --help | head -0`: the help, left in the buffer by argparse's exit, was flushed only at exit:
    "Exception ignored in: <_io.TextIOWrapper name='<stdout>'> BrokenPipeError", exit code 120."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    command = [sys.executable, "-c", HELP_WITHIN.format(block)]
    env = subprocess_env()
    env.pop("PYTHONUNBUFFERED", None)
    result = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    os.close(write_end)
    assert (result.returncode, result.stderr) == (0, "")


class GoneReader(FullDisk):
    """A pipe whose reader is gone (`| head` done reading): EPIPE on every write."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


@pytest.mark.parametrize(
    "stream, code",
    [(FullDisk(), "error: cannot write to standard output: [Errno 28] No space left on device"), (GoneReader(), 1)],
)
def test_a_report_that_cannot_be_printed_leaves_the_work_to_finish_then_exits_in_one_line(stream, code, monkeypatch):
    """A script's print raised, a traceback before the rest of its work (evaluate.py's metrics file, push_to_hub.py's
    push); a reader gone exits quietly, as Unix tools do."""
    monkeypatch.setattr(sys, "stdout", stream)
    done = []
    with pytest.raises(SystemExit) as exit_info:
        with reporting_on_stdout():
            print("Wrote the model card")
            done.append("pushed")
    assert done == ["pushed"] and exit_info.value.code == code
    assert sys.stdout is stream
