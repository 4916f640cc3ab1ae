"""What the command-line scripts share: argparse's type for counts, the model to load, the decoding options of
`scripts/translate.py` and `scripts/evaluate.py`, so that they take the same flags with the same checks, how
they log, and what they do when their standard output or error cannot be written any more."""

import argparse
import errno
import io
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from huggingface_hub.utils import logging as hub_logging

logger = logging.getLogger(__name__)


def summary(docstring: str | None) -> str | None:
    """A script's description for argparse: the first line of its docstring, or None under `python -OO` (or
    PYTHONOPTIMIZE=2), which strips docstrings (`__doc__.split` was an AttributeError before any flag was read)."""
    return docstring.split("\n")[0] if docstring else None


def positive_int(text: str) -> int:
    """argparse type for a count that must be at least 1; argparse's error names the flag ("argument --workers:
    must be at least 1, got 0") before the script loads anything."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model and --revision: which checkpoint a script loads (`modeling.translation.load_model_and_tokenizer`)."""
    parser.add_argument("--model", required=True, help="model directory or Hub repo id")
    parser.add_argument("--revision", help="of a Hub repo id: the branch, tag or commit to load (default: main)")


def add_decoding_arguments(parser: argparse.ArgumentParser, chunk_lines_help: str) -> None:
    """--max-tokens, --num-beams, --int8, --workers and --chunk-lines: how a script batches, decodes and saves."""
    parser.add_argument("--max-tokens", type=positive_int, default=4096, help="padded source tokens per batch")
    parser.add_argument("--num-beams", type=positive_int, help="beam size (default: the model's generation config, 4)")
    parser.add_argument("--int8", action="store_true", help="CPU int8 linear layers (modeling.quantization)")
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="CPU: batches decoded at once, sharing torch's threads (default 1)",
    )
    parser.add_argument("--chunk-lines", type=positive_int, default=10_000, help=chunk_lines_help)


def log_to_stderr(format: str, level: int | None = None) -> None:
    """`logging.basicConfig(format=format, level=level)`, with huggingface_hub's records printed once: it prints them
    through a handler of its own and passes them on to the root logger's as well (each retry warning twice)."""
    logging.basicConfig(format=format, level=level)
    hub = hub_logging.get_logger()  # its root logger, given its handler when huggingface_hub was imported
    if hub.handlers:
        hub.propagate = False


def silence(stream: TextIO) -> None:
    """/dev/null in place of `stream`'s file descriptor, once it cannot be written: what is buffered or written there
    later (the interpreter's flush at exit, logging handlers, C code) goes nowhere rather than failing again (at exit:
    "Exception ignored" and exit code 120).

    A file's own stream only (`io.TextIOWrapper`, as Python's are): the `fileno()` of a caller's object may be
    another file's, one still alive (a tee's of the terminal, whose log file failed; a notebook's stream's of the
    kernel's own output), which /dev/null took over."""
    if not isinstance(stream, io.TextIOWrapper):
        return
    try:
        descriptor = stream.fileno()
    except (OSError, ValueError):  # none (a caller's stream): its writes fail as they did
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, descriptor)
    os.close(null)


# The errors after which a later write may go through: a disk (or a quota) full for a while, until a checkpoint is
# rotated or another job's files are deleted; a terminal left non-blocking by another program, full until it
# drains. Given up on the first of these, a multi-day run logged nothing more once the disk had room again.
PASSING_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EAGAIN})


class GivingUpStream:
    """A text stream that gives itself up, rather than the run, when a write to it fails: the terminal of an ssh
    session that dropped (EIO), a `| tee log` killed or interrupted with the run (EPIPE). Its further writes are
    dropped, and /dev/null takes the place of its file descriptor, for what writes there without this wrapper:
    logging handlers made before it, C code, the interpreter's flush at exit. Raised, the error of a progress bar or
    of the Trainer's `print` of the logs ended a run without a checkpoint, losing the updates since the last one
    (also on the way to the checkpoint of a SIGHUP or of Ctrl-C on `train | tee log`).

    After an error that may pass (`PASSING_WRITE_ERRORS`: a log file on a full disk or quota, a non-blocking
    terminal) only that write is dropped, and the next ones are tried; `settle()`, at the end, gives the stream up
    if it still cannot be written."""

    def __init__(self, stream: TextIO, name: str, *, warn: bool = True):
        self.stream, self.name, self.warn = stream, name, warn
        self.error: OSError | None = None  # that of the first write that failed: something was lost
        self.given_up = False
        self._warned_passing = False

    def write(self, text: str) -> int:
        if not self.given_up:
            try:
                return self.stream.write(text)
            except OSError as error:
                self._failed(error)
        return len(text)

    def flush(self) -> None:
        if not self.given_up:
            try:
                self.stream.flush()
            except OSError as error:
                self._failed(error)

    def settle(self) -> None:
        """At the end: flush the stream, giving it up if what it holds cannot be written. Else the interpreter's
        flush at exit failed on it, "Exception ignored" and exit code 120: after a write that failed, and after a
        SystemExit that left it unflushed (`--help | head -1`)."""
        if not self.given_up:
            try:
                self.stream.flush()
            except OSError as error:
                self.error = self.error or error
                self.given_up = True
                silence(self.stream)

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self.stream, name)

    def _failed(self, error: OSError) -> None:
        self.error = self.error or error
        if error.errno not in PASSING_WRITE_ERRORS:
            self._give_up(error)
        elif self.warn and not self._warned_passing:
            self._warned_passing = True  # first: the warning may go to this very stream
            logger.warning("Could not write to %s, the run goes on, writing to it when it can: %s", self.name, error)

    def _give_up(self, error: OSError) -> None:
        self.given_up = True
        silence(self.stream)
        if self.warn:
            logger.warning("Not writing to %s any more, the run goes on: %s", self.name, error)


@contextmanager
def giving_up_broken_output(*, stdout: bool = True) -> Iterator[None]:
    """Within the block, standard error, and standard output unless `stdout` is false, are `GivingUpStream`
    streams: for logs and progress bars, which can be lost without losing the work, not for a script's result. (A
    log file on a full disk stopped translate.py and evaluate.py before any work: transformers' bar of the weights
    loaded raised.)"""
    names = {"stderr": "standard error", **({"stdout": "standard output"} if stdout else {})}
    replaced = {attribute: getattr(sys, attribute) for attribute in names}
    wrappers = {  # None: started with it closed
        attribute: GivingUpStream(stream, names[attribute])
        for attribute, stream in replaced.items()
        if stream is not None
    }
    for attribute, wrapper in wrappers.items():
        setattr(sys, attribute, wrapper)
    try:
        yield
    finally:
        for wrapper in wrappers.values():
            wrapper.settle()
        for attribute, stream in replaced.items():
            setattr(sys, attribute, stream)


@contextmanager
def reporting_on_stdout() -> Iterator[None]:
    """For a script that prints what it did (and whose results are files): within the block, standard output is a
    `GivingUpStream` stream, so that a failed print leaves the work to finish (evaluate.py's metrics file,
    push_to_hub.py's push); after it, the failure exits as Unix tools do: quietly with 1 where the reader is gone
    (`| head`), else with one line. A print raised there: a traceback, after or instead of the work. Standard error
    is given up as in `giving_up_broken_output`."""
    with giving_up_broken_output(stdout=False):
        if sys.stdout is None:  # started with it closed: print() writes nothing
            yield
            return
        stream = GivingUpStream(sys.stdout, "standard output", warn=False)
        sys.stdout = stream
        try:
            yield
        finally:
            stream.settle()  # a pipe's or a file's: buffered, its writes fail here
            sys.stdout = stream.stream
        if isinstance(stream.error, BrokenPipeError):
            sys.exit(1)
        if stream.error is not None:
            sys.exit(f"error: cannot write to standard output: {stream.error}")
