"""Train the shared source/target BPE (Sec. 5.1) and save it with `save_pretrained`.

    python scripts/train_tokenizer.py --train-files train.en.gz train.de.gz --vocab-size 8000 --output-dir bpe
    python scripts/train_tokenizer.py --data-dir ../shared/data/multi30k --source-lang en --target-lang de \\
        --vocab-size 8000 --output-dir bpe
    python scripts/train_tokenizer.py --dataset wmt/wmt14 --language-pair de-en --vocab-size 37000 --output-dir bpe
"""

import argparse
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from modeling.cli import reporting_on_stdout
from modeling.data import SplitNotFoundError, load_parallel_dataset, split_source
from modeling.files import check_writable, write_files_into
from modeling.tokenization import check_tokenizer_destination, iter_corpus_text, iter_text_files, train_shared_bpe


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--train-files", nargs="+", help="text files, one sentence per line (.gz allowed)")
    source.add_argument("--dataset", help="Hub dataset with a translation column, e.g. wmt/wmt14")
    source.add_argument("--data-dir", help="folder of parallel files (train.en.gz + train.de.gz, tsv, jsonl)")
    parser.add_argument("--language-pair", help="Hub dataset config, e.g. de-en")
    parser.add_argument("--dataset-revision", help="the branch, tag or commit of --dataset (default: main)")
    parser.add_argument("--source-lang", help="default: first language of --language-pair")
    parser.add_argument("--target-lang", help="default: second language of --language-pair")
    parser.add_argument(
        "--vocab-size",
        type=int,
        required=True,
        help="rounded up to a multiple of 8; fewer when the corpus runs out of merges, more (with a warning) when "
        "its distinct characters alone exceed it",
    )
    parser.add_argument("--min-frequency", type=int, default=2)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--cache-dir", help="datasets cache folder")
    args = parser.parse_args()
    if args.dataset_revision is not None and args.dataset is None:
        parser.error("--dataset-revision names a version of a Hub dataset (--dataset)")
    for path in args.train_files or []:
        # read line by line, a BPE learnt JSON's syntax and escapes ("\u00fc" for ü, which it then read as <unk>)
        if kind := re.search(r"\.(jsonl|tsv)(\.(gz|xz|bz2))?$", path, re.IGNORECASE):
            parser.error(
                f"{path} is {kind[1].upper()}: --train-files reads plain text, one sentence per line; give its folder "
                "as --data-dir, with --source-lang and --target-lang"
            )
    if args.train_files is None:
        pair = args.language_pair.split("-") if args.language_pair else [None, None]
        args.source_lang = args.source_lang or pair[0]
        args.target_lang = args.target_lang or pair[-1]
        if not (args.source_lang and args.target_lang):
            parser.error("--dataset / --data-dir need --source-lang and --target-lang (or --language-pair)")
    return args


def training_texts(args: argparse.Namespace) -> Iterable[str]:
    """Both sides' training sentences, from --train-files or from the parallel dataset."""
    if args.train_files:
        return iter_text_files(args.train_files)
    ds = load_parallel_dataset(
        source_lang=args.source_lang,
        target_lang=args.target_lang,
        dataset=args.dataset,
        language_pair=args.language_pair,
        data_dir=args.data_dir,
        splits=["train"],
        cache_dir=args.cache_dir,
        revision=args.dataset_revision,
    )
    return iter_corpus_text(ds["train"], [args.source_lang, args.target_lang])


def training_source(args: argparse.Namespace) -> str:
    """Where the training sentences come from, in words: the files, or the dataset's training split."""
    if args.train_files:
        return ", ".join(args.train_files)
    return split_source(
        "train",
        source_lang=args.source_lang,
        target_lang=args.target_lang,
        dataset=args.dataset,
        language_pair=args.language_pair,
        data_dir=args.data_dir,
    )


def main() -> None:
    args = parse_args()
    try:  # a dataset loads here; plain files are read lazily, while the BPE trains
        check_writable(Path(args.output_dir) / "tokenizer.json")  # named now, not after the training
        check_tokenizer_destination(args.output_dir)
        texts = training_texts(args)
        start = time.perf_counter()
        tokenizer = train_shared_bpe(
            texts,
            args.vocab_size,
            min_frequency=args.min_frequency,
            show_progress=True,
            source=training_source(args),
        )
    except SplitNotFoundError as error:  # the message lists the splits there are; a KeyError's str() quotes it
        sys.exit(f"error: the BPE is trained on the training split: {error.args[0]}")
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    seconds = time.perf_counter() - start
    try:  # file by file, atomically: a failure (a full disk) leaves an earlier tokenizer there as it was
        write_files_into(args.output_dir, tokenizer.save_pretrained, last=("tokenizer.json",), name="tokenizer")
    except OSError as error:
        sys.exit(f"error: {error}")
    print(f"vocab size: {len(tokenizer)}")
    print(f"training time: {seconds:.1f} s")
    print(f"saved to: {args.output_dir}")


if __name__ == "__main__":
    with reporting_on_stdout():  # a print that fails (`| head`, a full disk) does not stop the work
        main()
