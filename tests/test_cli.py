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
    add_model_arguments,
    giving_up_broken_output,
    positive_int,
    reporting_on_stdout,
    silence,
    summary,
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


def test_model_arguments_require_a_model_and_take_a_revision(capsys):
    # Without --model, argparse exits with one line naming it, before the script loads anything.
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    given = parser.parse_args(["--model", "org/transformer", "--revision", "v1.0"])
    assert (given.model, given.revision) == ("org/transformer", "v1.0")
    assert parser.parse_args(["--model", "checkpoints/best"]).revision is None  # main
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "the following arguments are required: --model" in capsys.readouterr().err


def test_every_shared_flag_is_described_in_the_help():
    # `translate.py --help`: a flag without its line says nothing of what it does.
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    add_decoding_arguments(parser, chunk_lines_help="source lines translated and saved at a time")
    helps = {action.dest: action.help for action in parser._actions if action.dest != "help"}
    assert set(helps) == {"model", "revision", "max_tokens", "num_beams", "int8", "workers", "chunk_lines"}
    assert all(helps.values()), helps
    assert helps["chunk_lines"] == "source lines translated and saved at a time", "the script's own"


def test_a_scripts_description_is_the_first_line_of_its_docstring_or_none():
    assert summary("Translate lines with a model.\n\nMore about it.\n") == "Translate lines with a model."
    assert summary("Translate lines with a model.") == "Translate lines with a model."
    assert summary(None) is None  # python -OO: argparse then prints no description


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


def test_the_scripts_logging_prints_the_records_of_the_level_asked_for():
    """train.py logs at INFO on its main process (the Trainer's progress), which the root logger's default level,
    WARNING, would drop."""
    code = (
        "import logging; from modeling.cli import log_to_stderr; "
        "log_to_stderr('%(levelname)s: %(message)s', logging.INFO); "
        "logging.getLogger('modeling.x').info('step 1'); logging.getLogger('modeling.x').debug('details')"
    )
    result = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "INFO: step 1" in result.stderr and "details" not in result.stderr


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


def test_silencing_a_stream_leaves_no_descriptor_open():
    """/dev/null's own descriptor, once duplicated onto the stream's, is closed: not one left open per stream."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w") as raw:
        free = os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor, which the next open takes
        os.close(free)
        silence(raw)
        after = os.open(os.devnull, os.O_RDONLY)
        os.close(after)
    assert after == free


def test_a_flush_goes_through_to_the_stream_and_one_that_fails_gives_it_up():
    """A progress bar's line, ended with "\\r" rather than a newline, shows when the bar flushes it."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)  # nothing there: BlockingIOError rather than a test that hangs
    with open(write_end, "w") as raw:  # block-buffered: the writes wait for a flush
        stream = GivingUpStream(raw, "standard error", warn=False)
        assert stream.write("step 1/10\r") == len("step 1/10\r")
        stream.flush()
        assert os.read(read_end, 100) == b"step 1/10\r"
        os.close(read_end)
        stream.write("step 2/10\r")
        assert stream.error is None, "buffered"
        stream.flush()
        assert stream.given_up and isinstance(stream.error, BrokenPipeError)


def test_what_cannot_be_flushed_at_the_end_gives_the_stream_up():
    """`--help | head -0`: the help, in the buffer, fails only when flushed at the end."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w") as raw:
        stream = GivingUpStream(raw, "standard output", warn=False)
        stream.write("usage: translate.py [-h] --model MODEL\n")
        assert stream.error is None, "buffered"
        stream.settle()
        assert stream.given_up and isinstance(stream.error, BrokenPipeError)
        assert os.write(write_end, b"direct") == len(b"direct"), "the descriptor writes into /dev/null"


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


class FailingInTurn(FullDisk):
    """A standard output whose writes and flushes fail with these errors in turn (the last one from then on): a
    file on a full disk, then `| tee` killed."""

    def __init__(self, *codes: int):
        self.codes = list(codes)

    def write(self, text: str) -> int:
        self.fail()

    def flush(self) -> None:
        self.fail()

    def fail(self):
        code = self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]
        raise OSError(code, os.strerror(code))


NO_SPACE = "error: cannot write to standard output: [Errno 28] No space left on device"


@pytest.mark.parametrize(
    "stream, code",
    [
        (FullDisk(), NO_SPACE),
        (GoneReader(), 1),
        # The first failure is the one said: lines lost to the full disk, not the reader gone afterwards (in the
        # print, or in the flush at the end after the print's two writes).
        (FailingInTurn(errno.ENOSPC, errno.EPIPE), NO_SPACE),
        (FailingInTurn(errno.ENOSPC, errno.ENOSPC, errno.EPIPE), NO_SPACE),
    ],
)
def test_a_report_that_cannot_be_printed_leaves_the_work_to_finish_then_exits_in_one_line(
    stream, code, monkeypatch, caplog
):
    """A script's print raised, a traceback before the rest of its work (evaluate.py's metrics file, push_to_hub.py's
    push); a reader gone exits quietly, as Unix tools do."""
    monkeypatch.setattr(sys, "stdout", stream)
    done = []
    with caplog.at_level(logging.WARNING, logger="modeling.cli"), pytest.raises(SystemExit) as exit_info:
        with reporting_on_stdout():
            print("Wrote the model card")
            done.append("pushed")
    assert done == ["pushed"] and exit_info.value.code == code
    assert sys.stdout is stream
    assert caplog.messages == [], "said in the exit's line only"


def test_a_report_with_standard_output_closed_leaves_the_work_to_finish(monkeypatch):
    """pythonw, or a service started with its standard streams closed: sys.stdout and sys.stderr are None, and
    print() writes nothing."""
    monkeypatch.setattr(sys, "stdout", None)
    monkeypatch.setattr(sys, "stderr", None)
    done = []
    with reporting_on_stdout():
        print("Wrote the model card")
        done.append("pushed")
    assert done == ["pushed"] and (sys.stdout, sys.stderr) == (None, None)
