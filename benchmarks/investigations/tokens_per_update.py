"""Real target tokens an update holds with `tokens_per_update`, on 1, 8 and 16 processes: micro-batches alone (the
derivation before 2026-12-03) against `modeling.batching.update_batching` (micro-batches, then smaller batches).

    python benchmarks/investigations/tokens_per_update.py --data-dir ../shared/data/multi30k \\
        --tokenizer benchmarks/.cache/tokenizer-multi30k-29000-v8000

The training split is tokenised as training tokenises it (`modeling.data.tokenize_parallel_dataset`); the real
target tokens of an update are the split's target tokens over its batches, times micro-batches and processes.
"""

from __future__ import annotations

import argparse
import logging

from transformers import AutoTokenizer

from modeling.batching import (
    TokenBudgetBatchSampler,
    mean_target_tokens_per_batch,
    sequence_lengths,
    update_batching,
)
from modeling.data import load_parallel_dataset, tokenize_parallel_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--tokenizer", required=True, help="a tokenizer directory, as training saves it")
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    parser.add_argument("--tokens-per-update", type=int, default=25000)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 8, 16])
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    text = load_parallel_dataset(
        source_lang=args.source_lang, target_lang=args.target_lang, data_dir=args.data_dir, splits=["train"]
    )
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    train = tokenize_parallel_dataset(text, tokenizer, args.source_lang, args.target_lang)["train"]
    source, target = sequence_lengths(train)
    print(f"{len(train)} pairs, {target.mean():.1f} target tokens a sentence, {args.tokens_per_update} asked")
    print("| processes | micro-batches only | with smaller batches |")
    print("|---|---|---|")
    asked = args.tokens_per_update
    for world in args.world_sizes:
        per_batch = mean_target_tokens_per_batch(train, args.max_tokens)
        before_steps = max(1, round(asked / (per_batch * world)))  # the derivation this replaced
        before = before_steps * world * per_batch
        steps, budget = update_batching(asked, train, args.max_tokens, world)
        now = steps * world * target.sum() / len(TokenBudgetBatchSampler(source, target, budget))
        print(
            f"| {world} | {before_steps} × {args.max_tokens}: {before:,.0f} ({before / asked - 1:+.0%}) "
            f"| {steps} × {budget}: {now:,.0f} ({now / asked - 1:+.0%}) |"
        )


if __name__ == "__main__":
    main()
