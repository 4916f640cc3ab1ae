"""Train the Transformer with the recipe of Vaswani et al. (2017), or fine-tune one (see modeling/training.py).

    python scripts/train.py --preset tiny --data-dir ../shared/data/multi30k --source-lang en --target-lang de \\
        --output-dir runs/tiny
    python scripts/train.py configs/train/base_en_de.yaml
    accelerate launch --config_file configs/accelerate/8gpu_bf16.yaml scripts/train.py configs/train/base_en_de.yaml
    python scripts/train.py configs/train/base_en_de.yaml --resume_from_checkpoint last   # first launch and requeues

Every `Seq2SeqTrainingArguments` flag works (`--max_steps`, `--save_steps`, `--bf16`, ...), with dashes or
underscores. The preset supplies the defaults of the paper's recipe; the keys of a JSON / YAML file given as the
first argument override them, and flags after it override the file.

Exit codes: 0 when training finished; 75 (EX_TEMPFAIL, "try again later") when a signal (SIGTERM, SIGINT,
SIGUSR1, or SIGHUP: its terminal hung up) stopped it with a complete checkpoint, so that the same command resumes it
(OUTPUT_DIR/preempted.json says the same where a launcher such as torchrun turns the workers' 75 into its own 1); 1
otherwise, with an `error:` line (a traceback for what no check foresaw). A second SIGINT or SIGTERM (not a launcher's
copy of the first) stops it at once, without a checkpoint: the process ends by that signal (130 or 143 in a shell),
as it does by any of them during the push to the Hub when no checkpoint holds the last update (with one, a signal
stops the push with 75 and the requeue pushes again).
"""

import signal
import sys
import time

# modeling.callbacks.DUPLICATE_SIGNAL_SECONDS, which cannot be imported before torch: a launcher (torchrun, srun)
# forwards the signal it got to workers that may have got it too.
DUPLICATE_SIGNAL_SECONDS = 1.0


class SignalsAtLaunch:
    """Keeps the first preemption signal that comes while the libraries load (importing torch and transformers
    takes 5-9 s on a busy node), for `PreemptionCallback`, which takes it over as received: the run then stops
    before training, with preempted.json and exit code 75. Without it, the signal's default action killed the
    launch (143, no record), which README's requeue loop reports as a failure.

    A second SIGINT or SIGTERM meanwhile (another one, or the same more than a second after the first) puts the
    replaced handlers back and is raised again, as `PreemptionCallback` does: an impatient user gets out at once
    (Ctrl-C twice), also from a load that hangs or a caller that goes on after an import failed (IPython's `%run`).
    After a SIGHUP, the first SIGINT or SIGTERM is no second one, as there."""

    def __init__(self, signals: tuple[signal.Signals, ...]) -> None:
        self.received: signal.Signals | None = None
        self.received_at = 0.0  # by time.monotonic()
        self.replaced = {  # what the process was started ignoring stays ignored, as PreemptionCallback leaves it
            sig: signal.signal(sig, self) for sig in signals if signal.getsignal(sig) is not signal.SIG_IGN
        }

    def __call__(self, signum: int, frame: object) -> None:
        received, now = signal.Signals(signum), time.monotonic()
        if self.received is None:
            self.received, self.received_at = received, now
            return
        duplicate = received == self.received and now - self.received_at < DUPLICATE_SIGNAL_SECONDS
        if duplicate or received not in (signal.SIGINT, signal.SIGTERM):
            return
        if self.received == signal.SIGHUP:  # no user's second: the system ending a hung-up session's processes
            self.received, self.received_at = received, now
            return
        self.release()
        signal.raise_signal(received)

    def release(self) -> None:
        """Put back the handlers it replaced where it is still in place (no callback took over: the run failed
        before training), so that a caller that goes on (IPython's `%run`, a test) gets its own back."""
        for sig, handler in self.replaced.items():
            if signal.getsignal(sig) is self:
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


# Before the imports below, and only in the process that runs this file (not one that imports it); the signals
# are modeling.callbacks.PREEMPTION_SIGNALS, which cannot be imported before torch.
SIGNALS_AT_LAUNCH = (
    SignalsAtLaunch((signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)) if __name__ == "__main__" else None
)

import argparse
import logging
import os
import traceback
import typing

from transformers import HfArgumentParser

from modeling.arguments import DataArguments, ModelArguments, TranslationTrainingArguments
from modeling.callbacks import PREEMPTION_SIGNALS, ignore_signals_at_exit, ignored, leave_process_group
from modeling.cli import giving_up_broken_output, log_to_stderr, reporting_on_stdout
from modeling.config_files import ARGUMENT_GROUPS, read_config_file
from modeling.presets import get_preset
from modeling.trainer import TrainingDiverged
from modeling.training import TrainingPreempted, lost_process_message, train

CONFIG_SUFFIXES = (".json", ".yaml", ".yml")  # in any case: RUN.YAML was "not used by the HfArgumentParser"
EXIT_PREEMPTED = 75  # EX_TEMPFAIL in sysexits.h: a temporary failure, the same command may be retried

# The arguments that move the preset's defaults of checkpoint rotation: see TrainingPreset.training_defaults
TIED_TO_THE_PRESET = (
    "save_total_limit",
    "average_last_checkpoints",
    "metric_for_best_model",
    "load_best_model_at_end",
)
# The preset's tokens_per_update derives the micro-batches per update: a user who gives their number instead means
# it, by a flag whatever the number, in a config file unless it is 1 (Hugging Face's default, which configs copied
# from elsewhere spell out). Flags replace the file's choice, as they replace its other values.
ACCUMULATION = ("gradient_accumulation_steps", "tokens_per_update")


class ProbeParser(HfArgumentParser):
    """The script's parser without --help, raising its errors rather than printing them: a first look at the
    flags, whose errors the parse proper reports."""

    def error(self, message: str) -> typing.NoReturn:
        raise argparse.ArgumentError(None, message)


class ScriptParser(HfArgumentParser):
    """The script's parser, whose error is one line: argparse's usage before it, every TrainingArguments flag, was 134
    lines, with the mistyped value at the end. `--help` still prints them all."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (all flags: --help)\n")


def flags_given(argv: list[str]) -> dict[str, typing.Any]:
    """The values of the flags in `argv`, by field name: those given only (none where the flags do not parse)."""
    probe = ProbeParser(ARGUMENT_GROUPS, add_help=False)
    for action in probe._actions:  # not set_defaults: argparse would convert the string by the flag's type
        action.default = argparse.SUPPRESS
    try:
        return vars(probe.parse_known_args(argv)[0])
    except argparse.ArgumentError:  # the parse proper reports it
        return {}


def parse(argv: list[str]) -> tuple[ModelArguments, DataArguments, TranslationTrainingArguments]:
    """Preset defaults, then the config file's values (when the first argument is one), then the flags."""
    values = {}
    if argv and argv[0].lower().endswith(CONFIG_SUFFIXES) and not argv[0].startswith("-"):
        config_file, argv = argv[0], argv[1:]
        values = read_config_file(config_file)
        if not values and not argv:  # else the run fails on the first setting it needs, naming neither
            raise ValueError(f"{config_file}: no settings in it, and no flags after it")
    flags = flags_given(argv)
    given = {**values, **flags}
    preset = get_preset(given.get("preset", ModelArguments.preset))
    # Which of the preset's tied defaults the user sets, in the file or by a flag: the others follow them.
    defaults = preset.training_defaults(**{name: given[name] for name in TIED_TO_THE_PRESET if name in given})
    in_file = {name: values[name] for name in ACCUMULATION if name in values}
    if in_file.get("gradient_accumulation_steps") == 1:
        del in_file["gradient_accumulation_steps"]
    chosen = {name: flags[name] for name in ACCUMULATION if name in flags} or in_file
    if chosen.keys() == {"gradient_accumulation_steps"}:
        defaults["tokens_per_update"] = values["tokens_per_update"] = None
    elif chosen.keys() == {"tokens_per_update"}:
        values.pop("gradient_accumulation_steps", None)
    parser = ScriptParser(ARGUMENT_GROUPS)
    parser.set_defaults(**{**defaults, **values})
    *arguments, unused = parser.parse_args_into_dataclasses(argv, return_remaining_strings=True)
    misplaced = [argument for argument in unused if argument.lower().endswith(CONFIG_SUFFIXES)]
    if misplaced:  # else "not used by the HfArgumentParser", which says neither why nor what to do
        raise ValueError(f"{misplaced[0]}: a config file is read as the first argument only, before any flag")
    if unused:
        raise ValueError(f"Some specified arguments are not used by the HfArgumentParser: {unused}")
    return tuple(arguments)


def exit_now_on_signal(code: int) -> dict[signal.Signals, typing.Any]:
    """After the checkpoint is saved, a further signal (a launcher stopping the other workers) exits at once with
    `code`, rather than killing the process with another code: for the rest of `run()`. From `atexit` on, the
    process is exiting with `code` already and the signals are ignored instead: the interpreter's shutdown (about a
    second) puts the default action back in place of every Python handler before it ends, so that a signal then
    killed the preempted run (143) however it was handled, while an ignored one stays ignored.

    Returns the handlers it replaced, which `run()` puts back as it ends: a caller that goes on (IPython's `%run`, a
    test) kept handlers that `os._exit` it, so that its next Ctrl-C (a notebook's "interrupt kernel") ended the
    whole process with code 75, and a later run in it restored them again after training. Not the default action
    (SIGTERM's and SIGUSR1's in a script), which ends the process too: put back, it killed the preempted run by a
    signal that came between `main()`'s end and the atexit callbacks (-15, 1 run of 2 under repeated SIGTERMs)."""
    ignore_signals_at_exit()
    replaced = _handle_signals_with(lambda *_: os._exit(code))
    return {sig: handler for sig, handler in replaced.items() if handler not in (signal.SIG_DFL, None)}


def ignore_signals_once_finished() -> dict[signal.Signals, typing.Any]:
    """After the run finished, a signal (a scheduler's at the end of the job) has nothing left to stop: ignored for
    the rest of `run()` and again from `atexit` on, through the interpreter's shutdown (about a second, all of it
    after the atexit callbacks), so that the process ends as it would have, with code 0. Else it killed the finished
    run by the signal's default action (143 for SIGTERM), which a requeue loop takes for a failure.

    Returns the handlers it replaced, which `run()` puts back as it returns: a caller that goes on (IPython's
    `%run`, a test) kept the signals ignored, and its next run installed no handler for them, since a signal the
    process ignores stays ignored (`PreemptionCallback`): a scheduler's SIGTERM and Ctrl-C were lost."""
    ignore_signals_at_exit()
    return _handle_signals_with(signal.SIG_IGN)


def _handle_signals_with(handler: typing.Any) -> dict[signal.Signals, typing.Any]:
    # One the process was started ignoring (SIGHUP under `nohup`) stays ignored, as PreemptionCallback leaves it
    return {sig: signal.signal(sig, handler) for sig in PREEMPTION_SIGNALS if not ignored(sig)}


def restore_signals(handlers: dict[signal.Signals, typing.Any]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def main() -> None:
    try:
        # `--help | head`: quietly, as the other scripts; given up as a run's log, its 50 KB of help said "Not
        # writing to standard output any more, the run goes on".
        with reporting_on_stdout():
            try:
                arguments = parse(sys.argv[1:])
            except (OSError, ValueError, ImportError) as error:  # ImportError: --deepspeed without deepspeed
                sys.exit(one_line(error))
        with giving_up_broken_output():  # a terminal gone or a log file on a full disk does not stop the run
            run(*arguments)
    finally:
        if SIGNALS_AT_LAUNCH is not None:
            SIGNALS_AT_LAUNCH.release()


def one_line(error: BaseException) -> str:
    """The message a failed run exits with: transformers' own span lines (its checks of the arguments, its "We
    couldn't connect ...\nCheck your internet connection ...")."""
    return f"error: {' '.join(str(error).split())}"


def run(model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments) -> None:
    level = logging.INFO if training_args.should_log else logging.WARNING  # the main process tells the story
    log_to_stderr("%(asctime)s %(levelname)s %(name)s: %(message)s", level)
    log = logging.getLogger("train")
    # The messages, not the exceptions: their tracebacks hold the trainer, which holds the process group.
    preempted = failure = crash = None
    interrupted = False
    handlers = {}  # those in place before the run ended, put back as run() returns or exits
    try:
        output_dir = train(model_args, data_args, training_args)
        handlers = ignore_signals_once_finished()
    except TrainingPreempted as stop:
        handlers = exit_now_on_signal(EXIT_PREEMPTED)
        preempted = str(stop)
    except (OSError, ValueError, TrainingDiverged) as error:  # OSError: a full disk, Hub errors; one line each
        failure = one_line(error)
    except Exception as error:  # a bug, or a device's error (out of memory): its traceback, as text
        crash = traceback.format_exc()
        # After it, the line that says what a collective's failure means: its traceback ends deep in torch.
        lost = lost_process_message(error, training_args)
        crash += f"{lost}\n" if lost is not None else ""
    except KeyboardInterrupt:  # a second Ctrl-C (or one during the push): out at once, as asked
        interrupted = True
    try:
        leave_process_group()  # local: a rank that failed alone does not wait for the others
        if interrupted:
            # A new one, whose traceback holds nothing of the run. Uncaught, Python ends the process by SIGINT
            # itself, so that a shell script around the run stops too (an exit code would let it go on); a
            # caller that catches it (IPython's `%run`, a notebook's kernel) goes on, where killing the process
            # by SIGINT ended the kernel.
            raise KeyboardInterrupt
        if crash is not None:
            sys.stderr.write(crash)
            sys.exit(1)
        if failure is not None:
            sys.exit(failure)
        if preempted is not None:
            log.warning("Exiting with code %d (preempted): %s", EXIT_PREEMPTED, preempted)
            sys.exit(EXIT_PREEMPTED)
        log.info("Model, tokenizer and generation config saved to %s", output_dir)
    finally:
        restore_signals(handlers)


if __name__ == "__main__":
    main()
