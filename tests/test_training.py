"""Tests of modeling/training.py and scripts/train.py: the paper's schedule, token budgets through the Trainer,
several processes, resuming, learning, fine-tuning and the command line. Everything is synthetic and tiny."""

import importlib.util
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
from tiny_checkpoint import tiny_config
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, TrainerCallback, TrainerControl

from modeling import TransformerForConditionalGeneration
from modeling.data import TokenBudgetBatchSampler
from modeling.tokenization import train_shared_bpe
from modeling.training import (
    DataArguments,
    ModelArguments,
    SaveEveryMinutesCallback,
    StopAfterMinutesCallback,
    TokenBudgetSeq2SeqTrainer,
    TranslationTrainingArguments,
    _SamplerEpochCallback,
    get_preset,
    gradient_accumulation_steps_for,
    noam_learning_rate,
    noam_scheduler,
    split_batches_to_multiple,
    train,
)

REPO = Path(__file__).resolve().parent.parent
EOS, FIRST_ID = 2, 3
WORDS = "the a small big dog cat sees likes red ball house today".split()
EN_DE = dict(zip(WORDS, "der ein kleine große Hund Katze sieht mag roten Ball Haus heute".split(), strict=True))


# --- fixtures ---------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Models this small train several times faster on one thread, above all on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def word_tokenizer():
    """A shared BPE over the toy vocabulary: every word is one token, ids 0-2 are <pad>, <unk>, </s>."""
    sentences = [" ".join(WORDS), " ".join(EN_DE.values())] * 3
    return train_shared_bpe(sentences, vocab_size=64, min_frequency=1)


def tiny_model(vocab_size: int, dropout: float = 0.0, seed: int = 0) -> TransformerForConditionalGeneration:
    torch.manual_seed(seed)
    config = tiny_config(vocab_size, dropout=dropout)
    return TransformerForConditionalGeneration(config)


def copy_dataset(lengths: list[int], vocab_size: int, seed: int = 0) -> datasets.Dataset:
    """Tokenised copy task: random ids ending in </s>, the target equal to the source."""
    rng = random.Random(seed)
    rows = [[rng.randrange(FIRST_ID, vocab_size) for _ in range(n - 1)] + [EOS] for n in lengths]
    return datasets.Dataset.from_dict(
        {"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows], "labels": [list(r) for r in rows]}
    )


def training_args(output_dir: Path, **overrides) -> TranslationTrainingArguments:
    settings = {
        "output_dir": str(output_dir),
        "use_cpu": True,
        "report_to": "none",
        "disable_tqdm": True,
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "max_grad_norm": 0.0,
        "label_smoothing_factor": 0.1,
        "adam_beta2": 0.98,
        "adam_epsilon": 1e-9,
        "optim": "adamw_torch",
        "learning_rate": 1.0,
        "seed": 0,
    }
    return TranslationTrainingArguments(**{**settings, **overrides})


def make_trainer(args, dataset, tokenizer, model, trainer_class=TokenBudgetSeq2SeqTrainer, **kwargs):
    return trainer_class(
        model=model,
        args=args,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        train_dataset=dataset,
        processing_class=tokenizer,
        **kwargs,
    )


def equal_length_halves(vocab_size: int) -> datasets.Dataset:
    """8 examples that a budget of 36 padded tokens cuts into exactly 2 batches: 4 × length 5 and 4 × length 9."""
    return copy_dataset([5, 9] * 4, vocab_size, seed=1)


def one_sgd_update(output_dir: Path, max_tokens: int, **overrides) -> dict[str, torch.Tensor]:
    """Weights after one SGD update with the step-1 rate d_model^-0.5 (warmup 1); SGD, unlike Adam, shows any
    error in the scale of the gradient."""
    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer))
    settings = {"max_steps": 1, "optim": "sgd", "warmup_steps": 1, "max_tokens_per_device": max_tokens}
    args = training_args(output_dir, **settings, **overrides)
    make_trainer(args, equal_length_halves(len(tokenizer)), tokenizer, model).train()
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_same_update(actual: dict, expected: dict, initial: dict) -> None:
    moved = max((expected[name] - initial[name]).abs().max().item() for name in expected)
    assert moved > 1e-3, "the update should move the weights"
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=1e-5, rtol=0, msg=name)


def losses(log_history: list[dict]) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in log_history if "loss" in entry}


# --- the schedule (Sec. 5.3) ------------------------------------------------------------------------------------


def test_schedule_values_equal_the_formula():
    def formula(step):
        return 512**-0.5 * min(step**-0.5, step * 4000**-1.5)

    for step in (1, 4000, 100_000):
        assert noam_learning_rate(step, 512, 4000) == formula(step)
    assert noam_learning_rate(4000, 512, 4000) == pytest.approx(6.98771e-4, rel=1e-5)  # the peak
    assert noam_learning_rate(1, 512, 4000) == pytest.approx(1.74693e-7, rel=1e-5)
    assert noam_learning_rate(100_000, 512, 4000) == pytest.approx(1.39754e-4, rel=1e-5)

    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    scheduler = noam_scheduler(optimizer, d_model=512, warmup_steps=4000)
    for step in (1, 4000, 100_000):  # the factor for update `step` is asked with the scheduler's counter step - 1
        assert scheduler.lr_lambdas[0](step - 1) == formula(step)
    for step in (1, 2, 3):  # update 1 uses the rate of step 1, update 2 that of step 2, ...
        assert optimizer.param_groups[0]["lr"] == formula(step)
        optimizer.step()
        scheduler.step()


def test_first_trainer_update_uses_the_step_one_rate(tmp_path):
    class RecordLearningRate(TrainerCallback):
        def __init__(self):
            self.rates = []

        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            self.rates.append(optimizer.param_groups[0]["lr"])

    tokenizer = word_tokenizer()
    args = training_args(tmp_path, max_steps=3, warmup_steps=2, learning_rate=0.5, max_tokens_per_device=36)
    record = RecordLearningRate()
    trainer = make_trainer(args, equal_length_halves(len(tokenizer)), tokenizer, tiny_model(len(tokenizer)))
    trainer.add_callback(record)
    trainer.train()
    expected = [0.5 * noam_learning_rate(step, 32, 2) for step in (1, 2, 3)]
    assert record.rates == pytest.approx(expected, rel=1e-12)
    logged = [entry["learning_rate"] for entry in trainer.state.log_history if "loss" in entry]
    assert logged == pytest.approx(expected, rel=1e-12)


# --- token budgets ----------------------------------------------------------------------------------------------


def test_gradient_accumulation_steps_follow_the_world_size(caplog):
    assert gradient_accumulation_steps_for(25000, 3300, world_size=1) == 8
    assert gradient_accumulation_steps_for(25000, 3300, world_size=8) == 1
    assert "off the" not in caplog.text
    assert gradient_accumulation_steps_for(25000, 5000, world_size=8) == 1  # 40000 tokens: 60% too many
    assert "+60% off the 25000 asked" in caplog.text


def test_tokens_per_update_and_accumulation_steps_exclude_each_other(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        training_args(tmp_path, tokens_per_update=25000, gradient_accumulation_steps=2)


def test_split_batches_to_multiple_keeps_every_example_once():
    batches = split_batches_to_multiple([[0, 1, 2, 3], [4, 5], [6]], 4)
    assert len(batches) == 4
    assert sorted(i for batch in batches for i in batch) == list(range(7))


def test_two_half_batches_accumulated_equal_one_full_batch(tmp_path):
    initial = tiny_model(len(word_tokenizer())).state_dict()
    full = one_sgd_update(tmp_path / "full", max_tokens=1000)  # one batch of all 8 examples
    # A budget of 36 cuts the 8 examples in 2 batches with 20 and 36 target tokens; asking for 56 tokens per
    # update makes the trainer accumulate 2 of them.
    accumulated = one_sgd_update(tmp_path / "halves", max_tokens=36, tokens_per_update=56)
    assert_same_update(accumulated, full, initial)


WORKER = """
import json, os, sys, torch
sys.path.insert(0, {tests_dir!r})
from test_training import TokenBudgetSeq2SeqTrainer, copy_dataset, equal_length_halves, make_trainer, tiny_model
from test_training import training_args, word_tokenizer
from modeling.training import bleu_metrics

class RecordingTrainer(TokenBudgetSeq2SeqTrainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        rows = [[t for t in row if t != 0] for row in inputs["input_ids"].tolist()]
        with open(os.path.join({out!r}, f"batches_{{self.args.process_index}}.jsonl"), "a") as f:
            f.write(json.dumps(rows) + "\\n")
        return super().training_step(model, inputs, num_items_in_batch)

tokenizer = word_tokenizer()
model = tiny_model(len(tokenizer))
args = training_args({out!r}, max_steps=1, optim="sgd", warmup_steps=1, max_tokens_per_device=36, ddp_backend="gloo",
                     predict_with_generate=True, generation_max_length=4)
three = copy_dataset([5, 5, 9], len(tokenizer), seed=7)  # one batch, split in two for the two processes
trainer = make_trainer(args, equal_length_halves(len(tokenizer)), tokenizer, model, RecordingTrainer,
                       eval_dataset=three, bleu_dataset=three, compute_metrics=bleu_metrics(tokenizer, "de"))
trainer.train()
metrics = trainer.evaluate()
if trainer.is_world_process_zero():
    torch.save(model.state_dict(), os.path.join({out!r}, "weights.pt"))
    with open(os.path.join({out!r}, "metrics.json"), "w") as f:
        json.dump(metrics, f)
"""


def test_two_processes_match_one_process_over_the_same_global_batch(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER.format(tests_dir=str(Path(__file__).parent), out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    rank_batches = [
        [json.loads(line) for line in (tmp_path / f"batches_{rank}.jsonl").read_text().splitlines()] for rank in (0, 1)
    ]
    assert [len(batches) for batches in rank_batches] == [1, 1], "each rank takes one of the two batches"
    rows = [tuple(row) for batches in rank_batches for batch in batches for row in batch]
    expected = [tuple(row) for row in equal_length_halves(len(word_tokenizer()))["input_ids"]]
    assert sorted(rows) == sorted(expected), "the two ranks' batches are disjoint and cover the global batch"

    initial = tiny_model(len(word_tokenizer())).state_dict()
    single = one_sgd_update(tmp_path / "single", max_tokens=36, gradient_accumulation_steps=2)
    assert_same_update(torch.load(tmp_path / "weights.pt"), single, initial)

    # Evaluation: 3 examples in one token batch, split so that each of the two processes gets one batch and no
    # example is translated (and counted) twice.
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["eval_sample_sentences"] == 3
    assert math.isfinite(metrics["eval_loss"])


# --- checkpoints and resuming -----------------------------------------------------------------------------------


def test_sampler_epoch_follows_completed_updates_when_resuming():
    """Resuming after 7 updates of 2 micro-batches, with 4 batches (2 updates) per epoch, is in epoch 3."""
    callback, sampler = _SamplerEpochCallback(), TokenBudgetBatchSampler([3] * 8, [3] * 8, max_tokens=6)
    callback.sampler = sampler
    args, state = SimpleNamespace(gradient_accumulation_steps=2), SimpleNamespace(global_step=7)
    callback.on_epoch_begin(args, state, TrainerControl(), train_dataloader=list(sampler))
    assert (len(sampler), sampler.epoch) == (4, 3)


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """time.monotonic() under the test's control: advance it with `clock[0] += seconds`."""
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


CPU_ARGS = SimpleNamespace(device=torch.device("cpu"))


def test_checkpoints_every_n_minutes(clock):
    callback = SaveEveryMinutesCallback(minutes=10)
    callback.on_train_begin(CPU_ARGS, None, None)
    control = TrainerControl()
    clock[0] += 9 * 60
    callback.on_step_end(CPU_ARGS, None, control)
    assert not control.should_save
    clock[0] += 60
    callback.on_step_end(CPU_ARGS, None, control)
    assert control.should_save
    callback.on_save(CPU_ARGS, None, control)  # the clock restarts at every save, step-based ones too
    control = TrainerControl()
    clock[0] += 60
    callback.on_step_end(CPU_ARGS, None, control)
    assert not control.should_save


def test_training_stops_with_a_checkpoint_when_the_minutes_are_spent(clock):
    callback = StopAfterMinutesCallback(minutes=90)
    callback.on_train_begin(CPU_ARGS, None, None)
    control = TrainerControl()
    clock[0] += 89 * 60
    callback.on_step_end(CPU_ARGS, SimpleNamespace(global_step=7), control)
    assert not (control.should_training_stop or control.should_save)
    clock[0] += 60
    callback.on_step_end(CPU_ARGS, SimpleNamespace(global_step=8), control)
    assert control.should_training_stop and control.should_save


def test_trainer_smooths_labels_in_the_models_fused_loss(tmp_path):
    from transformers.trainer_pt_utils import LabelSmoother

    tokenizer = word_tokenizer()
    model = tiny_model(len(tokenizer))
    args = training_args(tmp_path, max_steps=1, max_tokens_per_device=36)
    dataset = equal_length_halves(len(tokenizer))
    trainer = make_trainer(args, dataset, tokenizer, model)
    assert trainer.label_smoother is None, "the Trainer's own smoother would smooth a second time"
    short = dataset.select([0, 2, 4, 6])  # the four of length 5: one batch
    batch = trainer.data_collator(list(short))
    loss = trainer.compute_loss(model, dict(batch))
    # The training forward fuses the loss and returns no logits (dropout is 0: the same forward gives them).
    expected = LabelSmoother(epsilon=0.1)(model(**batch, skip_logits=False), batch["labels"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    # Only `labels` is a label: an argument named like one would leave evaluation without a loss.
    assert trainer.label_names == ["labels"]
    assert trainer.evaluate(short)["eval_loss"] == pytest.approx(expected.item(), rel=1e-5)


def test_resumed_run_has_the_losses_of_the_uninterrupted_run(tmp_path):
    tokenizer = word_tokenizer()
    lengths = [random.Random(2).randint(3, 9) for _ in range(24)]
    dataset = copy_dataset(lengths, len(tokenizer), seed=3)

    def run(output_dir, resume=None):
        # Adam and dropout as in the paper: resuming must restore optimizer, schedule, RNG and data order.
        args = training_args(
            output_dir, max_steps=6, warmup_steps=2, max_tokens_per_device=48, save_strategy="steps", save_steps=3
        )
        trainer = make_trainer(args, dataset, tokenizer, tiny_model(len(tokenizer), dropout=0.1))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    uninterrupted = run(tmp_path / "a")
    batches_per_epoch = len(uninterrupted.get_train_dataloader())
    assert 3 < batches_per_epoch < 6, "steps 4-6 must finish one epoch and start the next"
    resumed = run(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-3"))
    expected, actual = losses(uninterrupted.state.log_history), losses(resumed.state.log_history)
    assert sorted(expected) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        assert actual[step] == pytest.approx(expected[step], rel=1e-6, abs=1e-7), step


# --- learning ---------------------------------------------------------------------------------------------------


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


# --- the pipeline and the command line --------------------------------------------------------------------------


def write_corpus(directory: Path, count: int, transform, seed: int = 0) -> Path:
    """train/val files of toy English and `transform(words)` as the target side."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", count), ("val", 16)):
        pairs = [rng.choices(WORDS, k=rng.randint(3, 7)) for _ in range(n)]
        (directory / f"{split}.en").write_text("\n".join(" ".join(p) for p in pairs) + "\n", encoding="utf-8")
        (directory / f"{split}.de").write_text("\n".join(transform(p) for p in pairs) + "\n", encoding="utf-8")
    return directory


def word_for_word(words):
    return " ".join(EN_DE[w] for w in words)


def test_fine_tuning_starts_from_the_saved_model(tmp_path):
    tokenizer = word_tokenizer()
    pretrained = tmp_path / "pretrained"
    tiny_model(len(tokenizer)).save_pretrained(pretrained)
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


def load_train_script():
    spec = importlib.util.spec_from_file_location("train_script", REPO / "scripts" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_takes_dashes_and_yaml_over_preset_defaults(tmp_path):
    script = load_train_script()
    flags = "--preset tiny --data-dir d --source-lang en --max_steps 7 --d-model 64 --report_to none".split()
    model_args, data_args, args = script.parse([*flags, "--output-dir", str(tmp_path)])
    assert (model_args.preset, model_args.d_model, data_args.data_dir) == ("tiny", 64, "d")
    assert args.max_steps == 7, "an explicit flag wins over the preset"
    assert (args.warmup_steps, args.learning_rate, args.max_grad_norm) == (400, 0.3, 0.0), "preset defaults"
    assert (args.adam_beta2, args.adam_epsilon, args.label_smoothing_factor) == (0.98, 1e-9, 0.1)

    config = tmp_path / "run.yaml"
    config.write_text(f"preset: base\ndata_dir: d\noutput_dir: {tmp_path}\nsave_steps: 7\nreport_to: none\n")
    model_args, data_args, args = script.parse([str(config)])
    assert (model_args.preset, args.save_steps, args.max_steps, args.tokens_per_update) == ("base", 7, 100_000, 25000)


def test_train_script_writes_a_loadable_model(tmp_path):
    data_dir = write_corpus(tmp_path / "data", 120, word_for_word)
    output_dir = tmp_path / "run"
    flags = (
        "--preset tiny --source-lang en --target-lang de --max_steps 3 --d_model 32 --num_layers 1 --num_heads 4 "
        "--ffn_dim 64 --vocab_size 64 --max_tokens_per_device 256 --eval_steps 2 --save_steps 2 "
        "--bleu_sample_size 4 --generation_max_length 8 --average_last_checkpoints 2 --report_to tensorboard "
        "--use_cpu --disable_tqdm true"
    ).split()
    script = str(REPO / "scripts" / "train.py")
    command = [sys.executable, script, *flags, "--data-dir", str(data_dir), "--output-dir", str(output_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert any("eval_sample_bleu" in entry for entry in state["log_history"])
    assert list(output_dir.glob("runs/*/events.out.tfevents.*")), "TensorBoard logs"
    assert (output_dir / "training_args.json").is_file() and (output_dir / "data_stats.json").is_file()
    generation = json.loads((output_dir / "generation_config.json").read_text())
    assert generation["num_beams"] == 4 and "max_length" not in generation, "evaluation left the paper's decoding"
    for model_dir in (output_dir, output_dir / "averaged"):
        model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        generated = model.generate(**tokenizer(["the dog sees a cat"], return_tensors="pt"), max_new_tokens=5)
        assert generated.shape[0] == 1
    assert math.isfinite(state["log_history"][-1]["train_loss"])
