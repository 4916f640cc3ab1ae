"""What decoding gains from weights laid out once per generate() call for oneDNN (`prepacked_for_decoding`).

    python benchmarks/investigations/prepacked_decoding.py --threads 1
    python benchmarks/investigations/prepacked_decoding.py --threads 2 --repeats 7

The generation benchmark's three workloads (fixed output length, sorted by length, file order:
`generation.workloads`, in run.py's batches) on the cached trained checkpoint, this model alone, two ways in
alternation within one process: as generate() runs it (prepacked), and with `prepacked_for_decoding` replaced by a
block that does nothing (the plain weights, which oneDNN lays out anew at every call). Prints sentences/s (medians
of the repeats), their ratio, and whether the outputs are the same token for token. x86 CPUs only: elsewhere
nothing is prepacked and the two ways are the same.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: fixtures, harness, ...

from decoding import DecodingSettings
from fixtures import add_decoding_comparison_arguments, decoding_comparison_setup
from generation import encode_batches, transformers_translate, workloads
from run import FULL
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def compare(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sources: list[str], batch_size: int, repeats: int
) -> list[str]:
    """A line per workload: sentences/s of the plain and the prepacked way (medians), their ratio, and whether
    their outputs are the same token for token. `model.prepacked_for_decoding` is restored afterwards."""
    ways = {"plain": contextlib.nullcontext, "prepacked": model.prepacked_for_decoding}
    lines = []
    try:
        for workload in workloads(tokenizer, sources, None, batch_size, DecodingSettings()):
            batches = encode_batches(tokenizer, workload.sources, workload.batches)
            rates: dict[str, list[float]] = {way: [] for way in ways}
            outputs = {}
            for _ in range(repeats + 1):  # the first pass of each way warms up, untimed
                for way, block in ways.items():
                    model.prepacked_for_decoding = block
                    start = time.perf_counter()
                    outputs[way] = transformers_translate(model, batches, workload.settings, paper_fields=True)
                    rates[way].append(len(workload.sources) / (time.perf_counter() - start))
            plain, prepacked = (statistics.median(rates[way][1:]) for way in ways)
            lines.append(
                f"{workload.name}: plain {plain:.1f}, prepacked {prepacked:.1f} sentences/s, "
                f"{prepacked / plain:.2f}x; same outputs: {outputs['plain'] == outputs['prepacked']}"
            )
    finally:
        del model.prepacked_for_decoding  # the instance attribute set above: the class's method again
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decoding_comparison_arguments(parser, sentences=FULL.sentences)
    arguments = parser.parse_args()

    corpus, checkpoint = decoding_comparison_setup(arguments)
    model = checkpoint.load_ours(arguments.attention)
    sources = corpus.validation_sources[: arguments.sentences]
    for line in compare(model, corpus.tokenizer, sources, FULL.batch_size, arguments.repeats):
        print(f"{arguments.threads} thread(s), {line}")


if __name__ == "__main__":
    main()
