"""Translate a test set with a trained model and score it: sacreBLEU, the paper's BLEU, lowercased BLEU, chrF.

    python scripts/evaluate.py --model runs/base_en_de/averaged --dataset wmt/wmt14 --language-pair de-en \\
        --source-lang en --target-lang de --split test --output-dir runs/base_en_de/eval
    python scripts/evaluate.py --model runs/tiny_multi30k --data-dir ../shared/data/multi30k \\
        --source-lang en --target-lang de --split test --output-dir runs/tiny_multi30k/eval

Prints the scores and writes `eval_results_{split}.json` (scores, sacreBLEU signature, decoding settings; read
by `scripts/push_to_hub.py --card-from`) and `hypotheses_{split}.{target_lang}` into `--output-dir`. Killed while
translating, the same command resumes after the last chunk of hypotheses written (`translate_file`); killed while
scoring, it scores the hypotheses written without translating them again.
"""

import argparse
import fnmatch
import logging
import sys
from pathlib import Path

from modeling.checkpoints import check_outside_live_checkpoints
from modeling.cli import (
    add_decoding_arguments,
    add_model_arguments,
    log_to_stderr,
    positive_int,
    reporting_on_stdout,
    summary,
)
from modeling.data import (
    SplitNotFoundError,
    discover_parallel_files,
    load_parallel_dataset,
    pinned_dataset_commit,
    require_rows,
    split_source,
)
from modeling.evaluation import (
    evaluate_split,
    evaluation_record,
    load_scored_model,
    metrics_filename,
    warn_of_replaced_scores,
)
from modeling.files import check_distinct_outputs, check_writable, write_json
from modeling.quantization import quantize_int8
from modeling.scoring import check_scorable
from modeling.translation import TranslationInProgressError, check_workers, model_files

SCORE_LINES = (
    ("sacrebleu", "sacreBLEU", "sacrebleu_signature"),
    ("paper_bleu", "BLEU, tokenised as in the paper", "paper_bleu_signature"),
    ("tokenized_bleu_lc", "BLEU, tokenised, lowercased", "tokenized_bleu_lc_signature"),
    ("chrf", "chrF", "chrf_signature"),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    add_model_arguments(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", help="Hub dataset, e.g. wmt/wmt14")
    source.add_argument("--data-dir", help="directory of local parallel files (see modeling.data)")
    parser.add_argument("--language-pair", help="Hub dataset configuration, e.g. de-en")
    parser.add_argument("--dataset-revision", help="the branch, tag or commit of --dataset (default: main)")
    parser.add_argument("--source-lang", required=True)
    parser.add_argument("--target-lang", required=True)
    parser.add_argument("--split", default="test", help="split to evaluate; 'validation'/'test' find aliases")
    parser.add_argument("--limit", type=positive_int, help="evaluate only the first N sentences (quick checks)")
    add_decoding_arguments(parser, chunk_lines_help="hypotheses translated and saved at a time")
    parser.add_argument("--output-dir", type=Path, help="where to write the metrics JSON and hypotheses")
    parser.add_argument("--metrics-json", type=Path, help="metrics JSON path (default: in --output-dir)")
    parser.add_argument("--hypotheses-file", type=Path, help="hypotheses path (default: in --output-dir)")
    args = parser.parse_args()
    if args.dataset_revision is not None and args.dataset is None:
        parser.error("--dataset-revision names a version of a Hub dataset (--dataset)")
    if args.language_pair is not None and args.dataset is None:  # else ignored, yet recorded with the scores
        parser.error("--language-pair names a configuration of a Hub dataset (--dataset)")
    return args


def split_files(data_dir: Path | None, source_lang: str, target_lang: str, split: str) -> dict[str, Path]:
    """The local files of `split` by their role, which the outputs must not overwrite (none for a Hub dataset)."""
    if data_dir is None:
        return {}
    files = discover_parallel_files(data_dir, source_lang, target_lang, [split])[split]
    roles = ("the source file", "the reference file") if files.kind == "text" else ("the data file",)
    return {role: Path(path) for role, path in zip(roles, files.paths, strict=True)}


def own_model_files(model: str) -> dict[str, Path]:
    """The model directory's own files (`model_files`), which the outputs must not overwrite; not the scores of an
    earlier evaluation into that directory (`--output-dir` the model's), which this one writes again."""
    earlier_scores = metrics_filename("*")
    return {role: path for role, path in model_files(model).items() if not fnmatch.fnmatch(path.name, earlier_scores)}


def main() -> None:
    args = parse_args()
    log_to_stderr("%(levelname)s: %(message)s")
    logging.getLogger("modeling").setLevel(logging.INFO)  # resuming a translation, or starting it over
    try:
        check_scorable(args.target_lang)  # before the translating, not after it
        model, tokenizer, scored = load_scored_model(
            args.model, revision=args.revision, device="cpu" if args.int8 else None
        )
        if args.int8:
            model = quantize_int8(model)
        check_workers(model, args.workers)
        commit = args.dataset and pinned_dataset_commit(args.dataset, args.language_pair, args.dataset_revision)
        splits = load_parallel_dataset(
            source_lang=args.source_lang,
            target_lang=args.target_lang,
            dataset=args.dataset,
            language_pair=args.language_pair,
            data_dir=args.data_dir,
            splits=[args.split],
            revision=commit or args.dataset_revision,
        )
    except SplitNotFoundError as error:  # the message lists the available ones
        sys.exit(f"error: {error.args[0]}")
    except (ImportError, OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    [(split_name, split)] = splits.items()
    try:
        where = split_source(
            split_name,
            source_lang=args.source_lang,
            target_lang=args.target_lang,
            dataset=args.dataset,
            language_pair=args.language_pair,
            data_dir=args.data_dir,
        )
        split = require_rows(split, split_name, where)
        metrics_path = args.metrics_json or (args.output_dir and args.output_dir / metrics_filename(split_name))
        hypotheses_path = args.hypotheses_file or (
            args.output_dir and args.output_dir / f"hypotheses_{split_name}.{args.target_lang}"
        )
        for path in filter(None, (metrics_path, hypotheses_path)):  # named now, not after the translating
            check_writable(path)
            check_outside_live_checkpoints(path, "the output")
        check_distinct_outputs(
            {"the hypotheses file": hypotheses_path, "the metrics file": metrics_path},
            split_files(args.data_dir, args.source_lang, args.target_lang, split_name) | own_model_files(args.model),
        )
    except (OSError, ValueError) as error:
        sys.exit(f"error: {error}")
    sentences_in_split = len(split)
    if args.limit is not None:
        split = split.select(range(min(args.limit, sentences_in_split)))
    # what the record says of the test set and the model scored (`evaluation_record`)
    described = {
        "dataset": args.dataset or Path(args.data_dir).resolve().name,
        "dataset_commit": commit,
        "language_pair": args.language_pair,
        "split": split_name,
        "int8": args.int8,
    }
    if metrics_path:  # the record's fields that tell its scores from another evaluation's of the same weights
        evaluated = {
            **described,
            "source_lang": args.source_lang,
            "target_lang": args.target_lang,
            "num_sentences": len(split),
            "num_beams": args.num_beams or model.generation_config.num_beams,
        }
        warn_of_replaced_scores(metrics_path, scored, evaluated)

    try:  # with a hypotheses file, a killed evaluation resumes from the hypotheses written (evaluate_split)
        metrics, _ = evaluate_split(
            model,
            tokenizer,
            split,
            source_lang=args.source_lang,
            target_lang=args.target_lang,
            max_tokens=args.max_tokens,
            num_beams=args.num_beams,
            workers=args.workers,
            progress=True,
            hypotheses_file=hypotheses_path,
            chunk_lines=args.chunk_lines,
        )
    except (OSError, ValueError, TranslationInProgressError) as error:  # ValueError: a bad file or setting's line
        sys.exit(f"error: {error}")
    except KeyboardInterrupt:
        if hypotheses_path:
            sys.exit(f"interrupted: the same command resumes from the hypotheses written into {hypotheses_path}")
        raise
    metrics = evaluation_record(scored, metrics, **described, limit=args.limit, sentences_in_split=sentences_in_split)

    print(f"{metrics['dataset']} {split_name}: {metrics['num_sentences']} sentences, beam {metrics['num_beams']}")
    for key, name, signature in SCORE_LINES:
        score = "  n/a " if metrics[key] is None else f"{metrics[key]:6.2f}"  # a tokenised BLEU into Chinese, ...
        print(f"{name:>42}: {score}  {metrics[signature]}")
    if hypotheses_path:
        print(f"Wrote {hypotheses_path}")
    if metrics_path:
        try:  # atomically: a failure (a full disk) leaves an earlier one as it was
            print(f"Wrote {write_json(metrics_path, metrics)}")
        except OSError as error:
            sys.exit(f"error: {error}")


if __name__ == "__main__":
    with reporting_on_stdout():  # a print that fails (`| head`, a full disk) does not stop the work
        main()
