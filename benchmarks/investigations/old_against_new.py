"""The model code at a git revision against the working tree's, decoding the generation benchmark's workloads.

    python benchmarks/investigations/old_against_new.py --old HEAD~1 --threads 1 --repeats 6

A change to the decoding loop gains a few percent, less than this project's machine drifts between two runs
(±15%), so separate runs of the benchmark cannot tell it. This script takes `modeling/` as it was at `--old`
(`git archive`, into a temporary directory, imported as `modeling_old`) beside the installed package, loads the
cached trained checkpoint into both, and times them alternately in one process (`harness.measure_alternating`) on the
three workloads of `generation.workloads`, in run.py's batches. Prints sentences/s (medians of the repeats), their
ratio, and whether the two decoded the same tokens.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: fixtures, harness, ...

from decoding import DecodingSettings
from fixtures import add_decoding_comparison_arguments, decoding_comparison_setup
from generation import Workload, alternating_translations, encode_batches, transformers_translate, workloads
from run import FULL
from transformers import PreTrainedModel, PreTrainedTokenizerBase

REPOSITORY = Path(__file__).resolve().parents[2]


def import_old_package(revision: str, directory: Path):
    """`modeling/` at `revision`, imported as `modeling_old` (its modules import each other relatively); exits
    with git's own message when `revision` has no `modeling/`."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision, "modeling"], cwd=REPOSITORY, capture_output=True
    )
    if archive.returncode != 0:
        message = archive.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["(no message)"]
        raise SystemExit(f"old_against_new.py: no modeling/ at --old {revision!r} in {REPOSITORY}: {message[0]}")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(directory, filter="data")
    (directory / "modeling").rename(directory / "modeling_old")
    sys.path.insert(0, str(directory))
    return importlib.import_module("modeling_old")


def compare(
    models: dict[str, PreTrainedModel], workload: Workload, tokenizer: PreTrainedTokenizerBase, repeats: int
) -> tuple[dict[str, float], bool]:
    """Sentences/s of each model on `workload` (medians, timed alternately), and whether their outputs agree."""
    batches = encode_batches(tokenizer, workload.sources, workload.batches)
    translations = {
        name: functools.partial(transformers_translate, model, batches, workload.settings, paper_fields=True)
        for name, model in models.items()
    }
    return alternating_translations(translations, len(workload.sources), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="git revision of the code to compare with the working tree's")
    add_decoding_comparison_arguments(parser, sentences=FULL.sentences)
    arguments = parser.parse_args()

    corpus, checkpoint = decoding_comparison_setup(arguments)
    with tempfile.TemporaryDirectory() as directory:
        old_package = import_old_package(arguments.old, Path(directory))
        models = {
            "old": old_package.TransformerForConditionalGeneration.from_pretrained(
                checkpoint.ours, attn_implementation=arguments.attention
            ).eval(),
            "new": checkpoint.load_ours(arguments.attention),
        }
        sources = corpus.validation_sources[: arguments.sentences]
        for workload in workloads(corpus.tokenizer, sources, None, FULL.batch_size, DecodingSettings()):
            rates, same = compare(models, workload, corpus.tokenizer, arguments.repeats)
            print(
                f"{arguments.threads} thread(s), {workload.name}: old ({arguments.old}) {rates['old']:.1f}, "
                f"new {rates['new']:.1f} sentences/s, new/old {rates['new'] / rates['old']:.3f}; same outputs: {same}",
                flush=True,
            )


if __name__ == "__main__":
    main()
