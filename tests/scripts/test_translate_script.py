"""scripts/translate.py end to end on a tiny checkpoint, in this process."""

import errno
import gzip
import os

import pytest
from helpers import run_script, script_error

from modeling.quantization import quantize_int8
from modeling.translation import translate

# The scripts load local datasets: their Arrow files go to a temporary cache, not the user's.
pytestmark = pytest.mark.usefixtures("datasets_cache")


def test_translate_from_stdin_keeps_order_and_empty_lines(tiny_checkpoint, monkeypatch, capsys):
    model_dir, model, tokenizer = tiny_checkpoint
    lines = ["the small dog sees a red ball.", "", "a cat.", "  ", "big house today."]
    stdin = "\r\n".join(lines).encode() + b"\n"
    run_script("translate.py", "--model", model_dir, monkeypatch=monkeypatch, stdin=stdin)

    output = capsys.readouterr().out
    assert output.count("\n") == len(lines)
    translations = output.split("\n")[:-1]
    assert translations[1] == translations[3] == ""
    assert translations == translate(model, tokenizer, lines)


def test_translate_from_arguments_and_gzipped_file(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    model_dir, model, tokenizer = tiny_checkpoint
    sentences = ["a cat likes the ball.", "", "the dog."]
    run_script("translate.py", "--model", model_dir, *sentences, monkeypatch=monkeypatch)
    from_arguments = capsys.readouterr().out.split("\n")[:-1]
    assert from_arguments == translate(model, tokenizer, sentences)

    with gzip.open(tmp_path / "input.en.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(s + "\n" for s in sentences))
    output_file = tmp_path / "output.de"
    args = ["--model", model_dir, "--input-file", tmp_path / "input.en.gz", "--output-file", output_file]
    run_script("translate.py", *args, monkeypatch=monkeypatch)
    assert output_file.read_text().split("\n")[:-1] == from_arguments


def test_translate_with_int8_gives_what_the_quantised_model_gives(tiny_checkpoint, monkeypatch, capsys):
    model_dir, model, tokenizer = tiny_checkpoint
    sentences = ["a cat likes the ball.", "", "the dog."]
    run_script("translate.py", "--model", model_dir, "--int8", *sentences, monkeypatch=monkeypatch)
    assert capsys.readouterr().out.split("\n")[:-1] == translate(quantize_int8(model), tokenizer, sentences)


def test_a_full_disk_leaves_the_old_output_file_and_says_so_in_one_line(tiny_checkpoint, tmp_path, monkeypatch):
    output_file = tmp_path / "output.de"
    output_file.write_text("the earlier translations\n")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    args = ["--model", tiny_checkpoint[0], "--output-file", output_file, "a cat."]
    message = script_error("translate.py", *args, monkeypatch=monkeypatch)
    assert message.startswith(f"error: No space left on device while writing {output_file}") and "\n" not in message
    assert output_file.read_text() == "the earlier translations\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["output.de"], "no temporary file left"


def test_the_input_and_the_destination_are_named_before_any_model_is_loaded(tmp_path, monkeypatch):
    model = ["--model", tmp_path / "no_model_here"]  # reaching the model would fail with another message
    blocker = tmp_path / "results"
    blocker.write_text("")
    destination = ["--output-file", blocker / "news.de"]
    message = script_error("translate.py", *model, *destination, "a cat.", monkeypatch=monkeypatch)
    assert message == f"error: cannot write {blocker / 'news.de'}: {blocker} is a file, not a directory"

    message = script_error("translate.py", *model, "--input-file", tmp_path / "news.en", monkeypatch=monkeypatch)
    assert "No such file or directory" in message and str(tmp_path / "news.en") in message

    stdin = b"a cat.\n" + "grün\n".encode("latin-1")
    with pytest.raises(SystemExit) as exit_info:
        run_script("translate.py", *model, monkeypatch=monkeypatch, stdin=stdin)
    assert str(exit_info.value.code).startswith("error: <stdin>:2: not valid UTF-8")
