"""Tests of modeling/checkpoints.py: what counts as a complete checkpoint, with or without the marker, and what
identifies a run."""

import json
import logging
import re

import pytest
import tokenizers
import torch
from helpers import save_tiny_checkpoint, save_trainer_checkpoint, word_tokenizer
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerFast

from modeling import checkpoints
from modeling.checkpoints import (
    COMPLETE_MARKER,
    RUN_IDENTITY_FILE,
    IncompleteCheckpointError,
    checkpoint_problems,
    checkpoint_step,
    complete_checkpoints,
    config_identity,
    describe_differences,
    describe_problems,
    identity_differences,
    latest_complete_checkpoint,
    list_checkpoints,
    marker_record,
    model_differences,
    read_run_identity,
    require_complete_checkpoint,
    safetensors_problem,
    saved_training_arguments,
    saved_update,
    saved_vocabulary_fingerprint,
    staging_directories,
    vocabulary_fingerprint,
    weight_files,
    weights_problems,
    weights_record,
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


def test_a_tokenizer_json_whose_model_lists_no_vocabulary_fingerprints_its_added_tokens(tmp_path):
    """Another tool's tokenizer.json, or one edited by hand, whose model has no `vocab` (or a null one, or is null):
    a fingerprint of what it holds, not a TypeError that stops the run recording its identity."""
    added = [{"content": "<pad>", "id": 0}]
    for model in [{"type": "WordLevel"}, {"type": "WordLevel", "vocab": None}, None]:
        (tmp_path / "tokenizer.json").write_text(json.dumps({"model": model, "added_tokens": added}))
        assert saved_vocabulary_fingerprint(tmp_path) == vocabulary_fingerprint({"<pad>": 0})


def test_a_tokenizer_json_cut_short_is_named(tmp_path):
    """A checkpoint copied in part: comparing checkpoints' tokenizers (averaging) named no file."""
    (tmp_path / "tokenizer.json").write_text('{"model": {"vocab": {"a"', encoding="utf-8")
    expected = f"^{re.escape(str(tmp_path / 'tokenizer.json'))} does not parse \\(Expecting"
    with pytest.raises(ValueError, match=expected):
        saved_vocabulary_fingerprint(tmp_path)


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


def test_checkpoint_steps_and_listing(tmp_path):
    for name in ("checkpoint-900", "checkpoint-1000", ".checkpoint-1100.partial", ".checkpoint-800.old", "runs"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-5").write_text("a file, not a checkpoint")
    (tmp_path / ".checkpoint-5.partial").write_text("a file, not what a save left")
    assert checkpoint_step(tmp_path / "checkpoint-900") == 900
    with pytest.raises(ValueError, match=r"runs is not a Trainer checkpoint directory \(checkpoint-<step>\)"):
        checkpoint_step(tmp_path / "runs")
    assert list_checkpoints(tmp_path) == [tmp_path / "checkpoint-900", tmp_path / "checkpoint-1000"]
    assert staging_directories(tmp_path) == [tmp_path / ".checkpoint-1100.partial", tmp_path / ".checkpoint-800.old"]
    assert staging_directories(tmp_path / "nowhere") == []
    with pytest.raises(FileNotFoundError, match="Checkpoint directory .*nowhere does not exist"):
        list_checkpoints(tmp_path / "nowhere")


def test_a_checkpoint_renamed_still_tells_its_update(tmp_path):
    save_trainer_checkpoint(tmp_path / "renamed", seed=7)  # trainer_state.json says global_step 7
    assert saved_update(tmp_path / "renamed") == 7


def test_complete_checkpoints_warn_of_those_they_skip_unless_told_not_to(tmp_path, caplog):
    save_trainer_checkpoint(tmp_path / "checkpoint-10", seed=0)
    (tmp_path / "checkpoint-20").mkdir()
    with caplog.at_level(logging.WARNING, logger="modeling.checkpoints"):
        assert complete_checkpoints(tmp_path, warn=False) == [tmp_path / "checkpoint-10"]
        assert caplog.text == ""
        assert complete_checkpoints(tmp_path) == [tmp_path / "checkpoint-10"]
    assert f"Skipping the incomplete checkpoint {tmp_path / 'checkpoint-20'}: no {COMPLETE_MARKER}, and" in caplog.text
    assert require_complete_checkpoint(tmp_path / "checkpoint-10") == tmp_path / "checkpoint-10"
    with pytest.raises(IncompleteCheckpointError) as missing:
        require_complete_checkpoint(tmp_path / "checkpoint-30")
    assert str(missing.value) == f"Checkpoint {tmp_path / 'checkpoint-30'} does not exist."


def write_safetensors(path, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)


def test_safetensors_problems_name_what_is_wrong(tmp_path):
    path = tmp_path / "model.safetensors"
    assert safetensors_problem(path) == "model.safetensors is missing"
    path.write_bytes(bytes(7))
    assert safetensors_problem(path) == "model.safetensors is truncated (7 bytes, not even a header)"
    path.write_bytes((100).to_bytes(8, "little") + b"{}")
    assert safetensors_problem(path) == "model.safetensors is truncated (10 bytes, its header alone needs 108)"
    path.write_bytes((3).to_bytes(8, "little") + b"{}")  # a byte short
    assert safetensors_problem(path) == "model.safetensors is truncated (10 bytes, its header alone needs 11)"
    write_safetensors(path, b"not json")
    assert safetensors_problem(path).startswith("model.safetensors cannot be read (JSONDecodeError: ")
    write_safetensors(path, b"[1, 2]")
    assert safetensors_problem(path) == "model.safetensors has no valid safetensors header"
    for entry in (
        b'{"a": 1}',
        b'{"a": {"dtype": "F32"}}',
        b'{"a": {"data_offsets": [0]}}',
        b'{"a": {"data_offsets": "0, 8"}}',
        b'{"a": {"data_offsets": ["0", "8"]}}',  # offsets as text: not a TypeError adding them up
    ):
        write_safetensors(path, entry)  # an edited header that parses: named, not a KeyError or TypeError
        assert safetensors_problem(path) == "model.safetensors has no valid safetensors header", entry
    # a float offset, which safetensors refuses to load, though the file's size is what it adds up to
    write_safetensors(path, b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8.0]}}', bytes(8))
    assert safetensors_problem(path) == "model.safetensors has no valid safetensors header"
    write_safetensors(path, b'{"__metadata__": {"format": "pt"}}')  # metadata alone: no tensors
    assert safetensors_problem(path) is None
    write_safetensors(path, b"{}")  # no tensors: the header is the whole file
    assert safetensors_problem(path) is None
    entry = b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    write_safetensors(path, entry, bytes(12))
    assert safetensors_problem(path) == "model.safetensors is longer than its header says (81 bytes, expected 77)"
    write_safetensors(path, entry, bytes(4))  # the header whole, the data cut short
    assert safetensors_problem(path) == "model.safetensors is truncated (73 bytes, expected 77)"


def test_what_is_wrong_with_a_directory_s_weights(tmp_path):
    assert weights_problems(tmp_path) == ["no weights (model.safetensors)"]
    assert weights_problems(tmp_path, missing_ok=True) == []
    (tmp_path / "model.safetensors.index.json").write_text("{")
    assert weights_problems(tmp_path)[0].startswith("model.safetensors.index.json cannot be read (JSONDecodeError")
    index = {"weight_map": {"a": "model-2.safetensors", "b": "model-1.safetensors", "c": "model-2.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weight_files(tmp_path) == [tmp_path / "model-1.safetensors", tmp_path / "model-2.safetensors"]
    assert weights_problems(tmp_path) == ["model-1.safetensors is missing", "model-2.safetensors is missing"]
    write_safetensors(tmp_path / "model-1.safetensors", b"{}")
    # A Hub cache's snapshot with one shard downloaded so far: that one is judged, the other not yet there.
    assert weights_problems(tmp_path, missing_ok=True) == []
    (tmp_path / "model-1.safetensors").write_bytes(bytes(3))
    assert weights_problems(tmp_path, missing_ok=True) == [
        "model-1.safetensors is truncated (3 bytes, not even a header)"
    ]
    (tmp_path / "model-1.safetensors").unlink()
    (tmp_path / "model.safetensors.index.json").unlink()
    write_safetensors(tmp_path / "b.safetensors", b"{}")
    write_safetensors(tmp_path / "a.safetensors", b"{}")
    assert weight_files(tmp_path) == [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]  # neither: any found


def test_a_checkpoint_whose_weights_are_a_pytorch_model_bin_is_named_as_such_not_as_weightless(tmp_path):
    """An older transformers' checkpoint: averaging it said "incomplete: ... no weights (model.safetensors)"."""
    save_tiny_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "pytorch_model.bin")  # only the name matters here
    expected = (
        "no weights in safetensors (model.safetensors), only pytorch_model.bin (an older transformers' pickle): "
        "load it with from_pretrained and save_pretrained it to convert it"
    )
    assert weights_problems(tmp_path) == [expected]
    assert checkpoint_problems(tmp_path, training_state=False) == [f"no {COMPLETE_MARKER}, and", expected]


def test_checkpoint_problems_of_a_missing_checkpoint_an_unreadable_marker_and_missing_files(tmp_path):
    assert checkpoint_problems(tmp_path / "checkpoint-1") == [f"{tmp_path / 'checkpoint-1'} does not exist"]
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    problems = checkpoint_problems(checkpoint)
    assert problems[:3] == [f"no {COMPLETE_MARKER}, and", "config.json is missing", "no weights (model.safetensors)"]
    assert describe_problems(problems).startswith(f"no {COMPLETE_MARKER}, and config.json is missing; no weights")
    assert describe_problems(["a", "b"]) == "a; b" and describe_problems([]) == ""
    (checkpoint / COMPLETE_MARKER).write_text("{")
    assert checkpoint_problems(checkpoint)[0].startswith(f"{COMPLETE_MARKER} cannot be read (JSONDecodeError")
    assert marker_record(checkpoint) == {}
    (checkpoint / COMPLETE_MARKER).write_text("[]")
    assert marker_record(checkpoint) == {}
    write_completeness_marker(checkpoint, save_strategy="steps")
    assert marker_record(checkpoint) == {"save_strategy": "steps", "files": {}}
    (checkpoint / "tokenizer").mkdir()
    (checkpoint / "tokenizer" / "vocab.json").write_text("{}")
    marker = json.loads(write_completeness_marker(checkpoint).read_text())
    assert marker["files"] == {"tokenizer/vocab.json": 2}, "files below it, not directories"


def test_the_trainers_arguments_are_read_without_running_their_pickle(tmp_path):
    from transformers import Seq2SeqTrainingArguments

    arguments = Seq2SeqTrainingArguments(tmp_path / "out", save_strategy="epoch", save_steps=7, report_to="none")
    torch.save(arguments, tmp_path / "training_args.bin")
    fields = saved_training_arguments(tmp_path)
    assert fields["save_strategy"] == "epoch" and fields["save_steps"] == 7  # an enum's value, a plain field
    assert saved_training_arguments(tmp_path / "nowhere") is None


def test_what_identifies_a_config_a_vocabulary_and_files(tmp_path):
    config = {"d_model": 32, "transformers_version": "5.0.0", "_name_or_path": "/somewhere", "dtype": "float32"}
    assert config_identity(config) == {"d_model": 32}
    assert vocabulary_fingerprint({"a": 0, "b": 1}) == vocabulary_fingerprint({"b": 1, "a": 0})
    assert vocabulary_fingerprint({"a": 0, "b": 1}) != vocabulary_fingerprint({"a": 1, "b": 0})
    # Recorded in every run identity: a changed canonical form would make every earlier run another one.
    assert (
        vocabulary_fingerprint({"a": 0, "ü": 1}) == "09496d389932575139cebd4b35b592cefeae65fe16f4e024c963f2e025d19b39"
    )
    (tmp_path / "vocab.json").write_text('{"a": 0}')
    (tmp_path / "merges.txt").write_text("a b")
    before = saved_vocabulary_fingerprint(tmp_path)
    assert before is not None and len(before) == 64
    (tmp_path / "merges.txt").write_text("a c")
    after_merges = saved_vocabulary_fingerprint(tmp_path)
    (tmp_path / "vocab.json").write_text('{"b": 0}')
    assert len({before, after_merges, saved_vocabulary_fingerprint(tmp_path)}) == 3
    (tmp_path / "model.safetensors").write_bytes(b"12345")
    [record] = weights_record(tmp_path)
    assert record["name"] == "model.safetensors" and record["size"] == 5 and len(record["sha256"]) == 64


def test_a_run_identity_is_read_none_where_there_is_none_and_refused_where_it_does_not_parse(tmp_path):
    assert read_run_identity(tmp_path) is None
    (tmp_path / RUN_IDENTITY_FILE).write_text('{"seed": 1}')
    assert read_run_identity(tmp_path) == {"seed": 1}
    (tmp_path / RUN_IDENTITY_FILE).write_text("{")
    with pytest.raises(ValueError, match=f"{RUN_IDENTITY_FILE} does not parse"):
        read_run_identity(tmp_path)


def test_identity_fields_recorded_later_or_changing_kind_are_named():
    assert identity_differences({"seed": 1}, {"seed": 1, "model_revision": "abc"}) == [], "recorded before it existed"
    assert identity_differences({"model_revision": "abc"}, {"model_revision": "def"}) == ["model_revision"]
    assert identity_differences({"data": {"a": 1}}, {"data": {"a": 1, "b": 2}}) == ["data.b"], "only config is lenient"
    assert identity_differences({"data": {"files": []}}, {"data": None}) == ["data"]
    assert identity_differences({"data": None}, {"data": {"files": []}}) == ["data"], "either way round"
    files = [{"name": "train.en"}]
    assert (
        describe_differences({"files": files}, {"files": None}, ["files"]) == 'files: [{"name": "train.en"}] vs null'
    )
    assert (  # either way round: not an AttributeError in the middle of a refusal's message
        describe_differences({"files": None}, {"files": files}, ["files"]) == 'files: null vs [{"name": "train.en"}]'
    )
    betas = describe_differences({"betas": [0.9, 0.98]}, {"betas": [0.9, 0.997]}, ["betas"])
    assert betas == "betas: [0.9, 0.98] vs [0.9, 0.997]", "a list of numbers is no list of files"
    # a list of records without names (not files): shown whole, not a KeyError in the middle of a refusal's message
    unnamed = describe_differences({"steps": [{"lr": 1}]}, {"steps": [{"lr": 2}]}, ["steps"])
    assert unnamed == 'steps: [{"lr": 1}] vs [{"lr": 2}]'
    shown_whole, cut = "ü" * 78, "x" * 79  # 80 and 81 characters as JSON
    assert describe_differences({"a": shown_whole}, {"a": cut}, ["a"]) == f'a: "{shown_whole}" vs "{"x" * 76}...'


def test_a_model_both_runs_fine_tuned_is_the_same_by_its_weights_or_its_path():
    weights = [{"name": "model.safetensors", "sha256": "1"}]
    moved = {"model_name_or_path": "/old", "model_weights": weights}
    assert identity_differences(moved, {"model_name_or_path": "/new", "model_weights": weights}) == []
    other = {"model_name_or_path": "/new", "model_weights": [{"name": "model.safetensors", "sha256": "2"}]}
    assert identity_differences(moved, other) == ["model_name_or_path", "model_weights"]
    unnamed, other_unnamed = ({"model_weights": w} for w in (weights, other["model_weights"]))
    assert identity_differences(unnamed, other_unnamed) == ["model_weights"], "no path on either side is no match"


def model_directory(directory, d_model: int = 32, vocab: str = '{"a": 0}', identity: dict | None = None) -> None:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"d_model": d_model, "transformers_version": "5.0.0"}))
    (directory / "vocab.json").write_text(vocab)
    if identity is not None:
        (directory / RUN_IDENTITY_FILE).write_text(json.dumps(identity))


def test_model_differences_name_config_fields_tokenizer_and_run_identity(tmp_path):
    model_directory(tmp_path / "a", identity={"seed": 1, "config": {"d_model": 32}})
    model_directory(tmp_path / "same", identity={"seed": 1, "config": {"d_model": 32}})
    model_directory(tmp_path / "b", d_model=64, vocab='{"b": 0}', identity={"seed": 2, "config": {"d_model": 64}})
    model_directory(tmp_path / "unrecorded", d_model=64)
    model_directory(tmp_path / "newer", identity={"seed": 1, "config": {"d_model": 32}})
    config = json.loads((tmp_path / "newer" / "config.json").read_text())
    (tmp_path / "newer" / "config.json").write_text(json.dumps({**config, "added_by_a_newer_library": 1}))
    assert model_differences(tmp_path / "a", tmp_path / "newer") == [], "a field only one config has"
    assert model_differences(tmp_path / "a", tmp_path / "same") == []
    assert model_differences(tmp_path / "a", tmp_path / "b") == ["config.d_model", "tokenizer", "run_identity.seed"]
    assert model_differences(tmp_path / "a", tmp_path / "unrecorded") == ["config.d_model"]
    (tmp_path / "same" / "config.json").write_text("{")  # unreadable: no field to compare
    assert model_differences(tmp_path / "a", tmp_path / "same") == []


def test_every_name_the_module_exports_exists():
    """`from modeling.checkpoints import *` fails on a name `__all__` lists that the module does not hold."""
    assert [name for name in checkpoints.__all__ if not hasattr(checkpoints, name)] == []


def test_paths_given_as_strings_are_read_as_paths(tmp_path):
    """A path from the command line or a record is a `str`: each function takes it as it takes a Path."""
    checkpoint = tmp_path / "checkpoint-10"
    save_trainer_checkpoint(checkpoint, seed=0)
    assert weight_files(str(checkpoint)) == [checkpoint / "model.safetensors"]
    assert safetensors_problem(str(checkpoint / "model.safetensors")) is None
    assert safetensors_problem(str(tmp_path / "nowhere.safetensors")) == "nowhere.safetensors is missing"
    assert checkpoint_problems(str(checkpoint)) == [] and saved_update(str(checkpoint)) == 0
    assert write_completeness_marker(str(checkpoint)) == checkpoint / COMPLETE_MARKER
    assert checkpoint_problems(str(checkpoint)) == []
    assert latest_complete_checkpoint(str(tmp_path)) == checkpoint
    assert require_complete_checkpoint(str(checkpoint)) == checkpoint
    assert model_differences(str(checkpoint), str(tmp_path / "checkpoint-10")) == []


def test_records_read_back_as_utf8_whatever_the_locale_encoding(tmp_path, ascii_locale):
    """The records are written in UTF-8; a requeued job whose locale encoding is ASCII reads them the same (it
    failed in UnicodeDecodeError on a non-ASCII token, note or data path)."""
    state = {"global_step": 7, "log_history": [{"note": "grün"}]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state, ensure_ascii=False), encoding="utf-8")
    assert saved_update(tmp_path) == 7
    (tmp_path / RUN_IDENTITY_FILE).write_text('{"data": "Übersetzung"}', encoding="utf-8")
    assert read_run_identity(tmp_path) == {"data": "Übersetzung"}
    tokenizer = {"model": {"vocab": {"grün": 0, "a": 1}}, "added_tokens": [{"content": "<ß>", "id": 2}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    assert saved_vocabulary_fingerprint(tmp_path) == vocabulary_fingerprint({"grün": 0, "a": 1, "<ß>": 2})
    # a sharded model's index with a non-ASCII tensor name, a marker with a non-ASCII note: read, not "cannot be read"
    index = {"weight_map": {"encoder.grün": "model-00001-of-00001.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index, ensure_ascii=False), encoding="utf-8")
    assert weight_files(tmp_path) == [tmp_path / "model-00001-of-00001.safetensors"]
    checkpoint = tmp_path / "checkpoint-10"
    save_trainer_checkpoint(checkpoint, seed=0)
    write_completeness_marker(checkpoint, note="grün")
    assert checkpoint_problems(checkpoint) == []
    assert marker_record(checkpoint)["note"] == "grün", "what the trainer resumes by, not an empty record"
    # two models whose configs hold a non-ASCII field: their configs compared, not both read as empty
    for name, d_model in (("a", 32), ("b", 64)):
        config = {"d_model": d_model, "note": "Übersetzung"}
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    assert model_differences(tmp_path / "a", tmp_path / "b") == ["config.d_model"]


@pytest.mark.parametrize("name", ["vocab.json", "source.spm", "target.spm", "merges.txt", "spm.model"])
def test_a_vocabulary_file_without_tokenizer_json_fingerprints_the_vocabulary(tmp_path, name):
    """A tokenizer saved in its own format alone (a SentencePiece model, a BPE's vocabulary or merges): its bytes
    decide, so that another vocabulary makes another fingerprint, not none."""
    (tmp_path / name).write_bytes(b"first")
    first = saved_vocabulary_fingerprint(tmp_path)
    (tmp_path / name).write_bytes(b"second")
    assert first is not None and saved_vocabulary_fingerprint(tmp_path) not in (None, first)


@pytest.mark.parametrize(
    "field", ["model_revision", "model_weights", "fairseq_conversion", "dataset_commit", "model_commit"]
)
def test_a_field_recorded_since_2026_12_05_is_no_difference_where_one_identity_predates_it(field):
    """A run recorded before the field existed, requeued by a release that records it, is still the same run."""
    recorded = {"model_name_or_path": "/m", "seed": 1}
    assert identity_differences(recorded, {**recorded, field: "abc"}) == []
    assert identity_differences({**recorded, field: "abc"}, recorded) == []


def test_a_hub_model_and_a_local_directory_of_the_same_name_are_different_models():
    """The Hub id `org/model` records no weights; a directory `org/model` in the working directory records its
    own: loaded under the same name, they are not the same model."""
    hub = {"model_name_or_path": "org/model", "model_weights": None}
    local = {"model_name_or_path": "org/model", "model_weights": [{"name": "model.safetensors", "sha256": "1"}]}
    assert identity_differences(hub, local) == ["model_weights"]
    assert identity_differences(local, hub) == ["model_weights"]


def test_a_config_saved_by_another_library_version_or_loaded_another_way_has_the_same_identity():
    """What transformers sets on saving or loading a config, not what the model is."""
    volatile = {
        "transformers_version": "5.0.0",
        "_name_or_path": "/somewhere",
        "_commit_hash": "abc",
        "architectures": ["TransformerForConditionalGeneration"],
        "auto_map": {"AutoModel": "modeling_transformer.TransformerModel"},
        "dtype": "float32",
        "torch_dtype": "float32",
        "output_attentions": True,
        "output_hidden_states": True,
        "return_dict": False,
        "use_cache": False,
        "_attn_implementation": "eager",
    }
    assert config_identity({"d_model": 32, **volatile}) == {"d_model": 32}


def test_a_config_value_json_has_no_type_for_compares_as_its_text(tmp_path):
    """Run identities are written with such values as text: a fresh config holding one (a Path a user set) must
    compare equal to the recorded one, not fail to serialise."""
    assert config_identity({"d_model": 32, "data_dir": tmp_path}) == {"d_model": 32, "data_dir": str(tmp_path)}
    # a mapping of int and str keys (id2label and a label a user added by name) is no TypeError of sorting either
    labels = {"id2label": {0: "a", "extra": "b"}}
    assert config_identity({"d_model": 32, **labels}) == {"d_model": 32, "id2label": {"0": "a", "extra": "b"}}


def test_a_field_a_newer_library_adds_inside_a_nested_config_mapping_is_no_difference_either():
    recorded = {"config": {"d_model": 32, "rope": {"theta": 1}}}
    assert identity_differences(recorded, {"config": {"d_model": 32, "rope": {"theta": 1, "added": 2}}}) == []
    assert identity_differences(recorded, {"config": {"d_model": 32, "rope": {"theta": 2}}}) == ["config.rope.theta"]
    nested = {"data": {"config": {"a": 1}}}, {"data": {"config": {"a": 1, "b": 2}}}
    assert identity_differences(*nested) == ["data.config.b"], "only the model's config, at the top, is lenient"


@pytest.mark.parametrize("index", [{"metadata": {}}, {"weight_map": []}, [], {"weight_map": {"a": 1}}])
def test_an_edited_index_is_a_problem_named_not_a_traceback(tmp_path, index):
    """An index that parses but maps no tensors to file names (edited by hand, another tool's): listing, resuming and
    deploying ended in AttributeError or TypeError tracebacks (`.values()` of a list, a path joined with a number)."""
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"index\.json has no weight_map of tensor names to shard files$"):
        weight_files(tmp_path)
    [problem] = weights_problems(tmp_path)
    assert problem.startswith("model.safetensors.index.json cannot be read (ValueError: ")
    assert checkpoint_problems(tmp_path, training_state=False)[2] == problem
