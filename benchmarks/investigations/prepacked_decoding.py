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
import functools
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: fixtures, harness, ...

from decoding import DecodingSettings
from fixtures import add_decoding_comparison_arguments, decoding_comparison_setup
from generation import Workload, alternating_translations, encode_batches, transformers_translate, workloads
from run import FULL
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def compare(
    model: PreTrainedModel, workload: Workload, tokenizer: PreTrainedTokenizerBase, repeats: int
) -> tuple[dict[str, float], bool]:
    """Sentences/s of the plain and the prepacked way on `workload` (medians, timed alternately), and whether their
    outputs are the same token for token. `model.prepacked_for_decoding` is restored afterwards."""
    batches = encode_batches(tokenizer, workload.sources, workload.batches)

    def translate(block: Callable[[], contextlib.AbstractContextManager]) -> list[list[int]]:
        model.prepacked_for_decoding = block
        return transformers_translate(model, batches, workload.settings, paper_fields=True)

    ways = {"plain": contextlib.nullcontext, "prepacked": model.prepacked_for_decoding}
    try:
        translations = {way: functools.partial(translate, block) for way, block in ways.items()}
        return alternating_translations(translations, len(workload.sources), repeats)
    finally:
        del model.prepacked_for_decoding  # the instance attribute set above: the class's method again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decoding_comparison_arguments(parser, sentences=FULL.sentences)
    arguments = parser.parse_args()

    corpus, checkpoint = decoding_comparison_setup(arguments)
    model = checkpoint.load_ours(arguments.attention)
    sources = corpus.validation_sources[: arguments.sentences]
    for workload in workloads(corpus.tokenizer, sources, None, FULL.batch_size, DecodingSettings()):
        rates, same = compare(model, workload, corpus.tokenizer, arguments.repeats)
        print(
            f"{arguments.threads} thread(s), {workload.name}: plain {rates['plain']:.1f}, prepacked "
            f"{rates['prepacked']:.1f} sentences/s, {rates['prepacked'] / rates['plain']:.2f}x; same outputs: {same}",
            flush=True,
        )


if __name__ == "__main__":
    main()
