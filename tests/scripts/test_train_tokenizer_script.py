"""scripts/train_tokenizer.py end to end."""

import gzip
import runpy
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, push_translation_dataset, run_script, script_error, subprocess_env
from transformers import AutoTokenizer

from modeling import tokenization


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "train_tokenizer.py"), *args],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )


def test_cli_train_files_and_data_dir(corpus, tmp_path, monkeypatch, capsys):
    with gzip.open(tmp_path / "train.en.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(corpus[0::2]) + "\n")
    (tmp_path / "train.de").write_text("\n".join(corpus[1::2]) + "\n", encoding="utf-8")

    files = [str(tmp_path / "train.en.gz"), str(tmp_path / "train.de")]
    result = run_cli("--train-files", *files, "--vocab-size", "90", "--output-dir", str(tmp_path / "bpe"))
    assert result.returncode == 0, result.stderr
    assert "vocab size: 96" in result.stdout and "training time:" in result.stdout
    from_files = AutoTokenizer.from_pretrained(tmp_path / "bpe")

    # The dataset options, in-process (a second interpreter start would double this test's time).
    argv = ["train_tokenizer.py", "--data-dir", str(tmp_path), "--source-lang", "en", "--target-lang", "de"]
    argv += ["--vocab-size", "90", "--output-dir", str(tmp_path / "bpe2"), "--cache-dir", str(tmp_path / "cache")]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(REPO_ROOT / "scripts" / "train_tokenizer.py"), run_name="__main__")
    assert "vocab size: 96" in capsys.readouterr().out
    from_dir = AutoTokenizer.from_pretrained(tmp_path / "bpe2")
    assert from_dir(corpus[:20])["input_ids"] == from_files(corpus[:20])["input_ids"]  # same text, same BPE


def test_cli_reads_a_hub_dataset_at_the_revision_asked_for(hub_here, datasets_cache, tmp_path, monkeypatch, capsys):
    words = ["ein", "hund", "der", "läuft"]
    first = push_translation_dataset(hub_here[0], "tester/bpe_corpus", {"train": [("a dog runs .", " ".join(words))]})
    push_translation_dataset(
        hub_here[0], "tester/bpe_corpus", {"train": [("the cat sleeps .", "die katze schläft .")]}
    )
    argv = ["--dataset", "tester/bpe_corpus", "--language-pair", "de-en", "--source-lang", "en", "--target-lang", "de"]
    argv += ["--vocab-size", "64"]
    argv += ["--min-frequency", "1", "--output-dir", str(tmp_path / "bpe"), "--dataset-revision", first]
    run_script("train_tokenizer.py", *argv, monkeypatch=monkeypatch)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "bpe")
    assert tokenizer.tokenize(" ".join(words)) == [f"▁{word}" for word in words]  # the first commit's words
    assert "▁katze" not in tokenizer.get_vocab()  # not main's
    local = ["--data-dir", str(tmp_path), "--language-pair", "en-de", "--vocab-size", "8", "--output-dir", "x"]
    assert script_error("train_tokenizer.py", *local, "--dataset-revision", first, monkeypatch=monkeypatch) == "2"
    assert "error: --dataset-revision names a version of a Hub dataset (--dataset)" in capsys.readouterr().err


def test_cli_reports_a_missing_file_and_a_too_small_vocabulary_in_one_line(corpus, tmp_path, monkeypatch):
    (tmp_path / "train.en").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    cases = [
        (["--train-files", str(tmp_path / "missing.gz"), "--vocab-size", "90"], "No such file or directory"),
        (["--train-files", str(tmp_path / "train.en"), "--vocab-size", "2"], "vocab_size must exceed the 3 special"),
        (["--train-files", str(tmp_path / "train.en"), "--vocab-size", "90", "--min-frequency", "-1"], "at least 0"),
    ]
    for args, message in cases:
        monkeypatch.setattr(sys, "argv", ["train_tokenizer.py", *args, "--output-dir", str(tmp_path / "bpe")])
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path(str(REPO_ROOT / "scripts" / "train_tokenizer.py"), run_name="__main__")
        assert str(exit_info.value.code).startswith("error: ") and message in str(exit_info.value.code)


def test_cli_reports_a_data_directory_without_a_training_split_in_one_line(tmp_path, monkeypatch):
    for language in ("en", "de"):
        (tmp_path / f"training.{language}").write_text("a cat\n", encoding="utf-8")
    args = ["--data-dir", tmp_path, "--source-lang", "en", "--target-lang", "de", "--vocab-size", "64"]
    message = script_error("train_tokenizer.py", *args, "--output-dir", tmp_path / "bpe", monkeypatch=monkeypatch)
    assert message == (
        "error: the BPE is trained on the training split: no split 'train' (or alias ['train']) among ['training']"
    )
    assert not any((tmp_path / "bpe").iterdir())


@pytest.mark.parametrize("name", ["train.jsonl", "train.en-de.tsv.gz"])
def test_cli_refuses_jsonl_or_tsv_as_train_files_pointing_to_data_dir(name, tmp_path, monkeypatch, capsys):
    """Read as lines of text, a JSONL file trained a BPE of its syntax and escapes, in which "ü" was <unk>."""
    (tmp_path / name).write_text('{"translation": {"en": "over", "de": "\\u00fcber"}}\n', encoding="utf-8")
    args = ["--train-files", tmp_path / name, "--vocab-size", "64", "--output-dir", tmp_path / "bpe"]
    assert script_error("train_tokenizer.py", *args, monkeypatch=monkeypatch) == "2"
    kind = "JSONL" if name.endswith(".jsonl") else "TSV"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"train_tokenizer.py: error: {tmp_path / name} is {kind}: --train-files reads plain text, one sentence per "
        "line; give its folder as --data-dir, with --source-lang and --target-lang"
    )
    assert not (tmp_path / "bpe").exists()


def test_cli_refuses_files_without_text_and_saves_nothing(tmp_path, monkeypatch):
    (tmp_path / "train.en").write_text("")
    (tmp_path / "train.de").write_text("\n  \n")
    files = [str(tmp_path / "train.en"), str(tmp_path / "train.de")]
    argv = ["train_tokenizer.py", "--train-files", *files, "--vocab-size", "90"]
    monkeypatch.setattr(sys, "argv", [*argv, "--output-dir", str(tmp_path / "bpe")])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO_ROOT / "scripts" / "train_tokenizer.py"), run_name="__main__")
    assert exit_info.value.code == (
        f"error: no text to train the BPE on: {files[0]}, {files[1]} hold(s) no line with a non-blank character"
    )
    assert not any((tmp_path / "bpe").iterdir())  # made empty by the check that it can be written


def test_cli_warns_when_the_characters_alone_exceed_the_vocabulary_size(corpus, tmp_path):
    (tmp_path / "train.en").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    result = run_cli("--train-files", str(tmp_path / "train.en"), "--vocab-size", "4", "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    size = int(result.stdout.split("vocab size: ")[1].split()[0])
    assert size > 8 and f"{size} entries, more than vocab_size=4" in result.stderr


def test_an_unwritable_output_directory_is_named_before_the_bpe_trains(corpus, tmp_path, monkeypatch):
    def not_reached(*args, **kwargs):
        raise AssertionError("trained although the tokenizer could not be saved")

    monkeypatch.setattr(tokenization, "train_shared_bpe", not_reached)
    (tmp_path / "train.en").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    (tmp_path / "bpe").write_text("")  # a file where the directory should be
    argv = ["train_tokenizer.py", "--train-files", str(tmp_path / "train.en"), "--vocab-size", "90"]
    monkeypatch.setattr(sys, "argv", [*argv, "--output-dir", str(tmp_path / "bpe")])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO_ROOT / "scripts" / "train_tokenizer.py"), run_name="__main__")
    written = tmp_path / "bpe" / "tokenizer.json"
    assert exit_info.value.code == f"error: cannot write {written}: {tmp_path / 'bpe'} is a file, not a directory"


TRAINED_WITH = "a new tokenizer there would replace the one it was trained with"
TRAINS_WITH = "a new tokenizer there would replace the one it trains with"


@pytest.mark.parametrize(
    ("record", "holds"),
    [
        ("config.json", f"a model (config.json): {TRAINED_WITH}"),
        ("run_identity.json", f"a training run (run_identity.json): {TRAINS_WITH}"),
        ("checkpoint-200", f"a training run (checkpoint-200): {TRAINS_WITH}"),
    ],
)
def test_a_model_or_training_runs_directory_keeps_its_tokenizer(record, holds, corpus, tmp_path, monkeypatch):
    """Before, `--output-dir MODEL` replaced the tokenizer the model was trained with: it then translated nonsense.
    A run still training has no config.json at its top yet: its BPE was replaced, and its requeue refused its own
    directory as "written by a different run" (tokenizer), offering only --overwrite_output_dir."""
    (tmp_path / "train.en").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    directory = tmp_path / "model"
    directory.mkdir()
    if record.startswith("checkpoint-"):
        (directory / record).mkdir()
    else:
        (directory / record).write_text("{}")
    (directory / "tokenizer.json").write_text("its own")
    argv = ["train_tokenizer.py", "--train-files", str(tmp_path / "train.en"), "--vocab-size", "90"]
    monkeypatch.setattr(sys, "argv", [*argv, "--output-dir", str(directory)])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO_ROOT / "scripts" / "train_tokenizer.py"), run_name="__main__")
    assert exit_info.value.code == f"error: {directory} holds {holds}; write the tokenizer into another directory"
    assert (directory / "tokenizer.json").read_text() == "its own"
