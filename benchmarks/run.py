"""Side-by-side speed of this Transformer against its MarianMT twin and CTranslate2, in one process.

    python benchmarks/run.py                      # the issue's measurement (about 15 minutes on 2 quiet cores)
    python benchmarks/run.py --quick              # tiny sizes, seconds: checks that everything runs
    python benchmarks/run.py --only train_step,generate --repeats 7 --output-json results.json

Benchmarks: train_step (fixed padded batches), train_data (real data, batching included), generate (beam search on
validation sentences, with CTranslate2), memory (peak RSS, one process per contender). Contenders alternate within
each benchmark; every table gives medians, min–max over repeats and ratios. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ctranslate2
import datasets
import torch
import transformers
from decoding import DecodingSettings
from fixtures import (
    DEFAULT_CACHE_DIR,
    DEFAULT_DATA_DIR,
    GENERATION_CHECKPOINT_STEPS,
    ISSUE_SIZE,
    QUICK_SIZE,
    Checkpoint,
    Corpus,
    ModelSize,
    load_corpus,
    random_checkpoint,
    trained_checkpoint,
)
from generation import run_generation
from harness import Section, positive_int
from memory import MemoryJob, run_peak_memory
from train_data import run_train_data
from train_step import run_train_step

BENCHMARKS = ("train_step", "train_data", "generate", "memory")


@dataclass(frozen=True)
class Plan:
    """Sizes and repeat counts of one run: the issue's, or tiny ones for --quick."""

    size: ModelSize
    repeats: int
    steps_per_call: int  # train_step
    peak_sizes: tuple[int, ...]  # fp32 matmul sizes for the peak
    updates_per_call: int  # train_data
    train_limit: int | None  # training pairs used (tokenizer, train_data, trained checkpoint)
    trained_steps: int  # updates of the checkpoint used for generation (0: random weights)
    sentences: int
    batch_size: int
    max_new_tokens: int
    memory_train_steps: int
    all_memory_probes: bool  # else one torch and one CTranslate2 probe (each probe is a fresh process)


FULL = Plan(ISSUE_SIZE, 5, 2, (1024, 2048), 4, None, GENERATION_CHECKPOINT_STEPS, 200, 32, 64, 3, True)
QUICK = Plan(QUICK_SIZE, 1, 1, (256,), 1, 1000, 0, 8, 4, 8, 1, False)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model and data: a smoke test, not a measurement")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated subset of {BENCHMARKS}")
    parser.add_argument("--repeats", type=positive_int, help="timed repeats per contender (default 5, quick 2)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch and CTranslate2 threads (default 2)")
    parser.add_argument("--attention", default="eager,sdpa", help="attention implementations to compare")
    parser.add_argument(
        "--generation-threads",
        type=thread_counts,
        default=[1, 2],
        help="comma-separated thread counts at which generation is measured (default 1,2)",
    )
    parser.add_argument(
        "--generation-attention", default="sdpa", help="attention implementations in the generation benchmark"
    )
    parser.add_argument(
        "--trained-steps",
        type=int,
        help=f"updates of the cached generation checkpoint (default {GENERATION_CHECKPOINT_STEPS})",
    )
    parser.add_argument("--sentences", type=positive_int, help="validation sentences to translate (default 200)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="Multi30k files (else synthetic)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="BPE, datasets, checkpoints")
    parser.add_argument("--output-json", type=Path, help="also write every number (and raw repeats) here")
    arguments = parser.parse_args()
    unknown = set(arguments.only.split(",")) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmarks {sorted(unknown)}; choose from {BENCHMARKS}")
    return arguments


def thread_counts(value: str) -> list[int]:
    return [positive_int(count) for count in value.split(",")]


def plan_for(arguments: argparse.Namespace) -> Plan:
    plan = QUICK if arguments.quick else FULL
    overrides = {
        "repeats": arguments.repeats,
        "trained_steps": arguments.trained_steps,
        "sentences": arguments.sentences,
    }
    return Plan(**{**plan.__dict__, **{key: value for key, value in overrides.items() if value is not None}})


def environment(threads: int) -> dict[str, str | int]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "ctranslate2": ctranslate2.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count() or 0,
        "threads": threads,
        "load_average": " ".join(f"{load:.2f}" for load in os.getloadavg()),
    }


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_benchmarks(arguments: argparse.Namespace, plan: Plan) -> dict[str, Section]:
    only = arguments.only.split(",")
    attentions = arguments.attention.split(",")
    settings = DecodingSettings(max_new_tokens=plan.max_new_tokens)
    sections: dict[str, Section] = {}
    if "train_step" in only:
        log("train_step")
        sections["train_step"] = run_train_step(
            plan.size, attentions, plan.repeats, plan.steps_per_call, list(plan.peak_sizes)
        )
    if not {"train_data", "generate", "memory"} & set(only):
        return sections

    real = arguments.data_dir.is_dir()  # as load_corpus decides
    log(f"corpus: Multi30k from {arguments.data_dir}" if real else f"corpus: synthetic ({arguments.data_dir} absent)")
    corpus = load_corpus(arguments.data_dir, arguments.cache_dir, plan.size.vocab_size, plan.train_limit)
    sources = corpus.validation_sources[: plan.sentences]
    if "train_data" in only:
        log("train_data")
        sections["train_data"] = run_train_data(corpus, plan.size, plan.repeats, plan.updates_per_call)
    if not {"generate", "memory"} & set(only):
        return sections

    log(f"generation checkpoint ({plan.trained_steps} updates, cached)")
    checkpoint = trained_checkpoint(corpus, plan.size, plan.trained_steps, arguments.cache_dir)
    checkpoint.export_ctranslate2()
    if "generate" in only:
        log("generate")
        sections["generate"], sections["generate_best"] = run_generation(
            checkpoint,
            corpus.tokenizer,
            sources,
            corpus.validation_references[: plan.sentences],
            plan.batch_size,
            settings,
            arguments.generation_attention.split(","),
            plan.repeats,
            arguments.generation_threads,
            model_note(corpus, plan.trained_steps),
        )
    if "memory" in only:
        log("memory")
        sections["memory"] = run_memory(arguments, plan, checkpoint, sources, attentions)
    return sections


def model_note(corpus: Corpus, trained_steps: int) -> str:
    if trained_steps == 0:
        return "random weights (outputs are degenerate and run to the length cap)"
    return f"trained for {trained_steps} updates on {corpus.name} (cached), then frozen"


def run_memory(
    arguments: argparse.Namespace, plan: Plan, checkpoint: Checkpoint, sources: list[str], attentions: list[str]
) -> Section:
    train_checkpoint = random_checkpoint(plan.size, arguments.cache_dir)
    jobs = [
        MemoryJob("train", f"{kind}:{attention}", train_checkpoint.directory)
        for attention in attentions
        for kind in ("ours", "marian")
    ]
    jobs += [MemoryJob("generate", f"{kind}:sdpa", checkpoint.directory) for kind in ("ours", "marian")]
    jobs += [
        MemoryJob("generate", f"ct2:{compute_type}", checkpoint.directory) for compute_type in ("float32", "int8")
    ]
    if not plan.all_memory_probes:
        jobs = [jobs[0], jobs[-1]]
    options = ["--batch-size", str(plan.batch_size), "--max-new-tokens", str(plan.max_new_tokens)]
    options += ["--threads", str(arguments.threads)]
    with tempfile.TemporaryDirectory() as directory:
        sources_file = Path(directory) / "sources.json"
        sources_file.write_text(json.dumps(sources))
        return run_peak_memory(jobs, sources_file, plan.memory_train_steps, options)


def report(sections: dict[str, Section], env: dict, quick: bool) -> str:
    header = "## Benchmark results" + (" (--quick: tiny sizes, NOT a measurement)" if quick else "")
    facts = ", ".join(f"{key} {value}" for key, value in env.items())
    return "\n\n".join([header, facts, *(section.markdown() for section in sections.values())])


def main() -> None:
    arguments = parse_arguments()
    plan = plan_for(arguments)
    torch.set_num_threads(arguments.threads)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    env = environment(arguments.threads)
    sections = run_benchmarks(arguments, plan)
    env["load_average_at_end"] = environment(arguments.threads)["load_average"]
    print(report(sections, env, arguments.quick))
    if arguments.output_json:
        payload = {
            "environment": env,
            "plan": plan.__dict__,
            "sections": {key: section.to_dict() for key, section in sections.items()},
        }
        arguments.output_json.write_text(json.dumps(payload, indent=2, default=str))


if __name__ == "__main__":
    main()
