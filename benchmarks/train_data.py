"""Benchmark 2: training on real data, where batching decides how much of the work is padding.

Three pipelines, each a fixed number of AdamW updates on Multi30k en→de with the same shared BPE, the same
initial weights and about the same real tokens per update:

- this project: this model with the batches `modeling.trainer.TokenBudgetSeq2SeqTrainer` builds
  (`TokenBudgetBatchSampler`: similar lengths, a padded-token budget per side);
- MarianMT with the batches `Seq2SeqTrainer` builds by default (random 64-sentence batches), and with
  `train_sampling_strategy="group_by_length"`.

The budget is calibrated so that an epoch has as many token-budget batches as 64-sentence batches, hence the same
real tokens per update on average. All three take their batches from their trainer's `get_train_dataloader()`
and run the same loop (`fixtures.training_update`), so that only model and batching differ (the Trainer's own
loop adds the same bookkeeping to all). Collation is inside the timed region, as it is inside a Trainer's. The
rate reported is real (non-padding) source + target tokens per second.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch
from fixtures import (
    Corpus,
    ModelSize,
    adamw,
    random_model,
    seq2seq_collator,
    token_budget_sampler,
    training_update,
    transformer_config,
    with_attention,
)
from harness import Section, format_spread, measure_alternating, ratio
from torch.utils.data import DataLoader
from transformers import PreTrainedModel, Seq2SeqTrainer, Seq2SeqTrainingArguments

from modeling.arguments import TranslationTrainingArguments
from modeling.batching import padding_efficiency, sequence_lengths
from modeling.convert import to_marian
from modeling.trainer import TokenBudgetSeq2SeqTrainer

SENTENCES_PER_BATCH = 64
OURS = "this model + token-budget batches"
MARIAN_STRATEGIES = {  # pipeline name: Seq2SeqTrainingArguments.train_sampling_strategy
    "MarianMT + Seq2SeqTrainer default (random)": "random",
    "MarianMT + Seq2SeqTrainer group_by_length": "group_by_length",
}


def calibrated_max_tokens(corpus: Corpus, batches_per_epoch: int) -> int:
    """The smallest per-side token budget whose epoch has at most `batches_per_epoch` batches (bisection)."""
    low, high = 1, 1 << 16
    while low < high:
        middle = (low + high) // 2
        if len(token_budget_sampler(corpus, middle)) > batches_per_epoch:
            low = middle + 1
        else:
            high = middle
    return low


def trainer_loader(
    corpus: Corpus, model: PreTrainedModel, output_dir: str, max_tokens: int | None = None, strategy: str = "random"
) -> DataLoader:
    """The training dataloader exactly as the trainer builds it: this project's `TokenBudgetSeq2SeqTrainer` with
    `max_tokens` padded tokens per side, or else `Seq2SeqTrainer` with 64-sentence batches and
    `train_sampling_strategy=strategy`."""
    common = {"output_dir": output_dir, "use_cpu": True, "report_to": "none", "seed": 0}
    if max_tokens is not None:
        arguments = TranslationTrainingArguments(max_tokens_per_device=max_tokens, **common)
        trainer_class = TokenBudgetSeq2SeqTrainer
    else:
        arguments = Seq2SeqTrainingArguments(
            per_device_train_batch_size=SENTENCES_PER_BATCH, train_sampling_strategy=strategy, **common
        )
        trainer_class = Seq2SeqTrainer
    trainer = trainer_class(
        model=model,
        args=arguments,
        train_dataset=corpus.train,
        data_collator=seq2seq_collator(corpus.tokenizer, model),
        processing_class=corpus.tokenizer,
    )
    return trainer.get_train_dataloader()


def endless(loader: DataLoader) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of epoch after epoch, reshuffled as the Trainer does (accelerate's `set_epoch`)."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


class Pipeline:
    """A model, its optimiser and its batch stream; each call runs `updates` updates and counts tokens."""

    def __init__(self, model: PreTrainedModel, loader: DataLoader, updates: int):
        self.model = model.train()
        self.optimizer = adamw(model)
        self.batches = endless(loader)
        self.updates = updates
        self.real_tokens = self.padded_tokens = 0

    def __call__(self) -> float:
        real = padded = 0
        for _ in range(self.updates):
            batch = next(self.batches)
            training_update(self.model, self.optimizer, batch)
            real += int(batch["attention_mask"].sum()) + int(batch["labels"].ne(-100).sum())
            padded += batch["input_ids"].numel() + batch["labels"].numel()
        self.real_tokens += real
        self.padded_tokens += padded
        return real


def epoch_padding_efficiency(corpus: Corpus, index_batches: Iterable[list[int]]) -> float:
    source, target = sequence_lengths(corpus.train)
    return padding_efficiency(index_batches, source, target)["total"]


def run_train_data(corpus: Corpus, size: ModelSize, repeats: int, updates_per_call: int) -> Section:
    ours = with_attention(random_model(transformer_config(size, vocab_size=len(corpus.tokenizer))), "sdpa")
    batches_per_epoch = -(-len(corpus.train) // SENTENCES_PER_BATCH)
    max_tokens = calibrated_max_tokens(corpus, batches_per_epoch)

    with tempfile.TemporaryDirectory() as output_dir:
        ours_loader = trainer_loader(corpus, ours, output_dir, max_tokens=max_tokens)
        loaders: dict[str, tuple[PreTrainedModel, DataLoader]] = {OURS: (ours, ours_loader)}
        for name, strategy in MARIAN_STRATEGIES.items():
            marian = with_attention(to_marian(ours), "sdpa")
            loaders[name] = (marian, trainer_loader(corpus, marian, output_dir, strategy=strategy))
        epoch_efficiency = {
            name: epoch_padding_efficiency(corpus, loader.batch_sampler) for name, (_, loader) in loaders.items()
        }
        pipelines = {name: Pipeline(model, loader, updates_per_call) for name, (model, loader) in loaders.items()}
        contenders: dict[str, Callable[[], float]] = dict(pipelines)
        timings = measure_alternating(contenders, repeats)

    baseline = timings[next(iter(MARIAN_STRATEGIES))].rate().median
    section = Section(
        title=f"Training on {corpus.name} en→de: real (non-padding) tokens/s",
        headers=[
            "pipeline",
            "real tokens/s (median)",
            "min–max",
            "vs Marian default",
            "real/padded (timed batches)",
            "real/padded (epoch)",
            "real tokens per update",
        ],
    )
    for name, pipeline in pipelines.items():
        rate = timings[name].rate()
        calls = repeats + 1  # the warm-up call also trained
        section.rows.append(
            [
                name,
                rate.median,
                format_spread(rate),
                ratio(rate.median, baseline),
                pipeline.real_tokens / pipeline.padded_tokens,
                epoch_efficiency[name],
                pipeline.real_tokens / (calls * updates_per_call),
            ]
        )
        section.data.setdefault("real_tokens_per_second", {})[name] = rate.to_dict()
        section.data.setdefault("padding_efficiency_timed", {})[name] = pipeline.real_tokens / pipeline.padded_tokens
        section.data.setdefault("padding_efficiency_epoch", {})[name] = epoch_efficiency[name]
    lengths = np.add(*sequence_lengths(corpus.train))
    section.data["max_tokens"] = max_tokens
    section.notes += [
        f"{len(corpus.train):,} training pairs; token budget {max_tokens} padded tokens per side gives "
        f"{len(ours_loader.batch_sampler)} batches per epoch, as {SENTENCES_PER_BATCH}-sentence batches give "
        f"{batches_per_epoch} "
        f"(mean {SENTENCES_PER_BATCH * lengths.mean():.0f} real tokens per update).",
        f"{repeats} repeats of {updates_per_call} update(s) per pipeline after one warm-up call, alternating; "
        "sdpa attention, fused AdamW, same initial weights; collation is timed, as in a Trainer.",
        "Batches from each trainer's get_train_dataloader() (TokenBudgetSeq2SeqTrainer, Seq2SeqTrainer); the loop "
        "is the benchmark's own (fixtures.training_update) for all three, so that only model and batching differ.",
    ]
    return section
