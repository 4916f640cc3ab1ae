"""Child process of the peak-memory benchmark: runs one contender's workload alone and prints its memory as JSON.

A process's peak resident set size only grows, so each contender needs a fresh process. The heavy imports sit
inside the workload functions on purpose: a CTranslate2 contender must not load torch or transformers, or its
footprint would include them.

    python benchmarks/memory_probe.py --contender ours:sdpa --workload generate --checkpoint DIR --sources F.json
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import psutil


def mebibytes(num_bytes: float) -> float:
    return num_bytes / 2**20


def current_rss() -> float:
    return mebibytes(psutil.Process().memory_info().rss)


def peak_rss() -> float:
    """This process's RSS high-water mark. Linux's `getrusage` carries the parent's peak across fork + exec, so
    a child started by a big parent would report the parent's; /proc's VmHWM belongs to this address space."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return mebibytes(int(line.split()[1]) * 1024)  # reported in kB
    return mebibytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux reports KiB


def run_training(kind: str, attention: str, checkpoint_dir: Path, steps: int, threads: int) -> float:
    """`steps` training updates on the fixed padded batches; returns the RSS measured before the model loads."""
    import torch
    from fixtures import Checkpoint, adamw, training_update
    from train_step import BATCH_SIZE, SEQUENCE_LENGTH, padded_batches

    torch.set_num_threads(threads)
    checkpoint = Checkpoint(checkpoint_dir)
    baseline = current_rss()
    model = checkpoint.load_ours(attention) if kind == "ours" else checkpoint.load_marian(attention)
    model.train()
    optimizer = adamw(model)
    for batch in padded_batches(steps, BATCH_SIZE, SEQUENCE_LENGTH, model.config.vocab_size):
        training_update(model, optimizer, batch)
    return baseline


def run_generation(kind: str, variant: str, checkpoint_dir: Path, sources: list[str], args) -> float:
    """Translate every source once; returns the RSS measured before the model loads."""
    from decoding import DecodingSettings

    settings = DecodingSettings(max_new_tokens=args.max_new_tokens)
    if kind == "ct2":
        from decoding import ctranslate2_translate, load_translator
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(checkpoint_dir / "ours" / "tokenizer.json"))
        tokens = [encoding.tokens for encoding in tokenizer.encode_batch(sources)]
        batches = [tokens[start : start + args.batch_size] for start in range(0, len(tokens), args.batch_size)]
        baseline = current_rss()
        ctranslate2_translate(load_translator(checkpoint_dir / "ct2", variant, args.threads), batches, settings)
        return baseline

    import torch
    from fixtures import Checkpoint
    from generation import encode_batches, in_batches, transformers_translate
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    checkpoint = Checkpoint(checkpoint_dir)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint.ours)
    batches = encode_batches(tokenizer, sources, in_batches(range(len(sources)), args.batch_size))
    baseline = current_rss()
    model = checkpoint.load_ours(variant) if kind == "ours" else checkpoint.load_marian(variant)
    transformers_translate(model, batches, settings, paper_fields=kind == "ours")
    return baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contender", required=True, help="ours:ATTENTION, marian:ATTENTION or ct2:COMPUTE_TYPE")
    parser.add_argument("--workload", choices=["train", "generate"], required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--sources", type=Path, help="JSON list of source sentences (generate)")
    parser.add_argument("--steps", type=int, default=3, help="training updates (train)")
    parser.add_argument("--batch-size", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    kind, variant = args.contender.split(":")
    if args.workload == "train":
        baseline = run_training(kind, variant, args.checkpoint, args.steps, args.threads)
    else:
        sources = json.loads(args.sources.read_text())
        baseline = run_generation(kind, variant, args.checkpoint, sources, args)
    print(json.dumps({"baseline_mib": baseline, "peak_mib": peak_rss()}))


if __name__ == "__main__":
    main()
