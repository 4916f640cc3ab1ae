"""scripts/export.py on a tiny checkpoint, in this process: each format's directory, and one-line errors."""

import json

import ctranslate2
import pytest
from helpers import run_script, script_error, tiny_model
from transformers import MarianMTModel

from modeling import export
from modeling.translation import translate


def test_export_to_ctranslate2_translates_as_the_model(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    model_dir, model, tokenizer = tiny_checkpoint
    output_dir = tmp_path / "ct2"
    run_script(
        "export.py", "--model", model_dir, "--to", "ctranslate2", "--output-dir", output_dir, monkeypatch=monkeypatch
    )
    assert capsys.readouterr().out == f"wrote {output_dir}\n"

    # With the decoding both can express: transformers' length penalty and a fixed limit.
    sentences = ["the small dog sees a red ball.", "a cat."]
    expected = translate(
        model, tokenizer, sentences, max_new_tokens=10, length_penalty_type="transformers", max_length_offset=None
    )
    options = json.loads((output_dir / "translate_options.json").read_text()) | {"max_decoding_length": 10}
    translator = ctranslate2.Translator(str(output_dir), device="cpu", intra_threads=1)
    sources = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(sentences)["input_ids"]]
    results = translator.translate_batch(sources, **options)
    outputs = [tokenizer.decode(tokenizer.convert_tokens_to_ids(r.hypotheses[0])).strip() for r in results]
    assert outputs == expected


def test_export_to_ctranslate2_int8(tiny_checkpoint, tmp_path, monkeypatch):
    model_dir, _, _ = tiny_checkpoint
    args = ["--model", model_dir, "--to", "ctranslate2", "--quantization", "int8", "--output-dir", tmp_path / "q"]
    run_script("export.py", *args, monkeypatch=monkeypatch)
    assert json.loads((tmp_path / "q" / "export.json").read_text())["quantization"] == "int8"


def test_export_to_marian_loads_without_this_project(tiny_checkpoint, tmp_path, monkeypatch):
    model_dir, _, _ = tiny_checkpoint
    run_script(
        "export.py", "--model", model_dir, "--to", "marian", "--output-dir", tmp_path / "m", monkeypatch=monkeypatch
    )
    assert isinstance(MarianMTModel.from_pretrained(tmp_path / "m"), MarianMTModel)
    assert (tmp_path / "m" / "tokenizer.json").is_file()


def test_export_to_onnx_calls_the_library(tiny_checkpoint, tmp_path, monkeypatch):
    """The ONNX export itself is tested in tests/test_export.py (it takes 15 s): here, only the wiring."""
    model_dir, _, _ = tiny_checkpoint
    calls = []
    monkeypatch.setattr(export, "to_onnx", lambda model, output_dir, **kwargs: calls.append((output_dir, kwargs)))
    run_script(
        "export.py", "--model", model_dir, "--to", "onnx", "--output-dir", tmp_path / "o", monkeypatch=monkeypatch
    )
    assert calls and calls[0][0] == str(tmp_path / "o") and calls[0][1]["tokenizer"] is not None


def test_errors_are_one_line(tiny_checkpoint, tmp_path, monkeypatch):
    model_dir, _, tokenizer = tiny_checkpoint
    missing = script_error(
        "export.py",
        "--model",
        tmp_path / "nope",
        "--to",
        "marian",
        "--output-dir",
        tmp_path / "x",
        monkeypatch=monkeypatch,
    )
    assert missing.startswith("error: ") and "does not exist" in missing and "\n" not in missing

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    taken = script_error(
        "export.py", "--model", model_dir, "--to", "marian", "--output-dir", tmp_path / "mine", monkeypatch=monkeypatch
    )
    assert taken.startswith("error: ") and "is not an export" in taken and "\n" not in taken

    unrepresentable = tmp_path / "eps"
    tiny_model(len(tokenizer), layer_norm_eps=1e-6).save_pretrained(unrepresentable)
    tokenizer.save_pretrained(unrepresentable)
    refused = script_error(
        "export.py",
        "--model",
        unrepresentable,
        "--to",
        "marian",
        "--output-dir",
        tmp_path / "m",
        monkeypatch=monkeypatch,
    )
    assert refused == (
        "error: cannot export to MarianMT exactly: layer_norm_eps=1e-06 (its LayerNorm epsilon is 1e-5)."
    )
    assert not (tmp_path / "m").exists()


def test_quantization_is_refused_for_other_formats(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_script(
            "export.py",
            "--model",
            tmp_path,
            "--to",
            "marian",
            "--quantization",
            "int8",
            "--output-dir",
            tmp_path / "m",
            monkeypatch=monkeypatch,
        )
    assert exit_info.value.code == 2
    assert "--quantization applies to --to ctranslate2, not --to marian" in capsys.readouterr().err
