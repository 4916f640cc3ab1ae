"""The MarianMT twin of a Multi30k run, trained the way transformers users would, for a same-budget comparison.

    OMP_NUM_THREADS=1 python benchmarks/investigations/marian_twin_quality.py --reference-run runs/m30k_en_de \\
        --data-dir ../shared/data/multi30k --output-dir runs/m30k_en_de_marian --minutes 80

The twin has this project's architecture settings at the reference run's size (ReLU, scaled and shared embeddings,
post-LN), starts from the reference run's initial weights (the same seed, converted exactly by `modeling.convert`),
uses the reference run's tokenizer and cleaned data, and trains through `Seq2SeqTrainer` with its best built-in
batching, `train_sampling_strategy="group_by_length"`, 64 sentences per update (about the reference's target
tokens per update), the inverse-square-root schedule with the reference's peak rate, label smoothing 0.1 and
Adam(0.9, 0.98, 1e-9), for the same wall-clock minutes. Then both are scored with beam 4 on the test split.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: fixtures, harness, ...

from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    MarianMTModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

from modeling import TransformerConfig, TransformerForConditionalGeneration
from modeling.callbacks import StopAfterMinutesCallback
from modeling.convert import to_marian
from modeling.data import clean_parallel_dataset, load_parallel_dataset, resolve_split, tokenize_parallel_dataset
from modeling.scoring import corpus_scores
from modeling.translation import translate


def twin_model(reference_run: Path, seed: int) -> MarianMTModel:
    """The reference run's architecture and initial weights (train() seeds before building the model), as Marian."""
    saved = [reference_run, *sorted(reference_run.glob("checkpoint-*"))]  # a run still training has only checkpoints
    config = TransformerConfig.from_pretrained(next(path for path in saved if (path / "config.json").is_file()))
    set_seed(seed)
    return to_marian(TransformerForConditionalGeneration(config))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference-run", type=Path, required=True, help="output_dir of scripts/train.py")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--minutes", type=float, required=True, help="wall-clock training budget")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--peak-learning-rate", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    source, target = args.source_lang, args.target_lang
    tokenizer = AutoTokenizer.from_pretrained(args.reference_run)
    text = load_parallel_dataset(source_lang=source, target_lang=target, data_dir=args.data_dir)
    text, _ = clean_parallel_dataset(text, source, target)
    tokenized = tokenize_parallel_dataset(text, tokenizer, source, target, max_length=256)
    model = twin_model(args.reference_run, args.seed)

    training_args = Seq2SeqTrainingArguments(
        output_dir=str(args.output_dir),
        per_device_train_batch_size=args.batch_size,
        train_sampling_strategy="group_by_length",
        learning_rate=args.peak_learning_rate,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=args.warmup_steps,
        adam_beta1=0.9,
        adam_beta2=0.98,
        adam_epsilon=1e-9,
        weight_decay=0.0,
        max_grad_norm=0.0,
        label_smoothing_factor=0.1,
        max_steps=1_000_000,
        save_steps=500,
        save_total_limit=2,
        logging_steps=100,
        eval_strategy="no",
        report_to=[],
        seed=args.seed,
        use_cpu=True,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        train_dataset=tokenized["train"],
        processing_class=tokenizer,
        callbacks=[StopAfterMinutesCallback(args.minutes)],
    )
    started = time.monotonic()
    trainer.train()
    minutes = (time.monotonic() - started) / 60
    trainer.save_model()

    test = text[resolve_split(text, "test")]
    sources = [row[source] for row in test["translation"]]
    references = [row[target] for row in test["translation"]]
    model.eval()
    hypotheses = translate(model, tokenizer, sources, num_beams=4, max_new_tokens=256)
    scores = corpus_scores(hypotheses, references, target)
    scores.update(updates=trainer.state.global_step, training_minutes=round(minutes, 1), batch_size=args.batch_size)
    (args.output_dir / "eval_results_test.json").write_text(json.dumps(scores, indent=2) + "\n")
    print(json.dumps({k: v for k, v in scores.items() if not k.endswith(("signature", "details"))}, indent=2))


if __name__ == "__main__":
    main()
