"""Tests of modeling/checkpoints.py: what counts as a complete checkpoint, with or without the marker, and what
identifies a run."""

import json
import logging

import pytest
import tokenizers
import torch
from helpers import save_tiny_checkpoint, save_trainer_checkpoint, word_tokenizer
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerFast

from modeling.checkpoints import (
    COMPLETE_MARKER,
    IncompleteCheckpointError,
    checkpoint_problems,
    complete_checkpoints,
    describe_differences,
    identity_differences,
    latest_complete_checkpoint,
    require_complete_checkpoint,
    safetensors_problem,
    saved_vocabulary_fingerprint,
    vocabulary_fingerprint,
    weight_files,
    write_completeness_marker,
)
from modeling.modeling_transformer import TransformerForConditionalGeneration


def truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_legacy_checkpoint_without_marker_counts_when_its_files_are_intact(tmp_path):
    checkpoint = tmp_path / "checkpoint-10"
    save_trainer_checkpoint(checkpoint, seed=0)
    assert checkpoint_problems(checkpoint) == []
    assert safetensors_problem(checkpoint / "model.safetensors") is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("model.safetensors", "model.safetensors is truncated"),
        ("optimizer.pt", "optimizer.pt is not a readable archive"),
        ("trainer_state.json", "trainer_state.json does not parse"),
    ],
)
def test_a_legacy_checkpoint_with_a_truncated_file_is_incomplete(tmp_path, name, expected):
    checkpoint = tmp_path / "checkpoint-10"
    save_trainer_checkpoint(checkpoint, seed=0)
    truncate(checkpoint / name)
    problems = checkpoint_problems(checkpoint)
    assert problems[0] == f"no {COMPLETE_MARKER}, and" and any(expected in problem for problem in problems)


def test_the_marker_decides_with_every_file_and_its_size(tmp_path):
    checkpoint = tmp_path / "checkpoint-10"
    save_trainer_checkpoint(checkpoint, seed=0)
    marker = json.loads(write_completeness_marker(checkpoint, step=10).read_text())
    assert marker["step"] == 10 and marker["files"]["model.safetensors"] > 0 and COMPLETE_MARKER not in marker["files"]
    assert checkpoint_problems(checkpoint) == []
    (checkpoint / "scheduler.pt").unlink()
    truncate(checkpoint / "config.json", keep=0.9)
    problems = checkpoint_problems(checkpoint)
    assert "scheduler.pt is missing" in problems
    assert any(problem.startswith("config.json has") and f"{COMPLETE_MARKER} says" in problem for problem in problems)


@pytest.mark.parametrize("files", [[], None, "model.safetensors", {"model.safetensors": "12"}])
def test_a_marker_whose_file_list_is_not_one_makes_its_checkpoint_incomplete(tmp_path, files):
    """An edited or damaged marker: an AttributeError traceback (`.items()` of a list) before, from listing,
    resuming, rotation and averaging alike."""
    checkpoint = tmp_path / "checkpoint-10"
    save_trainer_checkpoint(checkpoint, seed=0)
    marker = write_completeness_marker(checkpoint, step=10)
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "files": files}))
    assert checkpoint_problems(checkpoint) == [f"{COMPLETE_MARKER} does not list files and sizes"]
    assert latest_complete_checkpoint(tmp_path) is None


def test_resume_and_listing_skip_incomplete_checkpoints_naming_them(tmp_path, caplog):
    for step in (10, 20, 30):
        save_trainer_checkpoint(tmp_path / f"checkpoint-{step}", seed=step)
        write_completeness_marker(tmp_path / f"checkpoint-{step}")
    truncate(tmp_path / "checkpoint-30" / "model.safetensors")
    (tmp_path / "checkpoint-40").mkdir()  # a save killed before the marker, in an older layout
    with caplog.at_level(logging.WARNING, logger="modeling.checkpoints"):
        assert latest_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-20"
    assert "checkpoint-40" in caplog.text and "checkpoint-30" in caplog.text
    assert [path.name for path in complete_checkpoints(tmp_path)] == ["checkpoint-10", "checkpoint-20"]
    with pytest.raises(IncompleteCheckpointError, match=r"checkpoint-30 is incomplete: model\.safetensors has"):
        require_complete_checkpoint(tmp_path / "checkpoint-30")
    with pytest.raises(IncompleteCheckpointError, match="does not exist"):
        require_complete_checkpoint(tmp_path / "checkpoint-50")
    assert latest_complete_checkpoint(tmp_path / "nowhere") is None


def test_identities_differ_by_named_fields():
    first = {"config": {"d_model": 32, "dropout": 0.1}, "seed": 1, "data": {"files": [{"name": "train.en"}]}}
    second = {"config": {"d_model": 64, "dropout": 0.1}, "seed": 1, "data": {"files": [{"name": "train.fr"}]}}
    fields = identity_differences(first, second)
    assert fields == ["config.d_model", "data.files"]
    assert describe_differences(first, second, fields) == (
        "config.d_model: 32 vs 64; data.files: train.en only in one, train.fr only in one"
    )


def unigram_tokenizer() -> PreTrainedTokenizerFast:
    pieces = [("<unk>", 0.0), ("a", -1.0), ("b", -2.0), ("ab", -0.5)]
    model = tokenizers.Tokenizer(tokenizers.models.Unigram(pieces, unk_id=0))
    return PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>", pad_token="<pad>")  # <pad> added


@pytest.mark.parametrize("make_tokenizer", [word_tokenizer, unigram_tokenizer], ids=["bpe", "unigram"])
def test_a_saved_tokenizer_has_the_fingerprint_of_the_loaded_one(make_tokenizer, tmp_path):
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    assert saved_vocabulary_fingerprint(tmp_path) == vocabulary_fingerprint(tokenizer.get_vocab())
    assert saved_vocabulary_fingerprint(tmp_path / "nowhere") is None


def test_a_config_field_only_one_side_has_is_no_difference():
    """A newer transformers may add a field to every config: that alone does not make another run."""
    recorded = {"config": {"d_model": 32}, "seed": 0}
    assert identity_differences(recorded, {"config": {"d_model": 32, "new_field": 1}, "seed": 0}) == []
    assert identity_differences(recorded, {"config": {"d_model": 64}, "seed": 0}) == ["config.d_model"]
    assert identity_differences(recorded, {"config": {"d_model": 32}}) == ["seed"], "outside config, all fields count"


def test_the_weight_files_are_those_from_pretrained_loads_where_a_sharded_save_left_a_single_file(tmp_path):
    """A sharded save over a single-file one leaves model.safetensors beside the new index, and from_pretrained loads
    model.safetensors: the run's records (weights_record) and averaging read the shards instead."""
    first, _ = save_tiny_checkpoint(tmp_path)
    torch.manual_seed(1)
    second = TransformerForConditionalGeneration(first.config)
    second.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and (tmp_path / "model.safetensors").is_file()
    loaded = TransformerForConditionalGeneration.from_pretrained(tmp_path).state_dict()
    [read] = [load_file(path) for path in weight_files(tmp_path)]
    assert all(torch.equal(loaded[name], tensor) for name, tensor in read.items())
    assert torch.equal(read["model.shared.weight"], first.state_dict()["model.shared.weight"])
