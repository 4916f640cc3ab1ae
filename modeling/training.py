"""Training at paper scale: the recipe of Vaswani et al. (2017), Sec. 5, on 🤗 `Seq2SeqTrainer` and accelerate.

What this module adds to the Trainer, and why:

- **Presets** `tiny`, `small`, `base`, `big`: a model size and the training budget that goes with it. Every preset
  uses the paper's recipe: Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9 and the warmup / inverse-square-root schedule
  (Sec. 5.3), label smoothing 0.1, dropout on every sublayer (Sec. 5.4), no gradient clipping.
- **The exact schedule.** `lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)` where `step` is the number
  of the update being taken, from 1. (transformers' `inverse_sqrt` is one step late: its first update has lr 0.)
  `learning_rate` multiplies it, as tensor2tensor's `learning_rate_constant` does: 1.0 is the paper.
- **Token-budget batches** (Sec. 5.1: "approximately 25000 source tokens and 25000 target tokens") from
  `modeling.data.TokenBudgetBatchSampler`, sharded over processes by accelerate, and a number of
  **micro-batches per update derived from the world size**, so an update holds the same number of tokens on 1 or
  8 GPUs.
- **Checkpoints** every `save_steps` updates and/or every `save_every_minutes` minutes (Sec. 6.1: "checkpoints,
  which were written at 10-minute intervals"), resumable with the same losses as an uninterrupted run; the last N
  are averaged by `modeling.averaging`.
- **Validation**: loss on the whole validation split, and BLEU by the paper's beam search on a fixed sample of it.
- **Label smoothing in the model's fused loss** (its `smoothing_epsilon` argument) instead of the Trainer's
  `LabelSmoother`, which needs the (B, T, V) logits and makes several passes over them: the training forward fuses
  the output projection with the loss and never builds them; the same value and gradients.
- **A wall-clock budget**, `max_train_minutes`: stop after that long with a last checkpoint.
- `train()`: the whole pipeline that `scripts/train.py` calls: data, shared BPE, model, training, final save, and
  with `push_to_hub` one push at the end, of the model `scripts/push_to_hub.py` would push, with this project's card.

How batches are sharded over processes: the sampler is built for one process (`num_replicas=1`) and
`accelerator.prepare` wraps it in a `BatchSamplerShard`, which gives rank r the batches r, r + R, ... and, with
accelerate's default `even_batches=True`, repeats a few first batches at the end of an epoch so every rank gets the
same number (with `even_batches=False` ranks would get different numbers of batches and DDP would hang on the
last one). Evaluation batches are instead split until their number is a multiple of R, so that nothing is
evaluated twice.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Sampler
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    EvalPrediction,
    PreTrainedTokenizerBase,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)
from transformers.trainer_utils import seed_worker

from .averaging import average_checkpoints, list_checkpoints
from .configuration_transformer import TransformerConfig
from .data import (
    TokenBudgetBatchSampler,
    clean_parallel_dataset,
    load_parallel_dataset,
    resolve_split,
    sequence_lengths,
    tokenize_parallel_dataset,
)
from .evaluation import corpus_scores, write_json
from .modeling_transformer import TransformerForConditionalGeneration
from .tokenization import iter_corpus_text, train_shared_bpe

logger = logging.getLogger(__name__)

# Sec. 5.3: "We used the Adam optimizer with β1 = 0.9, β2 = 0.98 and ε = 10^-9", warmup_steps = 4000.
PAPER_ADAM_BETAS = (0.9, 0.98)
PAPER_ADAM_EPSILON = 1e-9
PAPER_WARMUP_STEPS = 4000
# Sec. 5.4: "we employed label smoothing of value ε_ls = 0.1".
PAPER_LABEL_SMOOTHING = 0.1
BLEU_SAMPLE_SEED = 0  # the validation sample scored by BLEU is the same for every run, whatever the training seed


# --------------------------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingPreset:
    """A model size (one of the paper's `architecture`s, with the fields of `model` over it) and its budget."""

    architecture: Callable[..., TransformerConfig]
    model: dict[str, Any]
    vocab_size: int
    max_steps: int
    warmup_steps: int
    learning_rate: float  # multiplier of the schedule of Sec. 5.3; 1.0 is the paper
    max_tokens_per_device: int
    tokens_per_update: int | None
    save_steps: int
    eval_steps: int
    logging_steps: int
    bleu_sample_size: int
    average_last_checkpoints: int

    def model_config(self, vocab_size: int, **overrides: Any) -> TransformerConfig:
        """The preset's architecture for a vocabulary of `vocab_size`, with `overrides` on top."""
        return self.architecture(**{**self.model, "vocab_size": vocab_size, **overrides})

    def training_defaults(self) -> dict[str, Any]:
        """Defaults of `TranslationTrainingArguments` for this preset: the paper's recipe and this budget.

        Explicit arguments win over these (the script passes them to `HfArgumentParser.set_defaults`).
        """
        return {
            "max_steps": self.max_steps,
            "warmup_steps": self.warmup_steps,
            "learning_rate": self.learning_rate,
            "paper_schedule": True,
            "adam_beta1": PAPER_ADAM_BETAS[0],
            "adam_beta2": PAPER_ADAM_BETAS[1],
            "adam_epsilon": PAPER_ADAM_EPSILON,
            "weight_decay": 0.0,
            "label_smoothing_factor": PAPER_LABEL_SMOOTHING,
            "max_grad_norm": 0.0,  # the paper clips nothing
            "optim": "adamw_torch_fused" if torch.cuda.is_available() else "adamw_torch",
            "max_tokens_per_device": self.max_tokens_per_device,
            "tokens_per_update": self.tokens_per_update,
            "save_strategy": "steps",
            "save_steps": self.save_steps,
            "save_total_limit": max(self.average_last_checkpoints, 1),
            "average_last_checkpoints": self.average_last_checkpoints,
            "eval_strategy": "steps",
            "eval_steps": self.eval_steps,
            "logging_steps": self.logging_steps,
            "predict_with_generate": True,
            "report_to": ["tensorboard"],
            "ddp_find_unused_parameters": False,  # every parameter is used: spare DDP a graph traversal per update
        }


_TINY_MODEL = {
    "d_model": 128,
    "encoder_layers": 3,
    "decoder_layers": 3,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 512,
    "decoder_ffn_dim": 512,
}
# fairseq's `transformer_iwslt_de_en`: the usual model for IWSLT-sized corpora (~160k pairs) on one GPU.
_SMALL_MODEL = {
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 1024,
    "decoder_ffn_dim": 1024,
    "dropout": 0.3,
}

PRESETS: dict[str, TrainingPreset] = {
    # A CPU demo that learns Multi30k en→de in minutes on 2 cores: the paper's architecture scaled to d_model 128,
    # 3 + 3 layers, d_ff = 4·d_model, 6000 BPE tokens; 1000 updates of ~3900 tokens (4.5 epochs of Multi30k), which
    # took 3 min 5 s (~22,000 tokens/s) to 13 min (~5,300) on the 2-core machines measured (README). The warmup is
    # shortened to the run; the multiplier 0.3 puts the peak rate at 1.3e-3 (update 400).
    "tiny": TrainingPreset(
        architecture=TransformerConfig.base,
        model=_TINY_MODEL,
        vocab_size=6000,
        max_steps=1000,
        warmup_steps=400,
        learning_rate=0.3,
        max_tokens_per_device=2048,
        tokens_per_update=None,
        save_steps=100,
        eval_steps=250,
        logging_steps=25,
        bleu_sample_size=200,
        average_last_checkpoints=5,
    ),
    "small": TrainingPreset(
        architecture=TransformerConfig.base,
        model=_SMALL_MODEL,
        vocab_size=10000,
        max_steps=50_000,
        warmup_steps=PAPER_WARMUP_STEPS,
        learning_rate=1.0,
        max_tokens_per_device=4096,
        tokens_per_update=None,  # one batch of 4096 tokens per update, as fairseq's IWSLT recipe on one GPU
        save_steps=1000,
        eval_steps=2500,
        logging_steps=100,
        bleu_sample_size=500,
        average_last_checkpoints=5,
    ),
    # Sec. 5.2: base models trained 100k steps (12 hours on 8 P100), big models 300k steps (3.5 days). Checkpoints
    # every 1400 (base) and 600 (big) updates are the paper's "10-minute intervals" at its speed, so that averaging
    # the last 5 / 20 covers the same share of training on any hardware (Sec. 6.1).
    "base": TrainingPreset(
        architecture=TransformerConfig.base,
        model={},
        vocab_size=37000,
        max_steps=100_000,
        warmup_steps=PAPER_WARMUP_STEPS,
        learning_rate=1.0,
        max_tokens_per_device=4096,
        tokens_per_update=25000,
        save_steps=1400,
        eval_steps=5000,
        logging_steps=100,
        bleu_sample_size=500,
        average_last_checkpoints=5,
    ),
    "big": TrainingPreset(
        architecture=TransformerConfig.big,
        model={},
        vocab_size=37000,
        max_steps=300_000,
        warmup_steps=PAPER_WARMUP_STEPS,
        learning_rate=1.0,
        max_tokens_per_device=4096,
        tokens_per_update=25000,
        save_steps=600,
        eval_steps=10000,
        logging_steps=100,
        bleu_sample_size=500,
        average_last_checkpoints=20,
    ),
}


def get_preset(name: str) -> TrainingPreset:
    """The preset called `name`, or a ValueError listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"Unknown preset {name!r}; expected one of {sorted(PRESETS)}.") from None


# --------------------------------------------------------------------------------------------------------------
# The learning-rate schedule (Sec. 5.3)
# --------------------------------------------------------------------------------------------------------------


def noam_learning_rate(step: int, d_model: int, warmup_steps: int) -> float:
    """lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5) (Eq. 3), for the update numbered `step` ≥ 1.

    It rises linearly for the first `warmup_steps` updates, then decays as the inverse square root of the step.
    """
    if step < 1 or warmup_steps < 1:
        raise ValueError(f"step ({step}) and warmup_steps ({warmup_steps}) count updates from 1.")
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


class NoamSchedule:
    """The factor `LambdaLR` multiplies the optimizer's learning rate by.

    `LambdaLR` calls it with its own counter, 0 before the first update and k after k updates; the update that
    follows is number k + 1, so it returns the rate of step k + 1 and update 1 uses the rate of step 1. A class rather
    than a closure so that the scheduler's state dict (saved in every checkpoint) records d_model and warmup.
    """

    def __init__(self, d_model: int, warmup_steps: int):
        self.d_model = d_model
        self.warmup_steps = warmup_steps

    def __call__(self, scheduler_step: int) -> float:
        return noam_learning_rate(scheduler_step + 1, self.d_model, self.warmup_steps)


def noam_scheduler(optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int) -> LambdaLR:
    """The schedule of Sec. 5.3 scaled by the optimizer's learning rate (1.0 gives the formula itself)."""
    return LambdaLR(optimizer, NoamSchedule(d_model, warmup_steps))


# --------------------------------------------------------------------------------------------------------------
# Token budgets
# --------------------------------------------------------------------------------------------------------------


def gradient_accumulation_steps_for(tokens_per_update: int, tokens_per_batch: float, world_size: int) -> int:
    """Micro-batches per update so that `world_size × steps × tokens_per_batch` comes closest to the target.

    The paper's "25000 source tokens and 25000 target tokens" per update (Sec. 5.1) then hold on any number of
    GPUs: 8 GPUs take one batch each, 1 GPU accumulates 8. Warns when the closest achievable count is more than 10%
    away from the target.
    """
    if tokens_per_update <= 0 or tokens_per_batch <= 0 or world_size < 1:
        raise ValueError(
            f"tokens_per_update ({tokens_per_update}), tokens_per_batch ({tokens_per_batch}) and world_size "
            f"({world_size}) must be positive."
        )
    steps = max(1, round(tokens_per_update / (tokens_per_batch * world_size)))
    achieved = steps * tokens_per_batch * world_size
    logger.info(
        "%d process(es) × %d micro-batch(es) of ~%.0f target tokens = ~%.0f target tokens per update (asked %d)",
        world_size,
        steps,
        tokens_per_batch,
        achieved,
        tokens_per_update,
    )
    if abs(achieved - tokens_per_update) > 0.1 * tokens_per_update:
        logger.warning(
            "An update holds ~%.0f target tokens, %+.0f%% off the %d asked: change max_tokens_per_device "
            "(%d processes, ~%.0f target tokens per batch).",
            achieved,
            100 * (achieved / tokens_per_update - 1),
            tokens_per_update,
            world_size,
            tokens_per_batch,
        )
    return steps


def mean_target_tokens_per_batch(dataset: datasets.Dataset, max_tokens: int) -> float:
    """Real (unpadded) target tokens per token-budget batch of `dataset`, on average over an epoch.

    Batches are cut on the padded size, so they hold fewer real tokens than `max_tokens`; deriving the number of
    micro-batches from this average rather than from `max_tokens` makes an update hold the asked number of real
    target tokens (those the loss is averaged over).
    """
    source_lengths, target_lengths = sequence_lengths(dataset)
    num_batches = len(TokenBudgetBatchSampler(source_lengths, target_lengths, max_tokens, shuffle=False))
    return float(target_lengths.sum()) / max(num_batches, 1)


class FixedBatchSampler(Sampler[list[int]]):
    """A fixed list of batches of dataset indices, in order."""

    def __init__(self, batches: Sequence[Sequence[int]]):
        self.batches = [list(batch) for batch in batches]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def split_batches_to_multiple(batches: Sequence[Sequence[int]], multiple: int) -> list[list[int]]:
    """Halve the largest batches until their number is a multiple of `multiple` (the number of processes).

    accelerate evens out the batches of several processes by repeating the first ones, and `Seq2SeqTrainer` gathers
    predictions without dropping repeats: repeated sentences would count twice in BLEU and eval loss. Splitting
    (at most `multiple - 1` times) avoids it; it is impossible only with fewer examples than processes.
    """
    batches = [list(batch) for batch in batches]
    while len(batches) % multiple:
        largest = max(range(len(batches)), key=lambda i: len(batches[i]))
        batch = batches[largest]
        if len(batch) < 2:
            break
        batches[largest : largest + 1] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
    return batches


# --------------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------------


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` plus token-budget batching, time-based checkpoints and the paper's schedule."""

    max_tokens_per_device: int = field(
        default=4096,
        metadata={"help": "Padded tokens per batch and per side (source, target) on each device (Sec. 5.1)."},
    )
    tokens_per_update: int | None = field(
        default=None,
        metadata={
            "help": "Real target tokens per optimizer update, over all devices (paper: 25000). When set, "
            "gradient_accumulation_steps is derived from it, the world size and the data."
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
    average_last_checkpoints: int = field(
        default=0,
        metadata={"help": "After training, average the last N checkpoints into OUTPUT_DIR/averaged (Sec. 6.1)."},
    )

    def __post_init__(self):
        super().__post_init__()
        if self.tokens_per_update is not None and self.gradient_accumulation_steps != 1:
            raise ValueError(
                "Give tokens_per_update or gradient_accumulation_steps, not both: the number of micro-batches per "
                "update is derived from tokens_per_update."
            )
        if self.max_tokens_per_device < 1:
            raise ValueError(f"max_tokens_per_device must be positive, got {self.max_tokens_per_device}.")
        if self.max_train_minutes is not None and self.max_train_minutes <= 0:
            raise ValueError(f"max_train_minutes must be positive, got {self.max_train_minutes}.")


@dataclass
class ModelArguments:
    """Which model to train: a preset, optionally resized, or existing weights to fine-tune."""

    preset: str = field(default="base", metadata={"help": f"One of {sorted(PRESETS)}."})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Fine-tune this model (local directory or Hub repo, with its tokenizer) instead."},
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={"aliases": ["--tokenizer"], "help": "Use this tokenizer instead of training a shared BPE."},
    )
    d_model: int | None = field(default=None, metadata={"help": "Override the preset's d_model."})
    num_layers: int | None = field(default=None, metadata={"help": "Override N, encoder and decoder layers."})
    num_heads: int | None = field(default=None, metadata={"help": "Override h, attention heads."})
    ffn_dim: int | None = field(default=None, metadata={"help": "Override d_ff."})
    dropout: float | None = field(default=None, metadata={"help": "Override P_drop (also when fine-tuning)."})

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
    data_dir: str | None = field(default=None, metadata={"help": "Local parallel files (see modeling.data)."})
    vocab_size: int | None = field(default=None, metadata={"help": "Size of the shared BPE to train (preset's)."})
    max_length: int | None = field(default=256, metadata={"help": "Truncate sequences to this many tokens."})
    clean: bool = field(default=True, metadata={"help": "Drop empty, over-long and mismatched training pairs."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training pairs."})
    bleu_sample_size: int | None = field(
        default=None, metadata={"help": "Validation sentences scored by BLEU at each evaluation (preset's; 0: none)."}
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})


# --------------------------------------------------------------------------------------------------------------
# Callbacks
# --------------------------------------------------------------------------------------------------------------


def _rank_zero_decides(flag: bool, device: torch.device) -> bool:
    """Rank 0's `flag`, on every rank: decisions that lead to collectives must be the same everywhere."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    decision = torch.tensor([int(flag)], device=device)
    dist.broadcast(decision, src=0)
    return bool(decision.item())


class SaveEveryMinutesCallback(TrainerCallback):
    """Save a checkpoint once `minutes` have passed since the last one (Sec. 6.1: "written at 10-minute intervals").

    Saving involves collectives, so all processes must save after the same update: rank 0's clock decides after
    every update and broadcasts its decision (one integer, negligible next to an update). The clock restarts at
    every save, step-based ones included, and when training (re)starts.
    """

    def __init__(self, minutes: float):
        if minutes <= 0:
            raise ValueError(f"minutes must be positive, got {minutes}.")
        self.interval = 60.0 * minutes
        self.last_save = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.last_save = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if _rank_zero_decides(time.monotonic() - self.last_save >= self.interval, args.device):
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        self.last_save = time.monotonic()


class StopAfterMinutesCallback(TrainerCallback):
    """Stop training, with a last checkpoint, once `minutes` have passed since it started (a wall-clock budget).

    As for `SaveEveryMinutesCallback`, rank 0's clock decides for every process. A resumed run gets the budget anew.
    """

    def __init__(self, minutes: float):
        if minutes <= 0:
            raise ValueError(f"minutes must be positive, got {minutes}.")
        self.minutes = minutes
        self.start = time.monotonic()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if _rank_zero_decides(time.monotonic() - self.start >= 60.0 * self.minutes, args.device):
            logger.info("Stopping at update %d: the budget of %g minutes is spent", state.global_step, self.minutes)
            control.should_training_stop = True
            control.should_save = True


class _SamplerEpochCallback(TrainerCallback):
    """Tells the token-budget sampler which epoch starts, so that its order depends on (seed, epoch) only.

    The Trainer and accelerate forward `set_epoch` themselves, except in one case: after resuming mid-epoch under
    several processes, the sampler sits below `SkipBatchSampler` and `BatchSamplerShard`, which do not forward it.
    The epoch is computed as the Trainer does when resuming: completed updates // updates per epoch.
    """

    def __init__(self):
        self.sampler: TokenBudgetBatchSampler | None = None

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kwargs):
        if self.sampler is None or train_dataloader is None:
            return
        updates_per_epoch = max(math.ceil(len(train_dataloader) / args.gradient_accumulation_steps), 1)
        self.sampler.set_epoch(state.global_step // updates_per_epoch)


# --------------------------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------------------------


def _token_counts(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """[real source, padded source, real target, padded target] tokens of one batch."""
    attention_mask, labels = inputs["attention_mask"], inputs["labels"]
    return torch.stack(
        [
            attention_mask.sum(),
            torch.tensor(attention_mask.numel(), device=attention_mask.device),
            labels.ne(-100).sum(),
            torch.tensor(labels.numel(), device=labels.device),
        ]
    ).to(torch.int64)


class TokenBudgetSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with token-budget batches, the schedule of Sec. 5.3 and BLEU on a validation sample.

    `args` must be `TranslationTrainingArguments`. Datasets are `datasets.Dataset`s with `input_ids`, `labels` (and
    `attention_mask`), as `modeling.data.tokenize_parallel_dataset` makes them. `bleu_dataset`, a fixed sample of
    the validation split, is translated by beam search at each evaluation and scored with `compute_metrics`, while
    the loss is computed on the whole `eval_dataset` (without generation, which would cost far more).

    Besides the Trainer's logs, each training log holds `tokens_per_second` (real source + target tokens over all
    processes), `source_tokens_per_update`, `target_tokens_per_update`, `padding_efficiency` (real / padded tokens)
    and `gradient_accumulation_steps`, measured on the batches of the logging interval.
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        args: TranslationTrainingArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: datasets.Dataset | None = None,
        eval_dataset: datasets.Dataset | dict[str, datasets.Dataset] | None = None,
        *,
        bleu_dataset: datasets.Dataset | None = None,
        **kwargs: Any,
    ):
        if not isinstance(args, TranslationTrainingArguments):
            raise TypeError("TokenBudgetSeq2SeqTrainer needs args=TranslationTrainingArguments(...).")
        if bleu_dataset is not None and not args.predict_with_generate:
            raise ValueError("BLEU on bleu_dataset needs predict_with_generate=True.")
        if args.tokens_per_update is not None and train_dataset is not None:
            args = copy.copy(args)  # the caller's arguments stay as given
            args.gradient_accumulation_steps = gradient_accumulation_steps_for(
                args.tokens_per_update,
                mean_target_tokens_per_batch(train_dataset, args.max_tokens_per_device),
                args.world_size,
            )
        super().__init__(model, args, data_collator, train_dataset, eval_dataset, **kwargs)
        self.bleu_dataset = bleu_dataset
        self._loss_only = False
        self._sampler_epoch = _SamplerEpochCallback()
        self.add_callback(self._sampler_epoch)
        if self.args.save_every_minutes is not None:
            self.add_callback(SaveEveryMinutesCallback(self.args.save_every_minutes))
        if self.args.max_train_minutes is not None:
            self.add_callback(StopAfterMinutesCallback(self.args.max_train_minutes))
        self._reset_throughput()
        # Sec. 5.4's label smoothing in the model's own fused loss when it has one, instead of `LabelSmoother`'s
        # several passes over the (B, T, V) log-probabilities: the same value (tested), faster.
        forward = inspect.signature(self.accelerator.unwrap_model(self.model).forward).parameters
        self._fused_label_smoothing = self.label_smoother is not None and "smoothing_epsilon" in forward
        if self._fused_label_smoothing:
            self.label_smoother = None

    # --- data ---

    @property
    def _data_seed(self) -> int:
        return self.args.data_seed if self.args.data_seed is not None else self.args.seed

    def _check_sharding(self) -> None:
        config = self.args.accelerator_config
        if self.accelerator.num_processes > 1 and (
            config.split_batches or config.dispatch_batches or not config.even_batches
        ):
            raise ValueError(
                "Token-budget batches are sharded whole, the same number to every process: keep accelerate's "
                "split_batches=False, dispatch_batches=False and even_batches=True."
            )

    def _token_dataset(self, dataset: Any, description: str) -> datasets.Dataset:
        if not isinstance(dataset, datasets.Dataset):
            raise TypeError(f"The {description} dataset must be a datasets.Dataset, got {type(dataset).__name__}.")
        missing = {"input_ids", "labels"} - set(dataset.column_names)
        if missing:
            raise ValueError(
                f"The {description} dataset lacks {sorted(missing)}: tokenize it with "
                "modeling.data.tokenize_parallel_dataset."
            )
        return self._remove_unused_columns(dataset, description=description)

    def _dataloader(self, dataset: datasets.Dataset, batch_sampler: Sampler[list[int]], training: bool) -> DataLoader:
        workers = self.args.dataloader_num_workers
        loader = DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            collate_fn=self.data_collator,
            num_workers=workers,
            pin_memory=self.args.dataloader_pin_memory and torch.cuda.is_available(),
            persistent_workers=self.args.dataloader_persistent_workers and workers > 0,
            prefetch_factor=self.args.dataloader_prefetch_factor if workers > 0 else None,
            worker_init_fn=partial(seed_worker, num_workers=workers, rank=self.args.process_index)
            if training
            else None,
        )
        return self.accelerator.prepare(loader)

    def get_train_dataloader(self) -> DataLoader:
        """Shuffled token-budget batches, sharded over processes by accelerate (see the module docstring)."""
        if self.train_dataset is None:
            raise ValueError("Training requires a train_dataset.")
        self._check_sharding()
        dataset = self._token_dataset(self.train_dataset, "training")
        sampler = TokenBudgetBatchSampler(
            *sequence_lengths(dataset), self.args.max_tokens_per_device, shuffle=True, seed=self._data_seed
        )
        self._sampler_epoch.sampler = sampler
        efficiency = sampler.padding_efficiency()
        logger.info(
            "Training on %d batches per epoch of at most %d padded tokens per side (padding efficiency %.3f), "
            "%d process(es), %d micro-batch(es) per update",
            len(sampler),
            self.args.max_tokens_per_device,
            efficiency["total"],
            self.accelerator.num_processes,
            self.args.gradient_accumulation_steps,
        )
        return self._dataloader(dataset, sampler, training=True)

    def get_eval_dataloader(self, eval_dataset: str | datasets.Dataset | None = None) -> DataLoader:
        """Token-budget batches in length order, each example on exactly one process."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Evaluation requires an eval_dataset.")
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        self._check_sharding()
        dataset = self._token_dataset(dataset, "evaluation")
        sampler = TokenBudgetBatchSampler(*sequence_lengths(dataset), self.args.max_tokens_per_device, shuffle=False)
        batches = split_batches_to_multiple(list(sampler), self.accelerator.num_processes)
        return self._dataloader(dataset, FixedBatchSampler(batches), training=False)

    # --- optimisation ---

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """The schedule of Sec. 5.3 with `learning_rate` as its multiplier, unless `paper_schedule=False`."""
        if not self.args.paper_schedule:
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            warmup = self.args.get_warmup_steps(num_training_steps)
            if warmup < 1:
                raise ValueError("The schedule of Sec. 5.3 needs warmup_steps ≥ 1 (the paper: 4000).")
            d_model = self.model.config.d_model
            self.lr_scheduler = noam_scheduler(optimizer or self.optimizer, d_model, warmup)
            self._created_lr_scheduler = True  # the Trainer rebuilds it on the next train() call
            peak = self.args.learning_rate * noam_learning_rate(warmup, d_model, warmup)
            logger.info(
                "Learning rate: %g × d_model^-0.5 × min(step^-0.5, step × %d^-1.5), peak %.3g at update %d",
                self.args.learning_rate,
                warmup,
                peak,
                warmup,
            )
            if peak < 1e-5:
                logger.warning(
                    "learning_rate=%g multiplies the schedule of Sec. 5.3 (1.0 is the paper), giving a peak rate of "
                    "%.2g; for a peak rate of %g use --no_paper_schedule.",
                    self.args.learning_rate,
                    peak,
                    self.args.learning_rate,
                )
        return self.lr_scheduler

    # --- logging ---

    def _reset_throughput(self) -> None:
        self._token_totals = torch.zeros(4, dtype=torch.int64, device=self.args.device)
        self._interval_start: float | None = None
        self._interval_first_update = 0

    def training_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        if self._interval_start is None:  # the interval starts at its first batch: evaluation and saving don't count
            self._interval_start = time.perf_counter()
            self._interval_first_update = self.state.global_step
        self._token_totals += _token_counts(inputs).to(self._token_totals.device)
        return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        if self._fused_label_smoothing and "labels" in inputs:
            inputs = {**inputs, "smoothing_epsilon": self.args.label_smoothing_factor}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _throughput_logs(self) -> dict[str, float]:
        source, source_padded, target, target_padded = self.accelerator.reduce(self._token_totals, "sum").tolist()
        seconds = time.perf_counter() - self._interval_start
        updates = max(self.state.global_step - self._interval_first_update, 1)
        self._reset_throughput()
        return {
            "tokens_per_second": (source + target) / seconds,
            "source_tokens_per_update": source / updates,
            "target_tokens_per_update": target / updates,
            "padding_efficiency": (source + target) / max(source_padded + target_padded, 1),
            "gradient_accumulation_steps": self.args.gradient_accumulation_steps,
        }

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # Training logs (those with "loss") are made on every process at the same update: reducing is safe there.
        if "loss" in logs and self._interval_start is not None:
            logs = {**logs, **self._throughput_logs()}
        super().log(logs, start_time)

    # --- evaluation ---

    def evaluate(
        self,
        eval_dataset: datasets.Dataset | dict[str, datasets.Dataset] | str | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
        **gen_kwargs: Any,
    ) -> dict[str, float]:
        """Loss on `eval_dataset`, without generating; when evaluating the trainer's own datasets, also BLEU on
        `bleu_dataset`, logged as `{metric_key_prefix}_sample_bleu` (and `_paper_bleu`, `_chrf`, `_loss`).

        `predict` translates and scores whatever it is given."""
        self._loss_only = True
        try:
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)
        finally:
            self._loss_only = False
        if eval_dataset is None and self.bleu_dataset is not None:
            metrics |= super().evaluate(self.bleu_dataset, ignore_keys, f"{metric_key_prefix}_sample", **gen_kwargs)
        return metrics

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
        **gen_kwargs: Any,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        # `Seq2SeqTrainer.prediction_step` fills unset fields of the model's generation config with library defaults,
        # among them max_length=20, which would then cap every later translation (and the saved generation config)
        # at 20 tokens instead of the paper's source length + 50: give it a copy and keep the original.
        generation_config = copy.deepcopy(self.model.generation_config)
        try:
            loss, generated, labels = super().prediction_step(
                model, inputs, prediction_loss_only or self._loss_only, ignore_keys=ignore_keys, **gen_kwargs
            )
        finally:
            self.model.generation_config = generation_config
        if generated is not None:
            # Token batches hold different numbers of sentences on different processes, and the evaluation loop
            # gathers equal shapes only: pad with rows of -100, which `bleu_metrics` drops.
            generated = self.accelerator.pad_across_processes(generated, dim=0, pad_index=-100)
            if labels is not None:
                labels = self.accelerator.pad_across_processes(labels, dim=0, pad_index=-100)
        return loss, generated, labels


def bleu_metrics(tokenizer: PreTrainedTokenizerBase, target_lang: str) -> Callable[[EvalPrediction], dict]:
    """`compute_metrics` for `Seq2SeqTrainer`: sacreBLEU, the paper's tokenised BLEU and chrF of the generations,
    and the number of sentences scored.

    References are the decoded labels: the detokenised target up to the BPE's unknown characters, good enough to
    follow training; final scores come from `modeling.evaluation` on the raw text. Rows whose labels are all -100
    are padding added to gather batches of unequal sizes (see `TokenBudgetSeq2SeqTrainer.prediction_step`).
    """
    pad = tokenizer.pad_token_id

    def compute(prediction: EvalPrediction) -> dict[str, float]:
        real = (prediction.label_ids != -100).any(axis=1)
        predictions, labels = prediction.predictions[real], prediction.label_ids[real]
        predictions = np.where(predictions != -100, predictions, pad)
        labels = np.where(labels != -100, labels, pad)
        hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        scores = corpus_scores(hypotheses, references, target_lang)
        return {
            "bleu": scores["sacrebleu"],
            "paper_bleu": scores["paper_bleu"],
            "chrf": scores["chrf"],
            "sentences": len(hypotheses),
        }

    return compute


# --------------------------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------------------------


def _load_text(data_args: DataArguments, *, evaluate: bool) -> tuple[datasets.DatasetDict, dict[str, int]]:
    """Training (and validation) pairs, as `{"train", "validation"}` splits of untokenised text, and the counts of
    training pairs removed by cleaning."""
    raw = load_parallel_dataset(
        source_lang=data_args.source_lang,
        target_lang=data_args.target_lang,
        dataset=data_args.dataset,
        language_pair=data_args.language_pair,
        data_dir=data_args.data_dir,
    )
    splits = {"train": raw[resolve_split(raw, "train")]}
    if evaluate:
        try:
            splits["validation"] = raw[resolve_split(raw, "validation")]
        except KeyError as err:
            raise ValueError(f"Evaluation needs a validation split ({err}); or pass --eval_strategy no.") from None
    text, cleaning = datasets.DatasetDict(splits), {}
    if data_args.clean:
        text, counts = clean_parallel_dataset(
            text, data_args.source_lang, data_args.target_lang, num_proc=data_args.preprocessing_num_workers
        )
        cleaning = counts["train"]
    if data_args.max_train_samples is not None:
        text["train"] = text["train"].select(range(min(data_args.max_train_samples, len(text["train"]))))
    return text, cleaning


def _tokenizer(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: TranslationTrainingArguments,
    train_text: datasets.Dataset,
    vocab_size: int,
) -> PreTrainedTokenizerBase:
    """The given tokenizer, the fine-tuned model's, the one of an earlier run in output_dir, or a new shared BPE.

    A new BPE (Sec. 5.1: "a shared source-target vocabulary") is trained by the main process and saved to
    output_dir at once, so that other processes, and a resumed run, load the very same vocabulary.
    """
    name = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    if name is not None:
        return AutoTokenizer.from_pretrained(name)
    output_dir = Path(training_args.output_dir)
    with training_args.main_process_first(local=False, desc="shared BPE"):
        if (output_dir / "tokenizer.json").is_file():
            logger.info("Using the tokenizer of the earlier run in %s", output_dir)
            return AutoTokenizer.from_pretrained(output_dir)
        languages = [data_args.source_lang, data_args.target_lang]
        tokenizer = train_shared_bpe(iter_corpus_text(train_text, languages), vocab_size)
        tokenizer.save_pretrained(output_dir)
        return tokenizer


def _model(model_args: ModelArguments, preset: TrainingPreset, vocab_size: int) -> TransformerForConditionalGeneration:
    """The preset's model, freshly initialised, or the weights of `model_name_or_path` to fine-tune."""
    overrides = model_args.config_overrides()
    if model_args.model_name_or_path is None:
        return TransformerForConditionalGeneration(preset.model_config(vocab_size, **overrides))
    architecture = sorted(set(overrides) - {"dropout"})
    if architecture:
        raise ValueError(f"{architecture} cannot change when fine-tuning {model_args.model_name_or_path}.")
    model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, **overrides)
    if model.config.vocab_size < vocab_size:
        raise ValueError(f"The tokenizer has {vocab_size} tokens, the model's vocabulary {model.config.vocab_size}.")
    return model


def bleu_sample(dataset: datasets.Dataset, size: int) -> datasets.Dataset:
    """A fixed random sample of `size` examples (the whole dataset if smaller), the same for every run."""
    if size >= len(dataset):
        return dataset
    indices = np.random.default_rng(BLEU_SAMPLE_SEED).choice(len(dataset), size, replace=False)
    return dataset.select(np.sort(indices))


def _resume_checkpoint(training_args: TranslationTrainingArguments) -> str | bool | None:
    """`resume_from_checkpoint` as `Trainer.train` takes it: "last" (or "true") means the newest in output_dir."""
    value = training_args.resume_from_checkpoint
    if value is not None and value.lower() in ("last", "true"):
        return True
    return value


def _write_run_records(
    trainer: TokenBudgetSeq2SeqTrainer,
    model_args: ModelArguments,
    data_args: DataArguments,
    text: datasets.DatasetDict,
    cleaning: dict[str, int],
    *,
    hub_model_id: str | None = None,
) -> None:
    """`training_args.json` and `data_stats.json` in output_dir, which the model card (`modeling.hub`) reads.

    `TrainingArguments.to_dict` writes every `*_token` field as a placeholder (`"<HUB_TOKEN>"`), never its value.
    `hub_model_id` is the repo of a push at the end of training, which the trainer's own arguments don't request.
    """
    args = trainer.args
    shown = {
        k: v
        for k, v in args.to_dict().items()
        if k not in ("per_device_train_batch_size", "per_device_eval_batch_size")
    }
    if hub_model_id is not None:
        shown |= {"push_to_hub": True, "hub_model_id": hub_model_id}
    if args.paper_schedule:
        shown.pop("lr_scheduler_type")
        shown["learning_rate_schedule"] = "learning_rate × d_model^-0.5 × min(step^-0.5, step × warmup^-1.5)"
    run = {
        "preset": model_args.preset,
        "model_name_or_path": model_args.model_name_or_path,
        "world_size": args.world_size,
    }
    write_json(Path(args.output_dir) / "training_args.json", {**shown, **run})
    stats = {
        "dataset": data_args.dataset or data_args.data_dir,
        "language_pair": f"{data_args.source_lang}-{data_args.target_lang}",
        "sentence_pairs": {split: len(part) for split, part in text.items()},
        "cleaning": cleaning,
        "vocab_size": len(trainer.processing_class),
    }
    write_json(Path(args.output_dir) / "data_stats.json", stats)


def _average_last_checkpoints(output_dir: str, n: int) -> Path | None:
    """Average the last `n` checkpoints into output_dir/averaged; return that directory, or None without any."""
    checkpoints = list_checkpoints(output_dir)[-n:]
    if len(checkpoints) < n:
        logger.warning("Averaging the %d checkpoints in %s rather than %d", len(checkpoints), output_dir, n)
    if not checkpoints:
        return None
    averaged = average_checkpoints(checkpoints, os.path.join(output_dir, "averaged"))
    logger.info("Averaged %s into %s", ", ".join(path.name for path in checkpoints), averaged)
    return averaged


# --- pushing at the end of training ---


@dataclass(frozen=True)
class _HubTarget:
    """The repo to push to, and the token checked before training (kept out of reprs and logs)."""

    repo_id: str
    token: str = field(repr=False)


def _prepare_push(training_args: TranslationTrainingArguments) -> _HubTarget | None:
    """Before training, on the main process: the token and the repo of the push at the end, checked now.

    A push that cannot happen (no token: `MissingHubTokenError`; an invalid repo name; a revision; no right to
    create the repo) fails here rather than after the whole run. The repo is `hub_model_id`, else output_dir's name
    as the Trainer names it; a name without namespace gets the token owner's (asked of the Hub now), which the model
    card needs. Returns None without `push_to_hub`, and on the other processes (only the main one pushes).
    """
    if not training_args.push_to_hub:
        return None
    if training_args.hub_revision is not None:
        raise ValueError("The push at the end of training goes to the main branch: --hub_revision is not supported.")
    if training_args.process_index != 0:
        return None
    from huggingface_hub.utils import validate_repo_id

    from .hub import resolve_token  # the Hub extras (jinja2, matplotlib) are needed only for a push

    token = resolve_token(training_args.hub_token)  # the argument, else HF_TOKEN, else `hf auth login`
    repo_id = training_args.hub_model_id or Path(training_args.output_dir).absolute().name
    validate_repo_id(repo_id)
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    if "/" not in repo_id:
        repo_id = f"{api.whoami()['name']}/{repo_id}"
    # Creating the repo now proves the token may write there, before hours of training rather than after.
    api.create_repo(repo_id, private=bool(training_args.hub_private_repo), exist_ok=True, repo_type="model")
    if training_args.hub_strategy in ("checkpoint", "all_checkpoints"):
        logger.warning("hub_strategy=%s is not used: checkpoints are not pushed.", training_args.hub_strategy.value)
    logger.info("The model will be pushed to %s at the end of training", repo_id)
    return _HubTarget(repo_id, token)


def _without_hub_push(training_args: TranslationTrainingArguments) -> TranslationTrainingArguments:
    """The Trainer's copy of the arguments: it must not push (its card has no translation task and drops BLEU),
    and, since it saves its arguments in every checkpoint (`training_args.bin`), holds no token either."""
    if not training_args.push_to_hub and training_args.hub_token is None:
        return training_args
    args = copy.copy(training_args)
    args.push_to_hub = False
    args.hub_token = None
    return args


def _stage_card_inputs(model_dir: Path, output_dir: Path, staging: Path) -> None:
    """Copy what the card is rendered from into `staging`: the run's records (output_dir), and evaluation JSONs of
    `model_dir` (in it or in its `eval/`, where `scripts/evaluate.py --output-dir` usually puts them).

    Only `model_dir`'s own are searched: those of the final model never describe the averaged one. An evaluation
    JSON older than the weights scored an earlier model (a previous run in this output_dir): it is left out of the
    card with a warning.
    """
    from .hub import DATA_STATS_FILE, EVAL_RESULTS_GLOB, TRAINER_STATE_FILE, TRAINING_ARGS_FILE

    for name in (TRAINER_STATE_FILE, TRAINING_ARGS_FILE, DATA_STATS_FILE):
        if (output_dir / name).is_file():
            shutil.copy(output_dir / name, staging / name)
    weights_time = min(path.stat().st_mtime for path in model_dir.glob("*.safetensors"))
    found = sorted(path for directory in (model_dir, model_dir / "eval") for path in directory.glob(EVAL_RESULTS_GLOB))
    fresh = [path for path in found if path.stat().st_mtime >= weights_time]
    stale = [str(path) for path in found if path not in fresh]
    if stale:
        logger.warning(
            "Left out of the model card, older than the weights of %s: %s. Evaluate this model with "
            "scripts/evaluate.py and push again with scripts/push_to_hub.py --card-from to add its scores.",
            model_dir,
            ", ".join(stale),
        )
    for index, path in enumerate(fresh):  # distinct names: eval/ may hold a file of the same name
        shutil.copy(path, staging / f"eval_results_{index}_{path.name.removeprefix('eval_results_')}")


def _push_trained_model(
    target: _HubTarget, model_dir: Path, output_dir: Path, description: str, private: bool | None
) -> str:
    """Write the model card into `model_dir` and push it as `scripts/push_to_hub.py` does; return the repo URL."""
    from .hub import check_model_dir, push_model_dir, write_model_card

    check_model_dir(model_dir)
    with tempfile.TemporaryDirectory() as staging:
        _stage_card_inputs(model_dir, output_dir, Path(staging))
        card = write_model_card(model_dir, repo_id=target.repo_id, card_from=[staging])
    logger.info("Pushing %s (%s, model card %s) to %s", description, model_dir, card, target.repo_id)
    try:
        url = push_model_dir(model_dir, target.repo_id, token=target.token, private=bool(private))
    except Exception:
        logger.error(
            "The push failed; the model is saved. Retry with: python scripts/push_to_hub.py --model %s --repo-id %s",
            model_dir,
            target.repo_id,
        )
        raise
    logger.info("Pushed %s to %s", model_dir, url)
    return url


def train(model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments) -> str:
    """Train (or fine-tune) a Transformer and save it, with tokenizer and generation config, to `output_dir`.

    Steps: load and clean the parallel text (`modeling.data`), train the shared BPE unless one is given, build the
    preset's model (or load `model_name_or_path`), train with `TokenBudgetSeq2SeqTrainer` (resuming when
    `resume_from_checkpoint` is set), save the final model, and average the last `average_last_checkpoints`
    checkpoints into `output_dir/averaged` (Sec. 6.1). Returns `output_dir`.

    With `push_to_hub`, the main process then pushes the averaged model (`average_last_checkpoints` > 1), else the
    final one, to `hub_model_id` (default: output_dir's name), with the model card of `modeling.hub` rendered from
    this run's records, instead of the Trainer's own pushes. The token (`hub_token`, else HF_TOKEN, else
    `hf auth login`) and the repo name are checked before anything else: a push that cannot happen fails first.
    """
    hub = _prepare_push(training_args)
    preset = get_preset(model_args.preset)
    set_seed(training_args.seed)  # the same initial weights on every process and every run
    evaluate = training_args.eval_strategy != "no"
    text, cleaning = _load_text(data_args, evaluate=evaluate)
    vocab_size = data_args.vocab_size or preset.vocab_size
    tokenizer = _tokenizer(model_args, data_args, training_args, text["train"], vocab_size)
    model = _model(model_args, preset, len(tokenizer))
    with training_args.main_process_first(local=False, desc="tokenisation"):
        tokenized = tokenize_parallel_dataset(
            text,
            tokenizer,
            data_args.source_lang,
            data_args.target_lang,
            max_length=data_args.max_length,
            num_proc=data_args.preprocessing_num_workers,
        )
    bleu_size = data_args.bleu_sample_size if data_args.bleu_sample_size is not None else preset.bleu_sample_size
    trainer = TokenBudgetSeq2SeqTrainer(
        model=model,
        args=_without_hub_push(training_args),
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"] if evaluate else None,
        bleu_dataset=bleu_sample(tokenized["validation"], bleu_size) if evaluate and bleu_size > 0 else None,
        processing_class=tokenizer,
        compute_metrics=bleu_metrics(tokenizer, data_args.target_lang),
    )
    if trainer.is_world_process_zero():
        _write_run_records(trainer, model_args, data_args, text, cleaning, hub_model_id=hub.repo_id if hub else None)
    result = trainer.train(resume_from_checkpoint=_resume_checkpoint(training_args))
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    averaged = None
    if training_args.average_last_checkpoints > 1 and trainer.is_world_process_zero():
        averaged = _average_last_checkpoints(training_args.output_dir, training_args.average_last_checkpoints)
    if hub is not None:
        output_dir = Path(training_args.output_dir)
        pushed, description = (averaged, "the averaged model") if averaged else (output_dir, "the final model")
        _push_trained_model(hub, pushed, output_dir, description, private=training_args.hub_private_repo)
    return training_args.output_dir


__all__ = [
    "PRESETS",
    "TrainingPreset",
    "get_preset",
    "noam_learning_rate",
    "NoamSchedule",
    "noam_scheduler",
    "gradient_accumulation_steps_for",
    "mean_target_tokens_per_batch",
    "FixedBatchSampler",
    "split_batches_to_multiple",
    "TranslationTrainingArguments",
    "ModelArguments",
    "DataArguments",
    "SaveEveryMinutesCallback",
    "TokenBudgetSeq2SeqTrainer",
    "bleu_metrics",
    "bleu_sample",
    "train",
]
