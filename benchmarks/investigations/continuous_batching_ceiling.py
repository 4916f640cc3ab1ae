"""How much continuous batching could give on sorted real sentences: a ceiling for issue #16, not a decoding path.

    python benchmarks/investigations/continuous_batching_ceiling.py --threads 1 --repeats 5

In the generation benchmark's sorted workload (batches of 32 sentences, beam 4) a batch starts at 128 rows and
shrinks as its sentences finish, so many steps run on few rows, where a step's fixed cost weighs most. Continuous
batching would let new sentences take the finished ones' places and keep every step at the full batch's rows. This
script measures what that could reach at best, without building it: the decoder's row-steps per second (one row
of one step, summed over `_decoder_step` calls) of

- **sorted**: the sorted workload as the benchmark decodes it;
- **full batch**: `--full-sentences` sentences in one batch, every hypothesis forced to 24 new tokens, so that
  every step runs on all their rows (the first on one beam per sentence, as the loop does);

timed alternately in one process with CTranslate2 float32 on the sorted workload (the cached checkpoint's export).
The sorted workload's row-steps at the full batch's rate is the ceiling: it leaves out the cost of adding sentences
to a running batch, and the attention over the steps of sentences of different lengths in one batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: fixtures, harness, ...

import torch
from decoding import DecodingSettings, ctranslate2_translate, load_translator
from fixtures import add_decoding_comparison_arguments, decoding_comparison_setup
from generation import FIXED_NEW_TOKENS, encode_batches, transformers_translate, workloads
from harness import measure_alternating, positive_int
from run import FULL
from transformers import BatchEncoding

from modeling import TransformerForConditionalGeneration


def count_row_steps(model: TransformerForConditionalGeneration, decode) -> int:
    """The rows summed over the decoder steps that `decode()` runs on `model`."""
    step = model._decoder_step
    row_steps = 0

    def counting(tokens: torch.Tensor, cache) -> torch.Tensor:
        nonlocal row_steps
        row_steps += tokens.shape[0]
        return step(tokens, cache)

    model._decoder_step = counting
    try:
        decode()
    finally:
        del model._decoder_step  # the instance attribute set above: the class's method again
    return row_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decoding_comparison_arguments(parser, sentences=FULL.sentences)
    parser.add_argument("--full-sentences", type=positive_int, default=FULL.batch_size, help="the full batch")
    arguments = parser.parse_args()
    corpus, checkpoint = decoding_comparison_setup(arguments)
    model, tokenizer = checkpoint.load_ours(arguments.attention), corpus.tokenizer
    translator = load_translator(checkpoint.export_ctranslate2(), "float32", arguments.threads)
    sources = corpus.validation_sources[: arguments.sentences]
    settings = DecodingSettings()
    sorted_workload = workloads(tokenizer, sources, None, FULL.batch_size, settings)[1]
    full_settings = replace(settings, min_new_tokens=FIXED_NEW_TOKENS, max_new_tokens=FIXED_NEW_TOKENS)
    full_sources = sources[: arguments.full_sentences]

    def ours(batches: list[BatchEncoding], decoding: DecodingSettings):
        return lambda: transformers_translate(model, batches, decoding, paper_fields=True)

    sorted_batches = encode_batches(tokenizer, sources, sorted_workload.batches)
    full_batches = encode_batches(tokenizer, full_sources, [list(range(len(full_sources)))])
    token_batches = [
        [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer([sources[i] for i in batch])["input_ids"]]
        for batch in sorted_workload.batches
    ]
    with torch.inference_mode():
        row_steps = {
            "sorted": count_row_steps(model, ours(sorted_batches, settings)),
            "full batch": count_row_steps(model, ours(full_batches, full_settings)),
        }
        timings = measure_alternating(
            {
                "sorted": ours(sorted_batches, settings),
                "full batch": ours(full_batches, full_settings),
                "CTranslate2": lambda: ctranslate2_translate(translator, token_batches, settings),
            },
            arguments.repeats,
        )
    seconds = {name: statistics.median(timing.seconds) for name, timing in timings.items()}
    rates = {name: row_steps[name] / seconds[name] for name in row_steps}
    ceiling_seconds = row_steps["sorted"] / rates["full batch"]
    print(f"{arguments.threads} thread(s), medians of {arguments.repeats}, {len(sources)} sentences")
    full = f"full batch ({len(full_sources)} sentences) {row_steps['full batch']}"
    print(f"row-steps: sorted {row_steps['sorted']}, {full}")
    print(
        f"row-steps/s: sorted {rates['sorted']:.0f}, full batch {rates['full batch']:.0f}, "
        f"full / sorted {rates['full batch'] / rates['sorted']:.2f}"
    )
    print(
        f"sentences/s: sorted {len(sources) / seconds['sorted']:.1f}, at the full batch's rate (the ceiling) "
        f"{len(sources) / ceiling_seconds:.1f}, CTranslate2 float32 {len(sources) / seconds['CTranslate2']:.1f}; "
        f"this model / CTranslate2 now {seconds['CTranslate2'] / seconds['sorted']:.2f}, at the ceiling "
        f"{seconds['CTranslate2'] / ceiling_seconds:.2f}"
    )


if __name__ == "__main__":
    main()
