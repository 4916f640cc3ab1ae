"""Benchmark 4: peak resident memory of each contender, each alone in a fresh process (`memory_probe.py`).

"Peak RSS" is the process's high-water mark (`getrusage`), interpreter and libraries included; "above baseline"
subtracts the RSS measured after the imports and inputs, before the model loads, i.e. what the model, its
optimiser and its activations cost. A CTranslate2 process imports neither torch nor transformers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness import Section

PROBE = Path(__file__).resolve().parent / "memory_probe.py"
DISPLAY_NAMES = {"ours": "this model", "marian": "MarianMT", "ct2": "CTranslate2"}


@dataclass(frozen=True)
class MemoryJob:
    """One probe run: a workload ("train" or "generate") of one contender ("ours:sdpa", "ct2:int8", ...)."""

    workload: str
    contender: str
    checkpoint: Path

    @property
    def name(self) -> str:
        kind, variant = self.contender.split(":")
        return f"{self.workload}: {DISPLAY_NAMES[kind]} ({variant})"


def probe(job: MemoryJob, options: list[str]) -> dict[str, float]:
    command = [sys.executable, str(PROBE), "--workload", job.workload, "--contender", job.contender]
    command += ["--checkpoint", str(job.checkpoint), *options]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"memory probe {job.name} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def run_peak_memory(jobs: list[MemoryJob], sources_file: Path, train_steps: int, options: list[str]) -> Section:
    """`options`: batch size, max new tokens and threads, as passed to the probe."""
    section = Section(
        title="Peak memory (RSS), one fresh process per contender",
        headers=["workload: contender", "peak RSS (MiB)", "above baseline (MiB)", "baseline (MiB)"],
    )
    for job in jobs:
        extra = ["--steps", str(train_steps)] if job.workload == "train" else ["--sources", str(sources_file)]
        result = probe(job, options + extra)
        above = result["peak_mib"] - result["baseline_mib"]
        section.rows.append([job.name, result["peak_mib"], above, result["baseline_mib"]])
        section.data.setdefault("peak_rss_mib", {})[job.name] = result
    section.notes += [
        "Baseline: RSS after imports and inputs, before the model loads; peak: the process's high-water mark. "
        "CTranslate2 processes load neither torch nor transformers.",
        f"train: {train_steps} updates on the 32×24 batches of the training-step benchmark (fused AdamW state "
        "included); generate: the generation benchmark's sentences, batches and beam search, once.",
    ]
    return section
