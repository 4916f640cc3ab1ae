"""`Seq2SeqTrainer` with the paper's recipe: token-budget batches, the schedule of Sec. 5.3, BLEU while training.

What `TokenBudgetSeq2SeqTrainer` adds to the Trainer, and why:

- **Token-budget batches** (Sec. 5.1: "approximately 25000 source tokens and 25000 target tokens") from
  `modeling.batching.TokenBudgetBatchSampler`, sharded over processes by accelerate, and a number of
  **micro-batches per update derived from the world size**, so an update holds the same number of tokens on 1 or
  8 GPUs.
- **The exact schedule** of Sec. 5.3 (`modeling.schedule`), `learning_rate` being its multiplier.
- **Validation**: loss on the whole validation split, and BLEU by the paper's beam search on a fixed sample of it.
- **Label smoothing in the model's fused loss** (its `smoothing_epsilon` argument) instead of the Trainer's
  `LabelSmoother`, which needs the (B, T, V) logits and makes several passes over them: the training forward fuses
  the output projection with the loss and never builds them; the same value and gradients.
- **Time-based checkpoints and a wall-clock budget** (`modeling.callbacks`).

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
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler
from transformers import EvalPrediction, PreTrainedTokenizerBase, Seq2SeqTrainer
from transformers.trainer_utils import seed_worker

from .arguments import TranslationTrainingArguments
from .batching import (
    FixedBatchSampler,
    TokenBudgetBatchSampler,
    gradient_accumulation_steps_for,
    mean_target_tokens_per_batch,
    sequence_lengths,
    split_batches_to_multiple,
)
from .callbacks import SamplerEpochCallback, SaveEveryMinutesCallback, StopAfterMinutesCallback
from .schedule import noam_learning_rate, noam_scheduler
from .scoring import corpus_scores

logger = logging.getLogger(__name__)


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
        self._sampler_epoch = SamplerEpochCallback()
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
