"""Where this model's GPU training step loses to its Marian twin: the loss, or the layers (one H100/H200).

    python benchmarks/investigations/gpu_training_step.py            # on the GPU machine, about a minute
    python benchmarks/investigations/gpu_training_step.py --dry-run  # anywhere, on CPU: tiny sizes

`gpu_check.py` measured the base model's training step at 0.71× its Marian twin's tokens/s on an H200 (bf16
autocast, fused AdamW, 256 × 64 tokens per side, V = 37,000; docs/results.md, 2026-12-04), when training took the
fused loss on every device. This times, alternating in one process on `gpu_check`'s batch: the fused loss
(`skip_logits=True`, `LinearCrossEntropy`) in chunks of 1, 4, 16 and 64 times `LOSS_CHUNK_ELEMENTS` logits, the
plain loss (`skip_logits=False`: the whole logits, then `F.cross_entropy`), the model's default (since then the plain
loss on GPUs), Marian's step, and each model's encoder and decoder alone (a stand-in loss on the decoder's output):
whether a gap is in the loss or in the layers; with the peak memory of each. Then the top CUDA kernels of one
profiled step of this model (the fused loss) and of Marian.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: gpu_check, harness

import torch
import transformers
from gpu_check import dry_run_plan, full_plan, random_batch, training_contender, with_first_call_memory
from harness import format_spread, markdown_table, measure_alternating, positive_int, ratio, synchronize
from torch.profiler import ProfilerActivity, profile

import modeling.modeling_transformer as modeling_transformer
from modeling import TransformerForConditionalGeneration
from modeling.convert import to_marian


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: checks the script")
    parser.add_argument("--model", choices=["base", "big"], default="base", help="the paper's size (Table 3)")
    parser.add_argument("--top", type=positive_int, default=15, help="kernels listed per profile")
    parser.add_argument(
        "--chunk-factors",
        type=lambda text: [positive_int(factor) for factor in text.split(",")],
        default=[1, 4, 16, 64],
        help="fused-loss chunks timed, as multiples of LOSS_CHUNK_ELEMENTS (default 1,4,16,64)",
    )
    return parser.parse_args()


def with_loss_chunks(call: Callable[[], None], elements: int) -> Callable[[], None]:
    """`call` with the fused loss computing `elements` logits at a time."""

    def chunked() -> None:
        default = modeling_transformer.LOSS_CHUNK_ELEMENTS
        modeling_transformer.LOSS_CHUNK_ELEMENTS = elements
        try:
            call()
        finally:
            modeling_transformer.LOSS_CHUNK_ELEMENTS = default

    return chunked


def layers_contender(
    model: transformers.PreTrainedModel, batch: dict[str, torch.Tensor], steps: int, device: torch.device
) -> Callable[[], None]:
    """`steps` updates of the encoder and decoder alone: the output projection and the loss replaced by the mean
    square of the decoder's output, so that both models do the same work."""
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])

    def call() -> None:
        for _ in range(steps):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                outputs = model.model(
                    input_ids=batch["input_ids"],
                    attention_mask=batch["attention_mask"],
                    decoder_input_ids=decoder_input_ids,
                )
            outputs.last_hidden_state.float().square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        synchronize(device)

    return call


def kernel_table(call: Callable[[], None], device: torch.device, top: int) -> str:
    """The top kernels (CUDA) or operators (CPU) of one profiled `call`, by their own time."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        call()
        wall = time.perf_counter() - start
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda event: getattr(event, key), reverse=True)
    total = sum(getattr(event, key) for event in events)
    rows = [
        [event.key[:70], getattr(event, key) / 1e3, f"{100 * getattr(event, key) / total:.1f}%", event.count]
        for event in events[:top]
    ]
    head = f"{total / 1e3:.1f} ms in these, {1e3 * wall:.1f} ms wall (profiled)\n\n"
    return head + markdown_table(["kernel / operator", "ms", "share", "calls"], rows)


def main() -> None:
    arguments = parse_arguments()
    device = torch.device("cuda" if torch.cuda.is_available() and not arguments.dry_run else "cpu")
    plan = dry_run_plan() if arguments.dry_run else full_plan()
    transformers.logging.set_verbosity_error()
    config = plan.configs[arguments.model]
    torch.manual_seed(0)
    ours = TransformerForConditionalGeneration(config)
    ours.set_attn_implementation("sdpa")
    marian = to_marian(ours)
    marian.set_attn_implementation("sdpa")
    batch = random_batch(plan, config.vocab_size, device)
    default_chunks = modeling_transformer.LOSS_CHUNK_ELEMENTS

    chunked = {
        f"this model, fused loss ({factor * default_chunks:,} logits a chunk)": with_loss_chunks(
            training_contender(copy.deepcopy(ours), {**batch, "skip_logits": True}, plan.steps, device),
            factor * default_chunks,
        )
        for factor in arguments.chunk_factors
    }
    contenders: dict[str, Callable[[], None]] = {
        **chunked,
        "this model, plain loss (skip_logits=False)": training_contender(
            copy.deepcopy(ours), {**batch, "skip_logits": False}, plan.steps, device
        ),
        "this model, its default loss": training_contender(copy.deepcopy(ours), batch, plan.steps, device),
        "MarianMT": training_contender(copy.deepcopy(marian), batch, plan.steps, device),
        "this model, layers alone": layers_contender(copy.deepcopy(ours), batch, plan.steps, device),
        "MarianMT, layers alone": layers_contender(copy.deepcopy(marian), batch, plan.steps, device),
    }
    peaks = with_first_call_memory(contenders, device)  # also the warm-up
    timings = measure_alternating(contenders, plan.repeats, warmup=0)
    tokens = plan.steps * plan.batch_size * 2 * plan.length
    baseline = timings["MarianMT"].rate(tokens).median
    rows = []
    for name, timing in timings.items():
        milliseconds = 1e3 * timing.stats.median / plan.steps
        rate = timing.rate(tokens)
        rows.append([name, milliseconds, rate.median, format_spread(rate), ratio(rate.median, baseline), peaks[name]])
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    print(
        f"### Training step, {arguments.model} (d={config.d_model}, V={config.vocab_size}), "
        f"{plan.batch_size}×{plan.length} tokens a side, bf16 autocast, fused AdamW, on {device_name}\n"
    )
    print(
        markdown_table(["contender", "ms per step", "tokens/s (median)", "min–max", "vs MarianMT", "peak GiB"], rows)
    )
    print(
        f"\n- {plan.repeats} repeats of {plan.steps} steps after one warm-up call each (its peak memory), alternating."
    )
    for name in (next(iter(chunked)), "MarianMT"):
        print(f"\n### One profiled call ({plan.steps} steps): {name}\n")
        print(kernel_table(contenders[name], device, arguments.top))


if __name__ == "__main__":
    main()
