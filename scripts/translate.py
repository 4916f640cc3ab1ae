"""Translate text with a saved or Hub model: one output line per input line, in order, empty lines kept, in UTF-8.

    python scripts/translate.py --model runs/base_en_de/averaged "The house is small." "Hello!"
    python scripts/translate.py --model you/transformer-base --input-file news.en --output-file news.de
    echo "The house is small." | python scripts/translate.py --model runs/base_en_de/averaged

Decoding defaults to the model's generation config (the paper's beam 4, GNMT length penalty, source + 50). A file
or stdin is translated --chunk-lines lines at a time (memory stays that of one chunk): to stdout each chunk as it is
done; to --output-file through a hidden partial file, so that after a kill the same command resumes after the last
chunk written (`modeling.translation.translate_file`), and the output file appears only when complete.
"""

import argparse
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from modeling.checkpoints import check_outside_live_checkpoints
from modeling.cli import (
    add_decoding_arguments,
    add_model_arguments,
    giving_up_broken_output,
    log_to_stderr,
    reporting_on_stdout,
    silence,
    summary,
)
from modeling.files import check_distinct_outputs, check_writable, iter_lines, reads_once, write_text
from modeling.quantization import quantize_int8
from modeling.translation import (
    TranslationInProgressError,
    as_lines,
    load_model_and_tokenizer,
    model_files,
    partial_translation_path,
    translate,
    translate_file,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    add_model_arguments(parser)
    parser.add_argument("text", nargs="*", help="sentences to translate (default: --input-file, else stdin)")
    parser.add_argument("--input-file", help="one sentence per line, plain, gzip, xz or bzip2 (-: stdin)")
    parser.add_argument("--output-file", help="where to write the translations (default, or -: stdout)")
    add_decoding_arguments(parser, chunk_lines_help="lines read, sorted and saved at a time")
    args = parser.parse_args()
    if args.text and args.input_file:
        parser.error("give sentences as arguments or --input-file, not both")
    if args.output_file == "-":  # as --input-file - reads stdin
        args.output_file = None
    return args


def write_stdout_in_utf8() -> None:
    """Translations go to standard output in UTF-8, the encoding the input is read in and --output-file written in,
    whatever the locale's: in one whose encoding lacks a character of a translation (ASCII under PYTHONUTF8=0,
    Latin-1 and German quotes, Windows' cp1252 redirected to a file) the run ended in `'ascii' codec can't encode
    character`, the chunk it had translated lost."""
    if hasattr(sys.stdout, "reconfigure"):  # not where a caller replaced it with a stream of its own
        sys.stdout.reconfigure(encoding="utf-8")


class StandardOutputError(Exception):
    """The translations could not be written to standard output (its `OSError` is the cause)."""


class TranslationsToStandardOutput:
    """Standard output while the translations are written to it: its errors are raised as `StandardOutputError`,
    told apart from the input's and the model's, which are OSErrors too; a reader gone (BrokenPipeError) stays what
    it is. Guessed by flushing again, a write that raised at once (a chunk longer than the buffer, or
    PYTHONUNBUFFERED=1, which many Docker images set) was "error: [Errno 28] No space left on device", no file
    named."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> int:
        with self._told_apart():
            return self.stream.write(text)

    def flush(self) -> None:
        with self._told_apart():
            self.stream.flush()

    def __getattr__(self, name: str):  # fileno, encoding, ...: the stream's own
        return getattr(self.stream, name)

    @contextmanager
    def _told_apart(self) -> Iterator[None]:
        try:
            yield
        except BrokenPipeError:
            raise
        except OSError as error:
            raise StandardOutputError(error) from error


def main() -> None:
    with reporting_on_stdout():  # `--help | head -1`: quietly, where its flush at exit raised
        args = parse_args()
    write_stdout_in_utf8()
    log_to_stderr("%(levelname)s: %(message)s")
    logging.getLogger("modeling").setLevel(logging.INFO)  # resuming a translation, or starting it over
    source = args.input_file or "-"
    try:  # the input and the destination first: a mistake in either is named before any model is loaded
        if not args.text and source == "-" and sys.stdin is None:  # `<&-` (cron, a service): a traceback at the end
            raise ValueError("standard input is closed, where the sentences are read from: give --input-file")
        if not args.text and not reads_once(source):  # a pipe's first line, read here, would be lost to the model
            next(iter_lines(source), None)  # opens it and decodes its first line
        if args.output_file:
            check_writable(args.output_file)
            check_outside_live_checkpoints(args.output_file, "--output-file")
            inputs = {} if args.text else {"--input-file": source}
            check_distinct_outputs({"--output-file": args.output_file}, {**inputs, **model_files(args.model)})
        elif sys.stdout is None:  # started with `>&-`: the translations were an AttributeError, once all done
            raise ValueError("standard output is closed, where the translations go: give --output-file")
        model, tokenizer = load_model_and_tokenizer(
            args.model, revision=args.revision, device="cpu" if args.int8 else None
        )
        if args.int8:
            model = quantize_int8(model)
    except (ImportError, OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    settings = {"max_tokens": args.max_tokens, "num_beams": args.num_beams, "workers": args.workers}
    standard_output = sys.stdout
    if not args.output_file:
        sys.stdout = TranslationsToStandardOutput(standard_output)
    try:
        if args.text:
            output = as_lines(translate(model, tokenizer, args.text, **settings))
            if args.output_file:  # atomically: a failure (a full disk) leaves the old file as it was
                write_text(args.output_file, output)
            else:
                sys.stdout.write(output)
                sys.stdout.flush()  # here, not at exit: its error there was "Exception ignored" and exit code 120
        else:
            translate_file(
                model,
                tokenizer,
                source,
                args.output_file,
                chunk_lines=args.chunk_lines,
                progress=sys.stderr.isatty(),
                **settings,
            )
    except BrokenPipeError:  # the reader stopped (`| head`): stop quietly, as Unix tools do
        silence(standard_output)
        sys.exit(1)
    except StandardOutputError as error:  # a full disk under `> out.de`, a terminal gone
        silence(standard_output)
        sys.exit(f"error: cannot write the translations to standard output: {error}")
    except (OSError, ValueError, TranslationInProgressError) as error:
        sys.exit(f"error: {error}")
    except KeyboardInterrupt:
        if args.output_file and not args.text:  # sentences given as arguments are written whole or not at all
            sys.exit(
                f"interrupted: what was translated is kept in {partial_translation_path(args.output_file)}; "
                "the same command resumes after it"
            )
        raise
    finally:
        if isinstance(sys.stdout, TranslationsToStandardOutput):
            sys.stdout = sys.stdout.stream


if __name__ == "__main__":
    with giving_up_broken_output(stdout=False):  # logs and progress bars, not the translations
        main()
