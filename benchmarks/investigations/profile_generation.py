"""Where beam-search time goes: this model against its MarianMT twin, one batch each, under torch.profiler.

    python benchmarks/investigations/profile_generation.py             # cached trained checkpoint, 40 sentences
    python benchmarks/investigations/profile_generation.py --top 25 --trace-dir /tmp/traces  # also Chrome traces

For each model it prints the wall time, the decoding steps, the share of wall time spent inside ATen operators
(the rest is Python: generation loop, modules, masks, cache bookkeeping), and the top operators by self time
with their calls per decoding step. For Python-level stacks, run the generation under py-spy instead:

    py-spy record -r 200 -f raw -o ours.txt -- \
        python benchmarks/investigations/profile_generation.py --no-profiler --models ours
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: fixtures, harness, ...

import datasets
import torch
import transformers
from decoding import DecodingSettings
from fixtures import (
    DEFAULT_CACHE_DIR,
    DEFAULT_DATA_DIR,
    GENERATION_CHECKPOINT_STEPS,
    ISSUE_SIZE,
    load_corpus,
    trained_checkpoint,
)
from generation import encode_batches, in_batches, transformers_translate
from harness import operator_table, positive_int
from torch.profiler import ProfilerActivity, profile


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=positive_int, default=40, help="validation sentences, one batch")
    parser.add_argument(
        "--trained-steps", type=int, default=GENERATION_CHECKPOINT_STEPS, help="which cached checkpoint (see run.py)"
    )
    parser.add_argument("--attention", default="sdpa")
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--top", type=positive_int, default=15, help="operators listed per model")
    parser.add_argument("--models", default="ours,marian", help="which of ours,marian to run")
    parser.add_argument("--no-profiler", action="store_true", help="just generate, --passes times (for py-spy)")
    parser.add_argument("--passes", type=positive_int, default=3, help="generation passes with --no-profiler")
    parser.add_argument("--trace-dir", type=Path, help="write a Chrome trace per model here")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    return parser.parse_args()


def main() -> None:
    arguments = parse_arguments()
    torch.set_num_threads(arguments.threads)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    corpus = load_corpus(arguments.data_dir, arguments.cache_dir, ISSUE_SIZE.vocab_size)
    checkpoint = trained_checkpoint(corpus, ISSUE_SIZE, arguments.trained_steps, arguments.cache_dir)
    sources = corpus.validation_sources[: arguments.sentences]
    batches = encode_batches(corpus.tokenizer, sources, in_batches(range(len(sources)), len(sources)))
    settings = DecodingSettings()
    models = {}
    if "ours" in arguments.models:
        models["this model"] = (checkpoint.load_ours(arguments.attention), True)
    if "marian" in arguments.models:
        models["MarianMT"] = (checkpoint.load_marian(arguments.attention), False)
    for name, (model, paper_fields) in models.items():
        outputs = transformers_translate(model, batches, settings, paper_fields)  # warm-up, and the step count
        steps = max(len(ids) for ids in outputs) + 1  # + </s>
        if arguments.no_profiler:
            for _ in range(arguments.passes):
                transformers_translate(model, batches, settings, paper_fields)
            continue
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            transformers_translate(model, batches, settings, paper_fields)
        wall_us = (time.perf_counter() - start) * 1e6
        table, inside = operator_table(prof, steps, wall_us, arguments.top)
        print(f"### {name} ({arguments.attention}): {arguments.sentences} sentences, beam {settings.num_beams}\n")
        print(
            f"wall {wall_us / 1e3:.0f} ms (profiled), {steps} decoding steps, {wall_us / 1e3 / steps:.1f} ms/step; "
            f"{100 * inside:.0f}% of wall time inside ATen operators, {100 * (1 - inside):.0f}% elsewhere "
            "(Python, dispatch)\n"
        )
        print(table + "\n")
        if arguments.trace_dir:
            arguments.trace_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(arguments.trace_dir / f"{name.replace(' ', '_')}.json"))


if __name__ == "__main__":
    main()
