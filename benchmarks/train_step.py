"""Benchmark 1: one training step (forward + backward + fused AdamW) on identical, fixed-shape padded batches.

This model against its exact MarianMT twin (same random weights through `modeling.convert.to_marian`), each with
eager and sdpa attention. Throughput is reported in tokens/s (source + target positions of the padded batch, as
all of them are computed) and in achieved GFLOP/s (analytic count, `harness.training_flops`) as a fraction of
the fp32 matrix-multiply peak measured in the same loop, so that load from other processes lowers both alike.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

import torch
from fixtures import ModelSize, adamw, random_model, training_update, transformer_config, with_attention
from harness import (
    Section,
    add_matmul_peak_contenders,
    format_spread,
    measure_alternating,
    model_shape,
    peak_gflops,
    ratio,
    training_flops,
)

from modeling.convert import to_marian

BATCH_SIZE, SEQUENCE_LENGTH = 32, 24
PAD, EOS = 0, 2
FIRST_ORDINARY_ID = 3  # after <pad>, <unk>, </s>


def padded_batches(
    count: int, batch_size: int, length: int, vocab_size: int, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    """`count` batches of shape batch_size × length on both sides, as a collator pads them: each row's real length
    is drawn from [length/2, length] (one row per side is full, so the shape is fixed), ends in </s>, and is
    followed by <pad> in `input_ids` and -100 in `labels`."""
    generator = torch.Generator().manual_seed(seed)

    def side(pad_value: int) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.randint(length // 2, length + 1, (batch_size,), generator=generator)
        lengths[0] = length
        ids = torch.randint(FIRST_ORDINARY_ID, vocab_size, (batch_size, length), generator=generator)
        positions = torch.arange(length)[None, :]
        ids[positions == (lengths[:, None] - 1)] = EOS
        real = positions < lengths[:, None]
        return ids.masked_fill(~real, pad_value), real.long()

    batches = []
    for _ in range(count):
        input_ids, attention_mask = side(PAD)
        labels, _ = side(-100)
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return batches


def step_contender(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]], steps: int) -> Callable[[], None]:
    """`steps` training updates per call, cycling through the shared batches; the model keeps its own AdamW."""
    model.train()
    optimizer = adamw(model)
    cycle = itertools.cycle(batches)

    def call() -> None:
        for _ in range(steps):
            training_update(model, optimizer, next(cycle))

    return call


def step_flops(size: ModelSize) -> int:
    """The analytic FLOPs credited to one training step on the benchmark's padded batches."""
    shape = model_shape(transformer_config(size))
    return training_flops(**shape, batch_size=BATCH_SIZE, source_length=SEQUENCE_LENGTH, target_length=SEQUENCE_LENGTH)


def contender_name(model_name: str, attention: str) -> str:
    return f"{model_name} ({attention})"


def training_contenders(size: ModelSize, attentions: list[str]) -> dict[str, torch.nn.Module]:
    """{name: model}: this model and its Marian twin for each attention implementation, all from one seed."""
    ours = random_model(transformer_config(size))
    marian = to_marian(ours)
    models = {}
    for attention in attentions:
        models[contender_name("this model", attention)] = with_attention(copy.deepcopy(ours), attention)
        models[contender_name("MarianMT", attention)] = with_attention(copy.deepcopy(marian), attention)
    return models


def run_train_step(
    size: ModelSize, attentions: list[str], repeats: int, steps_per_call: int, peak_sizes: list[int]
) -> Section:
    batches = padded_batches(4, BATCH_SIZE, SEQUENCE_LENGTH, size.vocab_size)
    models = training_contenders(size, attentions)
    contenders: dict[str, Callable[[], object]] = {
        name: step_contender(model, batches, steps_per_call) for name, model in models.items()
    }
    matmul_flops = add_matmul_peak_contenders(contenders, peak_sizes)
    timings = measure_alternating(contenders, repeats)

    peak = peak_gflops(timings, matmul_flops)
    tokens = steps_per_call * BATCH_SIZE * 2 * SEQUENCE_LENGTH
    flops = steps_per_call * step_flops(size)
    section = Section(
        title=f"Training step: {BATCH_SIZE}×{SEQUENCE_LENGTH} padded batches, forward + backward + fused AdamW",
        headers=["contender", "tokens/s (median)", "min–max", "GFLOP/s", "% of fp32 peak", "vs MarianMT"],
    )
    for attention in attentions:
        baseline = timings[contender_name("MarianMT", attention)].rate(tokens).median
        for model_name in ("this model", "MarianMT"):
            name = contender_name(model_name, attention)
            rate = timings[name].rate(tokens)
            gflops = timings[name].rate(flops / 1e9).median
            percent = f"{100 * gflops / peak:.0f}%"
            section.rows.append(
                [name, rate.median, format_spread(rate), gflops, percent, ratio(rate.median, baseline)]
            )
            section.data.setdefault("tokens_per_second", {})[name] = rate.to_dict()
            section.data.setdefault("gflops", {})[name] = gflops
    for name, matmul in matmul_flops.items():
        rate = timings[name].rate(matmul / 1e9)
        section.rows.append([f"{name} (GFLOP/s)", rate.median, format_spread(rate), "", "", ""])
        section.data.setdefault("matmul_gflops", {})[name] = rate.to_dict()
    section.data["peak_gflops"] = peak
    section.data["flops_per_step"] = flops / steps_per_call
    section.notes += [
        f"{tokens // steps_per_call} token positions per step (source + target, padding included: real lengths "
        f"are drawn from [{SEQUENCE_LENGTH // 2}, {SEQUENCE_LENGTH}]); {flops / steps_per_call / 1e9:.1f} GFLOP per "
        "step, counted analytically (6 × matmul parameters × tokens + attention, see harness.forward_flops).",
        "Both models are credited the same FLOPs; this model's training forward fuses the output projection with "
        "the loss and computes it on labelled positions only, so it executes fewer than it is credited.",
        f"fp32 peak = best median GFLOP/s of torch.mm (MKL) and, where this model takes it, oneDNN at "
        f"{peak_sizes}, timed in the same alternating loop: {peak:.1f} GFLOP/s.",
        f"{repeats} repeats of {steps_per_call} step(s) each after one warm-up call, contenders alternating; "
        f"torch threads = {torch.get_num_threads()}.",
    ]
    return section
