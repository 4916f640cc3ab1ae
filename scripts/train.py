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
SIGUSR1) stopped it with a complete checkpoint, so that the same command resumes it (OUTPUT_DIR/preempted.json says
the same where a launcher such as torchrun turns the workers' 75 into its own 1); 1 with an `error:` line otherwise.
"""

import argparse
import contextlib
import logging
import os
import signal
import sys
import typing

from transformers import HfArgumentParser

from modeling.arguments import DataArguments, ModelArguments, TranslationTrainingArguments
from modeling.callbacks import PREEMPTION_SIGNALS, leave_process_group
from modeling.config_files import ARGUMENT_GROUPS, read_config_file
from modeling.presets import get_preset
from modeling.training import TrainingPreempted, train

CONFIG_SUFFIXES = (".json", ".yaml", ".yml")
EXIT_PREEMPTED = 75  # EX_TEMPFAIL in sysexits.h: a temporary failure, the same command may be retried

NOT_GIVEN = object()  # a default no flag can produce: tells whether a flag was given
# The arguments that move the preset's defaults of checkpoint rotation: see TrainingPreset.training_defaults
TIED_TO_THE_PRESET = (
    "save_total_limit",
    "average_last_checkpoints",
    "metric_for_best_model",
    "load_best_model_at_end",
)
# The preset's tokens_per_update derives the micro-batches per update: a user who gives their number instead means
# it, by a flag whatever the number, in a config file unless it is 1 (Hugging Face's default, which configs copied
# from elsewhere spell out).
ACCUMULATION = ("gradient_accumulation_steps", "tokens_per_update")


class ProbeParser(HfArgumentParser):
    """The script's parser without --help, raising its errors rather than printing them: a first look at the
    flags, whose errors the parse proper reports."""

    def error(self, message: str) -> typing.NoReturn:
        raise argparse.ArgumentError(None, message)


def parse(argv: list[str]) -> tuple[ModelArguments, DataArguments, TranslationTrainingArguments]:
    """Preset defaults, then the config file's values (when the first argument is one), then the flags."""
    parser = HfArgumentParser(ARGUMENT_GROUPS)
    values = {}
    if argv and argv[0].endswith(CONFIG_SUFFIXES) and not argv[0].startswith("-"):
        config_file, argv = argv[0], argv[1:]
        values = read_config_file(config_file)
        if not values and not argv:  # else the run fails on the first setting it needs, naming neither
            raise ValueError(f"{config_file}: no settings in it, and no flags after it")
    preset_parser = argparse.ArgumentParser(add_help=False)
    preset_parser.add_argument("--preset", default=values.get("preset", ModelArguments.preset))
    preset = get_preset(preset_parser.parse_known_args(argv)[0].preset)
    # Which of the preset's tied defaults the user sets, in the file or by a flag: the others follow them.
    given = {name: values[name] for name in TIED_TO_THE_PRESET if name in values}
    chosen = {name: values[name] for name in ACCUMULATION if name in values}
    if chosen.get("gradient_accumulation_steps") == 1:
        del chosen["gradient_accumulation_steps"]
    probe = ProbeParser(ARGUMENT_GROUPS, add_help=False)
    not_given = dict.fromkeys((*TIED_TO_THE_PRESET, *ACCUMULATION), NOT_GIVEN)
    probe.set_defaults(**{**preset.training_defaults(), **values, **not_given})
    with contextlib.suppress(argparse.ArgumentError):  # the parse proper reports it
        flags = vars(probe.parse_known_args(argv)[0])
        given |= {name: flags[name] for name in TIED_TO_THE_PRESET if flags[name] is not NOT_GIVEN}
        chosen |= {name: flags[name] for name in ACCUMULATION if flags[name] is not NOT_GIVEN}
    defaults = preset.training_defaults(**given)
    if chosen.keys() == {"gradient_accumulation_steps"}:
        defaults["tokens_per_update"] = None
    parser.set_defaults(**{**defaults, **values})
    return parser.parse_args_into_dataclasses(argv)


def exit_now_on_signal(code: int) -> None:
    """After the checkpoint is saved, a further signal (a launcher stopping the other workers) exits at once with
    `code`, rather than killing the process with another code."""
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, lambda *_: os._exit(code))


def main() -> None:
    try:
        model_args, data_args, training_args = parse(sys.argv[1:])
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    level = logging.INFO if training_args.should_log else logging.WARNING  # the main process tells the story
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level)
    log = logging.getLogger("train")
    # The messages, not the exceptions: their tracebacks hold the trainer, which holds the process group.
    preempted = failure = None
    try:
        output_dir = train(model_args, data_args, training_args)
    except TrainingPreempted as stop:
        exit_now_on_signal(EXIT_PREEMPTED)
        preempted = str(stop)
    except (OSError, ValueError) as error:  # OSError includes a full disk and Hub errors; one line each
        failure = f"error: {error}"
    leave_process_group()  # local: a rank that failed alone does not wait for the others
    if failure is not None:
        sys.exit(failure)
    if preempted is not None:
        log.warning("Exiting with code %d (preempted): %s", EXIT_PREEMPTED, preempted)
        sys.exit(EXIT_PREEMPTED)
    log.info("Model, tokenizer and generation config saved to %s", output_dir)


if __name__ == "__main__":
    main()
