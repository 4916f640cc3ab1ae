"""Tests of modeling/averaging.py and scripts/average_checkpoints.py (checkpoint averaging, Sec. 6.1)."""

import runpy
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from modeling import TransformerConfig, TransformerForConditionalGeneration
from modeling.averaging import average_checkpoints, last_checkpoints, list_checkpoints
from modeling.tokenization import train_shared_bpe

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "average_checkpoints.py"


def save_checkpoint(directory: Path, seed: int, d_model: int = 32) -> dict[str, torch.Tensor]:
    """A Trainer-like checkpoint of a tiny random model: weights, config, tokenizer and training state."""
    tokenizer = train_shared_bpe(["the small dog sees a cat", "der kleine Hund sieht eine Katze"], 48, min_frequency=1)
    torch.manual_seed(seed)
    config = TransformerConfig(
        vocab_size=len(tokenizer),
        d_model=d_model,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
    )
    model = TransformerForConditionalGeneration(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"):
        (directory / name).write_bytes(b"training state")
    return load_file(directory / "model.safetensors")


def test_average_of_two_checkpoints_is_their_mean_and_loads(tmp_path):
    first = save_checkpoint(tmp_path / "checkpoint-1000", seed=0)
    second = save_checkpoint(tmp_path / "checkpoint-2000", seed=1)

    output_dir = average_checkpoints(last_checkpoints(tmp_path, 2), tmp_path / "averaged")

    averaged = load_file(output_dir / "model.safetensors")
    assert averaged.keys() == first.keys()
    assert "lm_head.weight" not in averaged, "the tied output projection is stored (and averaged) once"
    for name, tensor in averaged.items():
        assert tensor.dtype == first[name].dtype
        torch.testing.assert_close(tensor, (first[name] + second[name]) / 2, atol=1e-7, rtol=0, msg=name)
    assert not any((output_dir / name).exists() for name in ("optimizer.pt", "trainer_state.json", "rng_state.pth"))

    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir).eval()
    torch.testing.assert_close(model.lm_head.weight, model.model.shared.weight, atol=0, rtol=0)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    generated = model.generate(**tokenizer(["the small dog"], return_tensors="pt"), max_new_tokens=4)
    assert generated.shape[0] == 1
    assert model.generation_config.num_beams == 4, "the generation config travels with the average"


def test_checkpoints_are_ordered_by_step_not_by_name(tmp_path):
    for name in ("checkpoint-900", "checkpoint-1000", "checkpoint-80", "runs", "checkpoint-best"):
        (tmp_path / name).mkdir()
    assert [path.name for path in list_checkpoints(tmp_path)] == ["checkpoint-80", "checkpoint-900", "checkpoint-1000"]
    assert [path.name for path in last_checkpoints(tmp_path, 2)] == ["checkpoint-900", "checkpoint-1000"]
    with pytest.raises(ValueError, match="last 5 checkpoints"):
        last_checkpoints(tmp_path, 5)


def test_checkpoints_of_different_models_are_refused(tmp_path):
    save_checkpoint(tmp_path / "checkpoint-1", seed=0, d_model=32)
    save_checkpoint(tmp_path / "checkpoint-2", seed=0, d_model=64)
    with pytest.raises(ValueError, match="checkpoint-2"):
        average_checkpoints(list_checkpoints(tmp_path), tmp_path / "averaged")


def test_script_averages_the_last_checkpoints(tmp_path, monkeypatch, capsys):
    for step, seed in ((1, 0), (2, 1), (3, 2)):
        save_checkpoint(tmp_path / f"checkpoint-{step}", seed=seed)
    arguments = ["--checkpoint-dir", str(tmp_path), "--last", "2", "--output-dir", str(tmp_path / "averaged")]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *arguments])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    assert "checkpoint-2, checkpoint-3" in capsys.readouterr().out
    expected = [load_file(tmp_path / f"checkpoint-{step}" / "model.safetensors") for step in (2, 3)]
    averaged = load_file(tmp_path / "averaged" / "model.safetensors")
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (expected[0][name] + expected[1][name]) / 2, atol=1e-7, rtol=0)


def test_script_refuses_fewer_than_one_checkpoint(tmp_path, monkeypatch, capsys):
    arguments = ["--checkpoint-dir", str(tmp_path), "--last", "0", "--output-dir", str(tmp_path / "averaged")]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *arguments])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert exit_info.value.code == 2
    assert "--last must be at least 1, got 0" in capsys.readouterr().err
