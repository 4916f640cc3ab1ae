"""Where a training step's time goes, against the fp32 matrix-multiply peak: this model on `train_step`'s batches.

    python benchmarks/investigations/profile_training.py            # a profiled pass, then 5 repeats of 4 steps
    python benchmarks/investigations/profile_training.py --compile  # also under torch.compile, whole and per layer
    python benchmarks/investigations/profile_training.py --quick    # tiny sizes, seconds: checks that it runs

First, one profiled pass over the batches (its top operators are printed last) and one step recording the shapes
of its matrix products. Then contenders, alternating in one loop as in `run.py`: the training step of the
`train_step` benchmark (forward + backward + fused AdamW on the same fixed 32 × 24 batches, dropout 0.1); the same
step with dropout 0 (same initial weights): what the dropout masks cost; the step's own matrix products alone,
replayed on preallocated, contiguous operands of the recorded shapes (`aten::mm`, `addmm`, `bmm`, `baddbmm`, and
oneDNN's linear kernel on x86 CPUs), which is about as fast as they run on this machine; and `torch.mm` (and oneDNN)
at the peak sizes. Each step is put as a share
of the peak with the FLOPs the benchmark credits it (`harness.training_flops`), and the time a step may take at
0.7 of the peak is set against the matrix products alone.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: fixtures, harness, ...

import torch
import transformers
from fixtures import ISSUE_SIZE, QUICK_SIZE, adamw, random_model, training_update, transformer_config, with_attention
from harness import (
    Stats,
    add_matmul_peak_contenders,
    format_spread,
    markdown_table,
    measure_alternating,
    operator_table,
    peak_gflops,
    positive_int,
)
from torch.profiler import ProfilerActivity, profile
from train_step import BATCH_SIZE, SEQUENCE_LENGTH, padded_batches, step_contender, step_flops

from modeling import TransformerForConditionalGeneration
from modeling.onednn_transformer import matmul_transposed

# ATen's products, and oneDNN's linear kernel that the model's linear layers take on x86 CPUs (input (..., K), weight
# (N, K)).
ONEDNN_LINEAR = "mkldnn::_linear_pointwise"
MATRIX_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", ONEDNN_LINEAR)
PEAK_FRACTION_GOAL = 0.7  # the issue's goal for the training step on CPU


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 repeat: a smoke test, not a measurement")
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--steps", type=positive_int, default=4, help="training steps per timed call")
    parser.add_argument("--attention", default="sdpa")
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--compile", action="store_true", help="also time the step under torch.compile")
    parser.add_argument("--top", type=positive_int, default=20, help="operators listed")
    return parser.parse_args()


@dataclass
class StepProfile:
    matrix_products: list[tuple[str, list[list[int]]]]  # (operator, input shapes) of one step, in order
    operators: str  # markdown table of the top operators
    share_inside_operators: float
    milliseconds_per_step: float


def profile_steps(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]], top: int) -> StepProfile:
    """One warm-up pass over `batches`, one step recording the matrix products' shapes, then a profiled pass."""
    model.train()
    optimizer = adamw(model)
    for batch in batches:
        training_update(model, optimizer, batch)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        training_update(model, optimizer, batches[0])
    products = [(event.name, event.input_shapes) for event in prof.events() if event.name in MATRIX_PRODUCTS]
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            training_update(model, optimizer, batch)
    wall_us = (time.perf_counter() - start) * 1e6
    operators, inside = operator_table(prof, len(batches), wall_us, top)
    return StepProfile(products, operators, inside, wall_us / 1e3 / len(batches))


def replay_contender(products: list[tuple[str, list[list[int]]]]) -> tuple[Callable[[], None], float]:
    """A contender running `products` one after the other on fixed random operands, and their FLOP count.

    addmm and baddbmm replay as mm and bmm: their bias is an elementwise add, not part of the product; oneDNN's
    linear kernel replays as itself (`matmul_transposed`), without its bias."""
    generator = torch.Generator().manual_seed(0)
    aten_operands, onednn_operands = [], []
    flops = 0.0
    for name, shapes in products:
        if name == ONEDNN_LINEAR:
            first, weight = shapes[:2]  # (..., K), (N, K)
            rows = torch.randn(math.prod(first[:-1]), first[-1], generator=generator)  # (M, K)
            onednn_operands.append((rows, torch.randn(weight, generator=generator)))
            flops += 2.0 * math.prod(first) * weight[0]
            continue
        first, second = shapes[1:3] if name in ("aten::addmm", "aten::baddbmm") else shapes[:2]
        a = torch.randn(first, generator=generator)  # (M, K) or (B, M, K)
        b = torch.randn(second, generator=generator)  # (K, N) or (B, K, N)
        aten_operands.append((a, b, torch.empty(*first[:-1], second[-1])))
        flops += 2.0 * math.prod(first) * second[-1]

    def call() -> None:
        for a, b, out in aten_operands:
            torch.matmul(a, b, out=out)
        for rows, weight in onednn_operands:
            matmul_transposed(rows, weight)

    return call, flops


def with_compiled_layers(model: TransformerForConditionalGeneration) -> TransformerForConditionalGeneration:
    """Each encoder and decoder layer under torch.compile; embeddings and the fused loss stay eager (compiling the
    whole model takes the unfused loss)."""
    for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
        layer.compile()
    return model


def main() -> None:
    arguments = parse_arguments()
    torch.set_num_threads(arguments.threads)
    transformers.logging.set_verbosity_error()
    size, peak_sizes = (QUICK_SIZE, [256]) if arguments.quick else (ISSUE_SIZE, [1024, 2048])
    repeats, steps = (1, 1) if arguments.quick else (arguments.repeats, arguments.steps)
    batches = padded_batches(4, BATCH_SIZE, SEQUENCE_LENGTH, size.vocab_size)

    def training_model(dropout: float) -> torch.nn.Module:
        return with_attention(random_model(transformer_config(size, dropout=dropout)), arguments.attention)

    # Profiled first, on a model of its own, so that the timed contenders do not share its state.
    profiled = profile_steps(training_model(0.1), batches, arguments.top)
    replay, replay_flops = replay_contender(profiled.matrix_products)
    timed_steps: dict[str, Callable[[], object]] = {
        "training step": step_contender(training_model(0.1), batches, steps),
        "training step, dropout 0": step_contender(training_model(0.0), batches, steps),
    }
    if arguments.compile:
        timed_steps["training step, torch.compile"] = step_contender(
            torch.compile(training_model(0.1)), batches, steps
        )
        timed_steps["training step, torch.compile of each layer"] = step_contender(
            with_compiled_layers(training_model(0.1)), batches, steps
        )
    timed_steps["its matrix products alone"] = lambda: [replay() for _ in range(steps)]
    contenders = dict(timed_steps)
    matmul_flops = add_matmul_peak_contenders(contenders, peak_sizes)
    timings = measure_alternating(contenders, repeats)

    peak = peak_gflops(timings, matmul_flops)
    credited = step_flops(size)
    per_step = {
        name: Stats.of([1e3 * seconds / steps for seconds in timings[name].seconds]) for name in timed_steps
    }  # milliseconds
    rows = []
    for name, milliseconds in per_step.items():
        executed = replay_flops if name == "its matrix products alone" else credited
        gflops = executed / milliseconds.median / 1e6
        rows.append([name, milliseconds.median, format_spread(milliseconds), gflops, f"{100 * gflops / peak:.0f}%"])
    budget = 1e3 * credited / (PEAK_FRACTION_GOAL * peak * 1e9)
    step_ms = per_step["training step"].median
    products_ms = per_step["its matrix products alone"].median
    no_dropout_ms = per_step["training step, dropout 0"].median

    print(f"### Training step of `train_step` ({arguments.attention}, {torch.get_num_threads()} threads)\n")
    print(markdown_table(["contender", "ms per step (median)", "min–max", "GFLOP/s", "% of fp32 peak"], rows))
    print(
        f"\n- GFLOP/s: the steps are credited {credited / 1e9:.1f} GFLOP each (`harness.training_flops`); the "
        f"replay executes {replay_flops / 1e9:.1f} GFLOP in {len(profiled.matrix_products)} products (the fused "
        "loss computes the output projection on labelled positions only; products inside sdpa's kernel are not "
        "recorded). "
        f"fp32 peak: {peak:.0f} GFLOP/s, best median of torch.mm and (x86) oneDNN at {peak_sizes}.\n"
        f"- At {PEAK_FRACTION_GOAL} of the peak a step may take {budget:.1f} ms. Its matrix products alone take "
        f"{products_ms:.1f} ms, which leaves {budget - products_ms:.1f} ms for everything else; the step spends "
        f"{step_ms - products_ms:.1f} ms on it now, {step_ms - no_dropout_ms:.1f} ms of it on dropout.\n"
        f"- {repeats} repeats of {steps} step(s) each after one warm-up call, contenders alternating."
    )

    print(
        f"\n### Top operators over {len(batches)} profiled steps\n\n{profiled.milliseconds_per_step:.0f} ms a step "
        f"(profiled), {100 * profiled.share_inside_operators:.0f}% of it inside ATen operators\n"
    )
    print(profiled.operators)


if __name__ == "__main__":
    main()
