"""The three argument groups of `scripts/train.py`: what model, what data, and how to train it.

`TranslationTrainingArguments` is `Seq2SeqTrainingArguments` plus token-budget batching, time-based checkpoints, a
wall-clock budget, the paper's schedule and checkpoint averaging; every `Seq2SeqTrainingArguments` field keeps its
meaning. A preset (`modeling.presets`) supplies the defaults.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from accelerate import PartialState
from accelerate.utils import PrecisionType
from transformers import Seq2SeqTrainingArguments
from transformers.trainer_pt_utils import AcceleratorConfig
from transformers.utils import strtobool

from .presets import PRESETS

logger = logging.getLogger(__name__)

# Where launchers put the number of processes (torchrun, MPI implementations), as accelerate reads them.
_WORLD_SIZE_ENV = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def _process_count(name: str) -> int | None:
    """The process count a launcher set in the environment variable `name`, None where it is unset."""
    text = os.environ.get(name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} in the environment is not a process count; unset it or give one") from None


def _launcher_world_size() -> int:
    """The process count a launcher (torchrun, MPI) set, 1 where none did."""
    return max([1, *(count for name in _WORLD_SIZE_ENV if (count := _process_count(name)) is not None)])


def _home_expanded(path: str | None) -> str | None:
    """`path` with a leading `~` expanded, as transformers expands output_dir's: no shell expands one in a config
    file (or in `--data_dir=~/x`), and `data_dir: ~/wmt14` was `does not exist` beside an `output_dir: ~/runs` that
    worked. Hub repo ids never start with `~`."""
    return os.path.expanduser(path) if path is not None and path.startswith("~") else path


def _refuse_empty(arguments: Any, names: tuple[str, ...]) -> None:
    """Refuse a text setting given as blank: `--name $VAR` with VAR unset."""
    for name in names:
        if getattr(arguments, name) is not None and not getattr(arguments, name).strip():
            raise ValueError(f"--{name} is empty (a shell variable not set?): give its value, or leave it out")


def _check_accelerator_config(config: Any) -> None:
    """Refuse a key that `AcceleratorConfig` lacks, given as a mapping (a config file's) or as JSON (a flag's):
    transformers passes them as keyword arguments, and `split_batch: true` failed with a TypeError's traceback
    naming neither the setting nor the keys it takes."""
    if isinstance(config, str) and config.startswith("{"):
        config = json.loads(config)
    known = AcceleratorConfig.__dataclass_fields__
    if isinstance(config, dict) and (unknown := sorted(set(config) - set(known), key=str)):
        raise ValueError(f"accelerator_config: unknown keys {unknown}; it takes {sorted(known)}.")


def _environment_flag(name: str) -> bool:
    """A true/false environment variable as accelerate reads it, refused naming it where it is neither: transformers'
    `strtobool` said "invalid truth value ''" of `ACCELERATE_USE_CPU=` (a variable emptied, not unset)."""
    try:
        return bool(strtobool(os.environ.get(name, "False")))
    except ValueError:
        raise ValueError(
            f"{name}={os.environ[name]!r} in the environment is not true or false: unset it or give one"
        ) from None


def _node_count() -> int | None:
    """Machines in the launch, from the variables torchrun (and accelerate's launcher) set: 1 outside one; None for
    a launcher that sets the world size (above 1) alone, which does not say how many machines it spans."""
    world, local = _process_count("WORLD_SIZE"), _process_count("LOCAL_WORLD_SIZE")
    if world and local:
        return world // local
    return None if world and world > 1 else 1


# The float settings that must be finite numbers.
_FINITE_NUMBERS = (
    "learning_rate",
    "warmup_steps",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "weight_decay",
    "max_grad_norm",
    "label_smoothing_factor",
    "max_train_minutes",
    "save_every_minutes",
)


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` plus token-budget batching, time-based checkpoints and the paper's schedule."""

    max_tokens_per_device: int = field(
        default=4096,
        metadata={
            "help": "Padded tokens per batch and per side (source, target) on each device, at most (Sec. 5.1); "
            "tokens_per_update may make batches smaller."
        },
    )
    tokens_per_update: int | None = field(
        default=None,
        metadata={
            "help": "Real target tokens per optimizer update, over all devices (paper: 25000). When set, "
            "gradient_accumulation_steps is derived from it, the world size and the data, and batches are made "
            "smaller than max_tokens_per_device where one per device would hold too many."
        },
    )
    paper_schedule: bool = field(
        default=True,
        metadata={
            "help": "Use the schedule of Sec. 5.3 with learning_rate as its multiplier (1.0 = paper); "
            "--no_paper_schedule uses lr_scheduler_type with learning_rate as the peak rate."
        },
    )
    save_every_minutes: float | None = field(
        default=None,
        metadata={"help": "Also save a checkpoint every this many minutes (the paper: 10), besides save_steps."},
    )
    max_train_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Stop after this many minutes of training (evaluation included), saving a last checkpoint, "
            "even if max_steps is not reached: a wall-clock budget."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start over in an output_dir that holds an earlier run: its checkpoints, averaged/, records and "
            "model are deleted first. Without it, such a directory is refused unless resuming."
        },
    )
    average_last_checkpoints: int = field(
        default=0,
        metadata={"help": "After training, average the last N checkpoints into OUTPUT_DIR/averaged (Sec. 6.1)."},
    )

    def __post_init__(self):
        launched_processes = _launcher_world_size()  # first: accelerate's int() of WORLD_SIZE names no variable
        if self.ddp_backend is not None and launched_processes <= 1:
            # A config written for torchrun, run as one process (a requeue on one GPU, a test on a laptop): the
            # backend joins processes, and accelerate fails on it with "Default process group has not been
            # initialized", naming no setting.
            logger.info("One process: ddp_backend=%r is not needed, ignoring it", self.ddp_backend)
            self.ddp_backend = None
        self.resume_from_checkpoint = _home_expanded(self.resume_from_checkpoint)
        # Blank, the run wrote its lock, identity and tokenizer into the working directory, then failed on "No such
        # file or directory: ''"
        _refuse_empty(self, ("output_dir",))
        _check_accelerator_config(self.accelerator_config)
        on_cpus = self.use_cpu or _environment_flag("ACCELERATE_USE_CPU")
        if launched_processes > 1 and on_cpus and PartialState._shared_state == {}:
            # transformers passes ddp_timeout to the process group on accelerators only: on CPUs (gloo) a
            # collective waited for a hung process torch's default 30 minutes whatever ddp_timeout said (the
            # presets' 4 hours, which the other processes need while the main one trains the BPE, among them).
            # The state made here is the one transformers then sets up on: its group is kept.
            PartialState(cpu=True, backend=self.ddp_backend, timeout=timedelta(seconds=self.ddp_timeout))
        super().__post_init__()
        self._take_launcher_precision()
        # Checked here, not where they are first used: that is after the BPE is trained and the run recorded, and a
        # corrected rerun into the same directory would find an earlier run there.
        self._check_numbers()
        self._check_combinations()

    def _take_launcher_precision(self) -> None:
        """The mixed precision `accelerate launch` passes on (its config file's `mixed_precision`, a default config
        left from another project included, as ACCELERATE_MIXED_PRECISION) where neither bf16 nor fp16 is given: the
        Trainer trains with it, so these fields say it too, and with them the run's records and model card (they
        said `bf16: false` under bf16 autocast), with a warning. Not fp16 on a CPU: accelerate trains float32 there;
        not under DeepSpeed, whose config decides. Where the arguments give the other one, theirs is trained, and said:
        the launch's config was set aside without a word."""
        asked = self.mixed_precision
        given = "bf16" if self.bf16 else "fp16" if self.fp16 else None
        launched = os.environ.get("ACCELERATE_MIXED_PRECISION")
        if given is None and launched is not None and launched not in PrecisionType.list():
            # accelerate refused it only once the Trainer was built, after the BPE was trained and saved, naming no
            # variable ("Unknown mixed_precision mode: BF16")
            raise ValueError(
                f"ACCELERATE_MIXED_PRECISION={launched!r} in the environment is not one of {PrecisionType.list()}: "
                "unset it or give one"
            )
        if given and launched in ("bf16", "fp16") and launched != given and not self.deepspeed and self.should_log:
            logger.warning(
                "Training with %s, as the training arguments ask: ACCELERATE_MIXED_PRECISION=%s (set by accelerate "
                "launch from its config, or in the environment) is not taken",
                given,
                launched,
            )
        if given or self.deepspeed or asked not in ("bf16", "fp16"):
            return
        if asked == "fp16" and self.device.type == "cpu":
            return
        setattr(self, asked, True)
        if self.should_log:  # said before the scripts' logging is set up: a warning is printed all the same
            logger.warning(
                "Training with %s autocast, as ACCELERATE_MIXED_PRECISION=%s asks (set by accelerate launch from its "
                "config, or in the environment): recorded as %s: true (for float32: accelerate launch "
                "--mixed_precision no, or unset the variable)",
                asked,
                asked,
                asked,
            )

    def _check_numbers(self) -> None:
        """Each number in its range: a value outside it trains to NaN, turns a limit off or fails late."""
        for name in _FINITE_NUMBERS:  # inf or nan (YAML's `.inf`) trained to all-NaN weights, or turned a limit off
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}.")
        if self.learning_rate < 0:
            raise ValueError(f"learning_rate must not be negative, got {self.learning_rate}.")
        # transformers reads a count below 1 as unset: trained num_train_epochs, where "none" (0) or a number of
        # updates with a stray minus (-5000) was meant
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(
                f"max_steps {self.max_steps} would train num_train_epochs epochs (transformers reads a count below 1 "
                "as unset): give the number of updates, or -1 to train by epochs."
            )
        if self.gradient_accumulation_steps < 1:
            steps = self.gradient_accumulation_steps
            raise ValueError(f"gradient_accumulation_steps must be at least 1, got {steps}.")
        if self.tokens_per_update is not None and self.tokens_per_update < 1:
            raise ValueError(f"tokens_per_update must be positive, got {self.tokens_per_update}.")
        if self.average_last_checkpoints < 0:  # 0 or 1: none averaged
            raise ValueError(f"average_last_checkpoints must not be negative, got {self.average_last_checkpoints}.")
        if self.save_every_minutes is not None and self.save_every_minutes <= 0:
            raise ValueError(f"save_every_minutes must be positive, got {self.save_every_minutes}.")
        if not 0 <= self.label_smoothing_factor <= 1:  # the Trainer's own check is < 0 only, at the first step
            raise ValueError(f"label_smoothing_factor must be between 0 and 1, got {self.label_smoothing_factor}.")
        if self.max_tokens_per_device < 1:
            raise ValueError(f"max_tokens_per_device must be positive, got {self.max_tokens_per_device}.")
        if self.max_train_minutes is not None and self.max_train_minutes <= 0:
            raise ValueError(f"max_train_minutes must be positive, got {self.max_train_minutes}.")

    def _check_combinations(self) -> None:
        """Settings that contradict one another, or how this project's checkpoints work."""
        if self.save_on_each_node and _node_count() != 1:  # on one node it changes nothing
            raise ValueError(
                "save_on_each_node is not supported: rank 0 writes each checkpoint, with every rank's RNG state, and "
                "every rank resumes from it, so output_dir must be on a file system all nodes share (other nodes "
                "would get checkpoints without weights, which no requeue resumes)."
            )
        if self.fp16 and self.device.type == "cpu":
            # accelerate autocasts fp16 on accelerators only: the run trained float32 while its records
            # (training_args.json, the model card, a resume's precision check) said fp16
            raise ValueError(
                "fp16 needs a GPU: on a CPU accelerate trains float32, which the run's records would call fp16; leave "
                "fp16 out, or give bf16 (with use_cpu) for autocast on a CPU."
            )
        ignored = [f"lr_scheduler_type {self.lr_scheduler_type.value}"] if self.lr_scheduler_type != "linear" else []
        ignored += ["lr_scheduler_kwargs"] if self.lr_scheduler_kwargs else []
        if self.paper_schedule and ignored:  # the schedule of Sec. 5.3 ran, and the records left the type out
            raise ValueError(
                f"{' and '.join(ignored)}: used with --no_paper_schedule only (learning_rate then the peak rate), not "
                "by the paper's schedule of Sec. 5.3, the default; give paper_schedule false, or leave it out."
            )
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size"):
            if (size := getattr(self, name)) != type(self).__dataclass_fields__[name].default:  # ignored, silently
                raise ValueError(
                    f"{name} {size}: batches here are token budgets, not numbers of sentences; give "
                    "max_tokens_per_device (tokens per batch and side) or tokens_per_update, or leave it out."
                )
        if self.tokens_per_update is not None and self.gradient_accumulation_steps != 1:
            raise ValueError(
                "Give tokens_per_update or gradient_accumulation_steps, not both: the number of micro-batches per "
                "update is derived from tokens_per_update."
            )
        limit, averaged = self.save_total_limit, self.average_last_checkpoints
        # With a metric_for_best_model (load_best_model_at_end sets one), rotation keeps the best checkpoint, however
        # old, in one of the limit's places: the last `averaged` must fit in the others, or an old best would be
        # averaged with the newest ones.
        best = 1 if self.metric_for_best_model is not None else 0
        if limit is not None and 0 < limit < averaged + best and averaged > 1:  # None or 0: every one is kept
            kept = (
                f"with metric_for_best_model keeps the best checkpoint and only the {limit - 1} newest, fewer"
                if best
                else "keeps fewer checkpoints"
            )
            raise ValueError(
                f"save_total_limit {limit} {kept} than average_last_checkpoints {averaged} averages: raise "
                "save_total_limit (or leave it out: the preset keeps as many as are averaged) or average fewer."
            )
        if self.overwrite_output_dir and checkpoint_to_resume(self.resume_from_checkpoint) is not None:
            raise ValueError(
                "Give --overwrite_output_dir (start over) or --resume_from_checkpoint (continue), not both."
            )


def checkpoint_to_resume(value: str | None) -> str | None:
    """--resume_from_checkpoint as asked: "last" (also "true"), a path, or None for a fresh run (not given, empty,
    "false" or "none", in any case)."""
    if value is None or value.strip().lower() in ("", "false", "none"):
        return None
    return "last" if value.strip().lower() in ("last", "true") else value


# The ModelArguments that resize the preset's architecture (what fine-tuning cannot change).
ARCHITECTURE_FLAGS = ("d_model", "num_layers", "num_heads", "ffn_dim")


@dataclass
class ModelArguments:
    """Which model to train: a preset, optionally resized, or existing weights to fine-tune."""

    preset: str = field(default="base", metadata={"help": f"One of {sorted(PRESETS)}."})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Fine-tune this model (local directory or Hub repo, with its tokenizer) instead."},
    )
    model_revision: str | None = field(
        default=None, metadata={"help": "The branch, tag or commit of model_name_or_path's Hub repo (default: main)."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={"aliases": ["--tokenizer"], "help": "Use this tokenizer instead of training a shared BPE."},
    )
    # Not an option: the commit that model_revision (None: main) of model_name_or_path's Hub repo was at when this
    # launch first read it (`check_fine_tuning_source`), which every later read of the repo takes.
    model_commit: str | None = field(default=None, init=False)
    d_model: int | None = field(default=None, metadata={"help": "Override the preset's d_model."})
    num_layers: int | None = field(default=None, metadata={"help": "Override N, encoder and decoder layers."})
    num_heads: int | None = field(default=None, metadata={"help": "Override h, attention heads."})
    ffn_dim: int | None = field(default=None, metadata={"help": "Override d_ff."})
    dropout: float | None = field(default=None, metadata={"help": "Override P_drop (also when fine-tuning)."})

    def __post_init__(self):
        _refuse_empty(self, ("model_name_or_path", "model_revision", "tokenizer_name_or_path"))
        self.model_name_or_path = _home_expanded(self.model_name_or_path)
        self.tokenizer_name_or_path = _home_expanded(self.tokenizer_name_or_path)

    def config_overrides(self) -> dict[str, Any]:
        """`TransformerConfig` fields set by the overrides given."""
        overrides = {
            "d_model": self.d_model,
            "encoder_layers": self.num_layers,
            "decoder_layers": self.num_layers,
            "encoder_attention_heads": self.num_heads,
            "decoder_attention_heads": self.num_heads,
            "encoder_ffn_dim": self.ffn_dim,
            "decoder_ffn_dim": self.ffn_dim,
            "dropout": self.dropout,
        }
        return {name: value for name, value in overrides.items() if value is not None}


@dataclass
class DataArguments:
    """Where the parallel text comes from and how it is prepared."""

    source_lang: str = field(default="en", metadata={"help": "Source language code."})
    target_lang: str = field(default="de", metadata={"help": "Target language code."})
    dataset: str | None = field(default=None, metadata={"help": "Hub dataset, e.g. wmt/wmt14."})
    language_pair: str | None = field(default=None, metadata={"help": "Hub dataset configuration, e.g. de-en."})
    dataset_revision: str | None = field(
        default=None,
        metadata={
            "help": "The branch, tag or commit of --dataset (default: main; a resumed run: the commit it read)."
        },
    )
    data_dir: str | None = field(default=None, metadata={"help": "Local parallel files (see modeling.data)."})
    vocab_size: int | None = field(default=None, metadata={"help": "Size of the shared BPE to train (preset's)."})
    max_length: int | None = field(default=256, metadata={"help": "Truncate sequences to this many tokens."})
    clean: bool = field(default=True, metadata={"help": "Drop empty, over-long and mismatched training pairs."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training pairs."})
    bleu_sample_size: int | None = field(
        default=None, metadata={"help": "Validation sentences scored by BLEU at each evaluation (preset's; 0: none)."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for tokenisation (default: the cores, for large splits)."}
    )

    def __post_init__(self):
        # `--data_dir $DATA` with DATA unset: the current directory was searched for the corpus, even beside
        # --dataset, which an empty data_dir did not contradict
        _refuse_empty(self, ("dataset", "dataset_revision", "language_pair", "data_dir", "source_lang", "target_lang"))
        if self.dataset_revision is not None and self.dataset is None:
            raise ValueError("--dataset_revision names a version of --dataset's Hub repo: give that too")
        self.data_dir = _home_expanded(self.data_dir)
