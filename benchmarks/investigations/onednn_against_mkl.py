"""oneDNN against MKL for this model's float32 linear layers on this CPU: which one `onednn_transformer` should take.

    python benchmarks/investigations/onednn_against_mkl.py --threads 1 --repeats 5

`modeling/onednn_transformer.py` runs the linear layers on oneDNN on x86 CPUs not made by Intel, and leaves them on
MKL (PyTorch's own) on Intel's. This script times both on the CPU it runs on, whatever that choice, alternated in
one process (the module's choice switched around each call, oneDNN forced where it would not be taken), medians of
`--repeats`:

- **training**: 4 updates (AdamW, dropout) of the tiny preset's size (d_model 128) and of the benchmarks' (d_model
  256), on token batches of about 1,900 source tokens, as the CPU demo trains;
- **generation**: beam 4 at a fixed output length (16 sentences of 8-19 tokens, 24 new tokens), random weights
  (a difference between the two ways' tokens is printed).

It prints the CPU's vendor, the time of each and MKL's speed over oneDNN's (above 1: MKL is the faster).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: fixtures, harness, ...

import torch
from fixtures import ModelSize, random_model, transformer_config
from harness import measure_alternating, positive_int

from modeling import onednn_transformer

SIZES = {
    "tiny preset (d_model 128)": ModelSize(d_model=128, layers=3, heads=4, ffn_dim=512, vocab_size=8000),
    "benchmarks' size (d_model 256)": ModelSize(d_model=256, layers=3, heads=4, ffn_dim=1024, vocab_size=8000),
}


def on_kernel(function: Callable[[], object], onednn: bool) -> Callable[[], object]:
    """`function` with this model's linear layers on oneDNN (`onednn`) or on MKL."""

    def run() -> object:
        taken = onednn_transformer._ONEDNN_LINEAR
        onednn_transformer._ONEDNN_LINEAR = onednn
        try:
            return function()
        finally:
            onednn_transformer._ONEDNN_LINEAR = taken

    return run


def token_batches(vocab_size: int, count: int, seed: int, tokens: int = 1900) -> list[dict[str, torch.Tensor]]:
    """`count` batches of about `tokens` source tokens, each of one length between 8 and 40."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        length = rng.randint(8, 40)
        rows = tokens // length
        source = torch.randint(4, vocab_size, (rows, length), generator=generator)
        labels = torch.randint(4, vocab_size, (rows, length + rng.randint(-3, 3)), generator=generator)
        batches.append({"input_ids": source, "attention_mask": torch.ones_like(source), "labels": labels})
    return batches


def training_updates(size: ModelSize, seed: int) -> Callable[[], None]:
    model = random_model(transformer_config(size), seed=seed).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = token_batches(size.vocab_size, 4, seed)

    def run() -> None:
        for batch in batches:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


def fixed_length_generation(size: ModelSize, seed: int) -> Callable[[], torch.Tensor]:
    model = random_model(transformer_config(size), seed=seed).eval()
    sources = torch.randint(4, size.vocab_size, (16, 20), generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(20) < 8 + torch.arange(16)[:, None] % 12).long()  # (16, 20): 8 to 19 real tokens

    def run() -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(sources, attention_mask=mask, num_beams=4, min_new_tokens=24, max_new_tokens=24)

    return run


def report(name: str, contenders: dict[str, Callable[[], object]], repeats: int) -> None:
    timings = measure_alternating(contenders, repeats)
    medians = {kernel: statistics.median(timing.seconds) for kernel, timing in timings.items()}
    print(
        f"| {name} | {medians['oneDNN']:.3f} | {medians['MKL']:.3f} | {medians['oneDNN'] / medians['MKL']:.2f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--repeats", type=positive_int, default=5)
    arguments = parser.parse_args()
    if not onednn_transformer._ONEDNN_KERNEL:
        sys.exit("error: oneDNN's linear kernel runs on x86 CPUs only")
    torch.set_num_threads(arguments.threads)
    taken = "oneDNN" if onednn_transformer._ONEDNN_LINEAR else "MKL"
    print(f"CPU vendor {onednn_transformer._x86_vendor()}, {arguments.threads} threads; this model takes {taken}")
    print("| what | oneDNN s | MKL s | MKL's speed / oneDNN's |\n|---|---|---|---|")
    for name, size in SIZES.items():
        update = training_updates(size, seed=0)
        report(
            f"4 training updates, {name}",
            {"oneDNN": on_kernel(update, True), "MKL": on_kernel(update, False)},
            arguments.repeats,
        )
    generate = fixed_length_generation(SIZES["benchmarks' size (d_model 256)"], seed=0)
    outputs = {kernel: on_kernel(generate, kernel == "oneDNN")() for kernel in ("oneDNN", "MKL")}
    if not torch.equal(outputs["oneDNN"], outputs["MKL"]):
        print("note: the two kernels' generations differ (float32 rounding decided a beam)")
    report(
        "beam-4 generation, 16 × 24 tokens, d_model 256",
        {"oneDNN": on_kernel(generate, True), "MKL": on_kernel(generate, False)},
        arguments.repeats,
    )


if __name__ == "__main__":
    main()
