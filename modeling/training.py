"""`train()`: the whole pipeline that `scripts/train.py` runs, from parallel text to a saved (and pushed) model.

Steps: load and clean the parallel text (`modeling.data`), train the shared BPE unless one is given
(`modeling.tokenization`), build the preset's model (`modeling.presets`) or load one to fine-tune, train with
`TokenBudgetSeq2SeqTrainer` (`modeling.trainer`), save the final model, average the last checkpoints
(`modeling.averaging`, Sec. 6.1), and with `push_to_hub` push the result with this project's card (`modeling.hub`).
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path

import datasets
import numpy as np
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerBase,
    set_seed,
)

from .arguments import DataArguments, ModelArguments, TranslationTrainingArguments
from .averaging import average_checkpoints, list_checkpoints
from .data import clean_parallel_dataset, load_parallel_dataset, resolve_split, tokenize_parallel_dataset
from .files import write_json
from .modeling_transformer import TransformerForConditionalGeneration
from .presets import TrainingPreset, get_preset
from .tokenization import iter_corpus_text, train_shared_bpe
from .trainer import TokenBudgetSeq2SeqTrainer, bleu_metrics

logger = logging.getLogger(__name__)

BLEU_SAMPLE_SEED = 0  # the validation sample scored by BLEU is the same for every run, whatever the training seed


def _load_text(data_args: DataArguments, *, evaluate: bool) -> tuple[datasets.DatasetDict, dict[str, int]]:
    """Training (and validation) pairs, as `{"train", "validation"}` splits of untokenised text, and the counts of
    training pairs removed by cleaning."""
    raw = load_parallel_dataset(
        source_lang=data_args.source_lang,
        target_lang=data_args.target_lang,
        dataset=data_args.dataset,
        language_pair=data_args.language_pair,
        data_dir=data_args.data_dir,
    )
    splits = {"train": raw[resolve_split(raw, "train")]}
    if evaluate:
        try:
            splits["validation"] = raw[resolve_split(raw, "validation")]
        except KeyError as err:
            raise ValueError(f"Evaluation needs a validation split ({err}); or pass --eval_strategy no.") from None
    text, cleaning = datasets.DatasetDict(splits), {}
    if data_args.clean:
        text, counts = clean_parallel_dataset(
            text, data_args.source_lang, data_args.target_lang, num_proc=data_args.preprocessing_num_workers
        )
        cleaning = counts["train"]
    if data_args.max_train_samples is not None:
        text["train"] = text["train"].select(range(min(data_args.max_train_samples, len(text["train"]))))
    return text, cleaning


def _tokenizer(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: TranslationTrainingArguments,
    train_text: datasets.Dataset,
    vocab_size: int,
) -> PreTrainedTokenizerBase:
    """The given tokenizer, the fine-tuned model's, the one of an earlier run in output_dir, or a new shared BPE.

    A new BPE (Sec. 5.1: "a shared source-target vocabulary") is trained by the main process and saved to
    output_dir at once, so that other processes, and a resumed run, load the very same vocabulary.
    """
    name = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    if name is not None:
        return AutoTokenizer.from_pretrained(name)
    output_dir = Path(training_args.output_dir)
    with training_args.main_process_first(local=False, desc="shared BPE"):
        if (output_dir / "tokenizer.json").is_file():
            logger.info("Using the tokenizer of the earlier run in %s", output_dir)
            return AutoTokenizer.from_pretrained(output_dir)
        languages = [data_args.source_lang, data_args.target_lang]
        tokenizer = train_shared_bpe(iter_corpus_text(train_text, languages), vocab_size)
        tokenizer.save_pretrained(output_dir)
        return tokenizer


def _model(model_args: ModelArguments, preset: TrainingPreset, vocab_size: int) -> TransformerForConditionalGeneration:
    """The preset's model, freshly initialised, or the weights of `model_name_or_path` to fine-tune."""
    overrides = model_args.config_overrides()
    if model_args.model_name_or_path is None:
        return TransformerForConditionalGeneration(preset.model_config(vocab_size, **overrides))
    architecture = sorted(set(overrides) - {"dropout"})
    if architecture:
        raise ValueError(f"{architecture} cannot change when fine-tuning {model_args.model_name_or_path}.")
    model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, **overrides)
    if model.config.vocab_size < vocab_size:
        raise ValueError(f"The tokenizer has {vocab_size} tokens, the model's vocabulary {model.config.vocab_size}.")
    return model


def bleu_sample(dataset: datasets.Dataset, size: int) -> datasets.Dataset:
    """A fixed random sample of `size` examples (the whole dataset if smaller), the same for every run."""
    if size >= len(dataset):
        return dataset
    indices = np.random.default_rng(BLEU_SAMPLE_SEED).choice(len(dataset), size, replace=False)
    return dataset.select(np.sort(indices))


def _resume_checkpoint(training_args: TranslationTrainingArguments) -> str | bool | None:
    """`resume_from_checkpoint` as `Trainer.train` takes it: "last" (or "true") means the newest in output_dir."""
    value = training_args.resume_from_checkpoint
    if value is not None and value.lower() in ("last", "true"):
        return True
    return value


def _write_run_records(
    trainer: TokenBudgetSeq2SeqTrainer,
    model_args: ModelArguments,
    data_args: DataArguments,
    text: datasets.DatasetDict,
    cleaning: dict[str, int],
    *,
    hub_model_id: str | None = None,
) -> None:
    """`training_args.json` and `data_stats.json` in output_dir, which the model card (`modeling.model_card`) reads.

    `TrainingArguments.to_dict` writes every `*_token` field as a placeholder (`"<HUB_TOKEN>"`), never its value.
    `hub_model_id` is the repo of a push at the end of training, which the trainer's own arguments don't request.
    """
    args = trainer.args
    shown = {
        k: v
        for k, v in args.to_dict().items()
        if k not in ("per_device_train_batch_size", "per_device_eval_batch_size")
    }
    if hub_model_id is not None:
        shown |= {"push_to_hub": True, "hub_model_id": hub_model_id}
    if args.paper_schedule:
        shown.pop("lr_scheduler_type")
        shown["learning_rate_schedule"] = "learning_rate × d_model^-0.5 × min(step^-0.5, step × warmup^-1.5)"
    run = {
        "preset": model_args.preset,
        "model_name_or_path": model_args.model_name_or_path,
        "world_size": args.world_size,
    }
    write_json(Path(args.output_dir) / "training_args.json", {**shown, **run})
    stats = {
        "dataset": data_args.dataset or data_args.data_dir,
        "language_pair": f"{data_args.source_lang}-{data_args.target_lang}",
        "sentence_pairs": {split: len(part) for split, part in text.items()},
        "cleaning": cleaning,
        "vocab_size": len(trainer.processing_class),
    }
    write_json(Path(args.output_dir) / "data_stats.json", stats)


def _average_last_checkpoints(output_dir: str, n: int) -> Path | None:
    """Average the last `n` checkpoints into output_dir/averaged; return that directory, or None without any."""
    checkpoints = list_checkpoints(output_dir)[-n:]
    if len(checkpoints) < n:
        logger.warning("Averaging the %d checkpoints in %s rather than %d", len(checkpoints), output_dir, n)
    if not checkpoints:
        return None
    averaged = average_checkpoints(checkpoints, os.path.join(output_dir, "averaged"))
    logger.info("Averaged %s into %s", ", ".join(path.name for path in checkpoints), averaged)
    return averaged


def _without_hub_push(training_args: TranslationTrainingArguments) -> TranslationTrainingArguments:
    """The Trainer's copy of the arguments: it must not push (its card has no translation task and drops BLEU),
    and, since it saves its arguments in every checkpoint (`training_args.bin`), holds no token either."""
    if not training_args.push_to_hub and training_args.hub_token is None:
        return training_args
    args = copy.copy(training_args)
    args.push_to_hub = False
    args.hub_token = None
    return args



def train(model_args: ModelArguments, data_args: DataArguments, training_args: TranslationTrainingArguments) -> str:
    """Train (or fine-tune) a Transformer and save it, with tokenizer and generation config, to `output_dir`.

    Steps: load and clean the parallel text (`modeling.data`), train the shared BPE unless one is given, build the
    preset's model (or load `model_name_or_path`), train with `TokenBudgetSeq2SeqTrainer` (resuming when
    `resume_from_checkpoint` is set), save the final model, and average the last `average_last_checkpoints`
    checkpoints into `output_dir/averaged` (Sec. 6.1). Returns `output_dir`.

    With `push_to_hub`, the main process then pushes the averaged model (`average_last_checkpoints` > 1), else the
    final one, to `hub_model_id` (default: output_dir's name), with the model card of `modeling.hub` rendered from
    this run's records, instead of the Trainer's own pushes. The token (`hub_token`, else HF_TOKEN, else
    `hf auth login`) and the repo name are checked before anything else: a push that cannot happen fails first.
    """
    hub = None
    if training_args.push_to_hub:
        from .hub import prepare_push  # the Hub extras (jinja2, matplotlib) are needed only for a push

        hub = prepare_push(training_args)
    preset = get_preset(model_args.preset)
    set_seed(training_args.seed)  # the same initial weights on every process and every run
    evaluate = training_args.eval_strategy != "no"
    text, cleaning = _load_text(data_args, evaluate=evaluate)
    vocab_size = data_args.vocab_size or preset.vocab_size
    tokenizer = _tokenizer(model_args, data_args, training_args, text["train"], vocab_size)
    model = _model(model_args, preset, len(tokenizer))
    with training_args.main_process_first(local=False, desc="tokenisation"):
        tokenized = tokenize_parallel_dataset(
            text,
            tokenizer,
            data_args.source_lang,
            data_args.target_lang,
            max_length=data_args.max_length,
            num_proc=data_args.preprocessing_num_workers,
        )
    bleu_size = data_args.bleu_sample_size if data_args.bleu_sample_size is not None else preset.bleu_sample_size
    trainer = TokenBudgetSeq2SeqTrainer(
        model=model,
        args=_without_hub_push(training_args),
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"] if evaluate else None,
        bleu_dataset=bleu_sample(tokenized["validation"], bleu_size) if evaluate and bleu_size > 0 else None,
        processing_class=tokenizer,
        compute_metrics=bleu_metrics(tokenizer, data_args.target_lang),
    )
    if trainer.is_world_process_zero():
        _write_run_records(trainer, model_args, data_args, text, cleaning, hub_model_id=hub.repo_id if hub else None)
    result = trainer.train(resume_from_checkpoint=_resume_checkpoint(training_args))
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    averaged = None
    if training_args.average_last_checkpoints > 1 and trainer.is_world_process_zero():
        averaged = _average_last_checkpoints(training_args.output_dir, training_args.average_last_checkpoints)
    if hub is not None:
        from .hub import push_trained_model

        output_dir = Path(training_args.output_dir)
        pushed, description = (averaged, "the averaged model") if averaged else (output_dir, "the final model")
        push_trained_model(hub, pushed, output_dir, description, private=training_args.hub_private_repo)
    return training_args.output_dir


__all__ = ["train", "bleu_sample"]
