"""Tests of modeling/training.py: `train()` end to end, learning, fine-tuning, and what a run records."""

import io
import json
import random
from pathlib import Path
from types import SimpleNamespace

import torch
from helpers import (
    HUB_TOKEN,
    copy_dataset,
    losses,
    make_trainer,
    tiny_model,
    training_args,
    word_for_word,
    word_tokenizer,
    write_corpus,
)
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from modeling import TransformerForConditionalGeneration
from modeling.arguments import DataArguments, ModelArguments, TranslationTrainingArguments
from modeling.presets import get_preset
from modeling.training import _without_hub_push, _write_run_records, train


def test_tiny_preset_loss_falls_over_50_steps(tmp_path):
    preset = get_preset("tiny")
    tokenizer = word_tokenizer()
    vocab_size = len(tokenizer)
    torch.manual_seed(0)
    shrunk = {"d_model": 64, "encoder_layers": 1, "decoder_layers": 1, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128}
    model = TransformerForConditionalGeneration(preset.model_config(vocab_size, **shrunk))
    defaults = preset.training_defaults() | {
        "output_dir": str(tmp_path),
        "max_steps": 50,
        "warmup_steps": 25,  # the preset's warmup, shrunk with the run
        "max_tokens_per_device": 128,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "logging_steps": 1,
    }
    lengths = [random.Random(4).randint(4, 8) for _ in range(200)]
    args = TranslationTrainingArguments(**defaults)
    trainer = make_trainer(args, copy_dataset(lengths, vocab_size), tokenizer, model)
    trainer.train()
    curve = list(losses(trainer.state.log_history).values())
    assert len(curve) == 50
    assert sum(curve[-5:]) / 5 < 0.75 * sum(curve[:5]) / 5, curve


def test_fine_tuning_starts_from_the_saved_model(tmp_path):
    tokenizer = word_tokenizer()
    pretrained = tmp_path / "pretrained"
    tiny_model(len(tokenizer), dropout=0.0).save_pretrained(pretrained)
    tokenizer.save_pretrained(pretrained)
    # A different corpus: German words in reverse order.
    data_dir = write_corpus(tmp_path / "reversed", 100, lambda words: word_for_word(reversed(words)), seed=5)

    output_dir = train(
        ModelArguments(preset="tiny", model_name_or_path=str(pretrained), dropout=0.0),
        DataArguments(data_dir=str(data_dir), source_lang="en", target_lang="de"),
        training_args(
            tmp_path / "fine-tuned", max_steps=20, warmup_steps=5, learning_rate=0.2, max_tokens_per_device=128
        ),
    )
    state = json.loads((Path(output_dir) / "trainer_state.json").read_text())
    curve = list(losses(state["log_history"]).values())
    assert sum(curve[-5:]) / 5 < 0.8 * curve[0], curve
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    assert model.config.d_model == 32, "the saved model's architecture, not the preset's"
    assert AutoTokenizer.from_pretrained(output_dir).get_vocab() == tokenizer.get_vocab()


REPO_ID = "user/tiny"


def test_a_hub_token_argument_stays_out_of_records_and_checkpoints(tmp_path):
    """`--hub_token` puts the token in the arguments: training_args.json masks it, the Trainer never gets it."""
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path), push_to_hub=True, hub_token=HUB_TOKEN, report_to="none", use_cpu=True
    )
    trainer_args = _without_hub_push(args)
    assert (trainer_args.push_to_hub, trainer_args.hub_token) == (False, None)
    assert (args.push_to_hub, args.hub_token) == (True, HUB_TOKEN), "the caller's arguments stay as given"
    saved = io.BytesIO()
    torch.save(trainer_args, saved)  # what the Trainer writes as training_args.bin, in every checkpoint too
    assert HUB_TOKEN.encode() not in saved.getvalue()
    assert HUB_TOKEN not in str(args)

    trainer = SimpleNamespace(args=args, processing_class=[None] * 64)  # the token-holding original: to_dict masks
    model_args, data_args = ModelArguments(preset="tiny"), DataArguments(data_dir="d")
    _write_run_records(trainer, model_args, data_args, {"train": [None] * 3}, {}, hub_model_id=REPO_ID)
    text = (tmp_path / "training_args.json").read_text()
    assert HUB_TOKEN not in text
    records = json.loads(text)
    assert (records["hub_token"], records["push_to_hub"], records["hub_model_id"]) == ("<HUB_TOKEN>", True, REPO_ID)
