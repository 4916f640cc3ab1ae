"""Where beam-search time goes: this model against its MarianMT twin, one batch each, under torch.profiler.

    python benchmarks/investigations/profile_generation.py             # cached trained checkpoint, 40 sentences
    python benchmarks/investigations/profile_generation.py --top 25 --trace-dir /tmp/traces  # also Chrome traces
    python benchmarks/investigations/profile_generation.py --parts --threads 1 --sentences 200 --batch-size 32

For each model it prints the wall time, the decoding steps, the share of wall time spent inside ATen operators
(the rest is Python: generation loop, modules, masks, cache bookkeeping), and the top operators by self time
with their calls per decoding step. `--parts` instead times the parts of this model's decoding loop without the
profiler's overhead (the decoder step, the cache reordering, transformers' beam-step functions, the log-softmax),
in ms per decoding step. For Python-level stacks, run the generation under py-spy instead:

    py-spy record -r 200 -f raw -o ours.txt -- \
        python benchmarks/investigations/profile_generation.py --no-profiler --models ours
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
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
from torch.nn import functional
from torch.profiler import ProfilerActivity, profile
from transformers import GenerationMixin

from modeling.cache_transformer import StaticBeamCache
from modeling.generation_transformer import TransformerGenerationMixin

# What `--parts` times: (owner, attribute, label).
DECODING_PARTS = (
    (TransformerGenerationMixin, "_decoder_step", "decoder step (layers + output projection)"),
    (StaticBeamCache, "select", "cache reordering (StaticBeamCache.select)"),
    (GenerationMixin, "_get_top_k_continuations", "top-k over beams x vocabulary"),
    (functional, "log_softmax", "log-softmax"),
    (GenerationMixin, "_update_finished_beams", "finished hypotheses"),
    (GenerationMixin, "_get_running_beams_for_next_iteration", "running beams"),
    (GenerationMixin, "_check_early_stop_heuristic", "early-stop check"),
)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=positive_int, default=40, help="validation sentences")
    parser.add_argument(
        "--batch-size", type=positive_int, help="sentences per batch, sorted by length (default: one batch)"
    )
    parser.add_argument("--parts", action="store_true", help="time the parts of this model's decoding loop")
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
    if arguments.batch_size is None:
        order, batch_size = list(range(len(sources))), len(sources)
    else:
        lengths = [len(ids) for ids in corpus.tokenizer(sources)["input_ids"]]
        order, batch_size = sorted(range(len(sources)), key=lambda i: (-lengths[i], i)), arguments.batch_size
    batches = encode_batches(corpus.tokenizer, sources, in_batches(order, batch_size))
    settings = DecodingSettings()
    models = {}
    if "ours" in arguments.models:
        models["this model"] = (checkpoint.load_ours(arguments.attention), True)
    if "marian" in arguments.models:
        models["MarianMT"] = (checkpoint.load_marian(arguments.attention), False)
    for name, (model, paper_fields) in models.items():
        outputs = transformers_translate(model, batches, settings, paper_fields)  # warm-up, and the step count
        steps = max(len(ids) for ids in outputs) + 1  # + </s>
        if arguments.parts and name == "this model":
            print_parts(model, batches, settings, arguments.passes)
            continue
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


@contextmanager
def timing_parts(seconds: Counter) -> Iterator[Counter]:
    """Add the wall time of every call of each of `DECODING_PARTS` to `seconds[label]` inside the block."""
    originals = []
    for owner, attribute, label in DECODING_PARTS:
        original = inspect.getattr_static(owner, attribute)
        function = getattr(owner, attribute)

        def timed(*args, _function=function, _label=label, **kwargs):
            start = time.perf_counter()
            try:
                return _function(*args, **kwargs)
            finally:
                seconds[_label] += time.perf_counter() - start

        originals.append((owner, attribute, original))
        setattr(owner, attribute, staticmethod(timed) if isinstance(original, staticmethod) else timed)
    try:
        yield seconds
    finally:
        for owner, attribute, original in originals:
            setattr(owner, attribute, original)


def print_parts(model, batches, settings: DecodingSettings, passes: int) -> None:
    """ms per decoding step of each part of this model's loop, over `passes` passes after the warm-up; and how many
    steps each sentence stayed in the batch against the tokens it generated (its end-of-sentence token included):
    what a stopping rule that ended each sentence with its best hypothesis could save."""
    counts = Counter()
    decoder_step = TransformerGenerationMixin._decoder_step

    def counted_step(self, tokens, cache):
        counts["steps"] += 1
        counts["rows"] += tokens.shape[0]
        # the first step runs one row per sentence, the others one per beam
        counts["sentence steps"] += tokens.shape[0] / (1 if cache.length == 0 else settings.num_beams)
        return decoder_step(self, tokens, cache)

    seconds: Counter = Counter()
    TransformerGenerationMixin._decoder_step = counted_step
    try:
        with timing_parts(seconds):
            start = time.perf_counter()
            for _ in range(passes):
                outputs = transformers_translate(model, batches, settings, True)
            total = time.perf_counter() - start
    finally:
        TransformerGenerationMixin._decoder_step = decoder_step
    per_step = 1e3 / counts["steps"]
    # an output shorter than the cap ended with an end-of-sentence token, which `transformers_translate` strips
    generated = sum(min(len(output) + 1, settings.max_new_tokens) for output in outputs)
    sentence_steps = counts["sentence steps"] / passes
    print(
        f"### this model: {counts['steps'] // passes} decoding steps a pass, {counts['rows'] / counts['steps']:.1f} "
        f"rows a step on average, {total * per_step:.2f} ms a step in all; {sentence_steps / len(outputs):.1f} "
        f"steps a sentence for {generated / len(outputs):.1f} tokens out ({sentence_steps / generated:.2f}x)\n"
    )
    print("| part | ms / step | share |\n|---|---|---|")
    rest = total - sum(seconds.values())
    rows = [*seconds.most_common(), ("the rest (encoder, processors, generate() set-up, Python)", rest)]
    for label, value in rows:
        print(f"| {label} | {value * per_step:.2f} | {100 * value / total:.0f}% |")
    print()


if __name__ == "__main__":
    main()
