"""End-to-end runs of scripts/evaluate.py, scripts/translate.py and scripts/plot_attention.py on a tiny checkpoint.

The scripts run in this process through `runpy` (a fresh interpreter would spend most of the test importing
torch); none of them touches the network here.
"""

import gzip
import io
import json
import runpy
import sys
from pathlib import Path

import datasets
import pytest
from tiny_checkpoint import one_torch_thread, save_tiny_checkpoint, synthetic_pairs
from transformers import AutoModelForSeq2SeqLM, MarianConfig

from modeling.evaluation import attention_maps, corpus_scores, load_model_and_tokenizer, translate

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, model, tokenizer) of a saved tiny checkpoint."""
    directory = tmp_path_factory.mktemp("model")
    model, tokenizer = save_tiny_checkpoint(directory)
    return directory, model, tokenizer


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Line-aligned test.en / test.de files, as in Multi30k."""
    directory = tmp_path_factory.mktemp("data")
    pairs = synthetic_pairs(6, seed=7)
    (directory / "test.en").write_text("".join(en + "\n" for en, _ in pairs))
    (directory / "test.de").write_text("".join(de + "\n" for _, de in pairs))
    return directory


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """Keep the Arrow files of local datasets out of the user's cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets_cache"))


def run_script(name: str, *args: str, monkeypatch, stdin: bytes | None = None) -> None:
    monkeypatch.setattr(sys, "argv", [str(SCRIPTS / name), *map(str, args)])
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    runpy.run_path(str(SCRIPTS / name), run_name="__main__")


def script_error(name: str, *args: str, monkeypatch) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run_script(name, *args, monkeypatch=monkeypatch)
    return str(exit_info.value.code)


# --- evaluate.py ----------------------------------------------------------------------------------------------


def test_evaluate_writes_scores_signature_and_hypotheses(checkpoint, data_dir, tmp_path, monkeypatch, capsys):
    model_dir, _, _ = checkpoint
    common = ["--model", model_dir, "--data-dir", data_dir, "--source-lang", "en", "--target-lang", "de"]
    run_script("evaluate.py", *common, "--num-beams", "2", "--output-dir", tmp_path, monkeypatch=monkeypatch)

    printed = capsys.readouterr().out
    metrics = json.loads((tmp_path / "eval_results_test.json").read_text())
    assert metrics["sacrebleu_signature"] in printed and "sacreBLEU" in printed
    assert metrics["split"] == "test" and metrics["dataset"] == data_dir.name
    assert metrics["num_beams"] == 2 and metrics["num_sentences"] == 6

    hypotheses = (tmp_path / "hypotheses_test.de").read_text().split("\n")[:-1]
    references = (data_dir / "test.de").read_text().split("\n")[:-1]
    assert len(hypotheses) == 6
    rescored = corpus_scores(hypotheses, references, "de")
    for key in ("sacrebleu", "paper_bleu", "tokenized_bleu_lc", "chrf"):
        assert metrics[key] == pytest.approx(rescored[key])


def test_evaluate_lists_the_available_splits_for_an_unknown_one(checkpoint, data_dir, monkeypatch):
    model_dir, _, _ = checkpoint
    message = script_error(
        "evaluate.py",
        *("--model", model_dir, "--data-dir", data_dir, "--source-lang", "en", "--target-lang", "de"),
        *("--split", "validation"),
        monkeypatch=monkeypatch,
    )
    assert message.startswith("error: no split 'validation'") and "['test']" in message


def test_evaluate_refuses_a_missing_directory_and_another_model_type(data_dir, tmp_path, monkeypatch):
    common = ["--data-dir", data_dir, "--source-lang", "en", "--target-lang", "de"]
    message = script_error("evaluate.py", "--model", tmp_path / "missing", *common, monkeypatch=monkeypatch)
    assert message == f"error: Model directory '{tmp_path / 'missing'}' does not exist."

    MarianConfig(vocab_size=16, d_model=8).save_pretrained(tmp_path / "marian")
    message = script_error("evaluate.py", "--model", tmp_path / "marian", *common, monkeypatch=monkeypatch)
    assert "holds a 'marian' checkpoint, not a 'vaswani_transformer' one" in message

    (tmp_path / "no_config").mkdir()
    message = script_error("evaluate.py", "--model", tmp_path / "no_config", *common, monkeypatch=monkeypatch)
    assert message.endswith("has no config.json: it is not a model saved with save_pretrained.")


@pytest.mark.parametrize(
    ("script", "flag"),
    [
        ("evaluate.py", "--limit"),
        ("evaluate.py", "--max-tokens"),
        ("evaluate.py", "--num-beams"),
        ("translate.py", "--max-tokens"),
        ("translate.py", "--num-beams"),
    ],
)
def test_scripts_refuse_counts_below_one_before_loading_anything(script, flag, tmp_path, monkeypatch, capsys):
    languages = ["--source-lang", "en", "--target-lang", "de", "--data-dir", tmp_path]
    extra = languages if script == "evaluate.py" else ["a cat."]
    with pytest.raises(SystemExit) as exit_info:  # the model directory does not exist: not reached
        run_script(script, "--model", tmp_path / "missing", flag, "0", *extra, monkeypatch=monkeypatch)
    assert exit_info.value.code == 2
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err


# --- translate.py ---------------------------------------------------------------------------------------------


def test_translate_from_stdin_keeps_order_and_empty_lines(checkpoint, monkeypatch, capsys):
    model_dir, model, tokenizer = checkpoint
    lines = ["the small dog sees a red ball.", "", "a cat.", "  ", "big house today."]
    stdin = "\r\n".join(lines).encode() + b"\n"
    run_script("translate.py", "--model", model_dir, monkeypatch=monkeypatch, stdin=stdin)

    output = capsys.readouterr().out
    assert output.count("\n") == len(lines)
    translations = output.split("\n")[:-1]
    assert translations[1] == translations[3] == ""
    assert translations == translate(model, tokenizer, lines)


def test_translate_from_arguments_and_gzipped_file(checkpoint, tmp_path, monkeypatch, capsys):
    model_dir, model, tokenizer = checkpoint
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


# --- plot_attention.py ----------------------------------------------------------------------------------------


def test_attention_maps_have_one_distribution_per_query(checkpoint):
    model_dir, _, _ = checkpoint
    model, tokenizer = load_model_and_tokenizer(str(model_dir), attn_implementation="eager")
    maps = attention_maps(model, tokenizer, "the small dog.", "der kleine Hund.")
    source, target = len(maps.source_tokens), len(maps.target_tokens)
    assert maps.encoder.shape == (2, 4, source, source)
    assert maps.decoder.shape == (2, 4, target, target)
    assert maps.cross.shape == (2, 4, target, source)
    for weights in (maps.encoder, maps.decoder, maps.cross):
        assert weights.sum(-1).allclose(weights.new_ones(()))
    assert maps.decoder[..., 0, 1:].abs().max() == 0, "the decoder's first position sees only the start token"
    assert maps.decoder_input_tokens[0] == "</s>" and maps.target_tokens[-1] == "</s>"

    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        attention_maps(AutoModelForSeq2SeqLM.from_pretrained(model_dir), tokenizer, "a", "b")


def test_plot_attention_writes_heatmaps_and_checks_indices(checkpoint, tmp_path, monkeypatch, capsys):
    model_dir, _, _ = checkpoint
    common = ["--model", model_dir, "--source", "the small dog sees a ball."]
    run_script("plot_attention.py", *common, "--output", tmp_path / "all.png", monkeypatch=monkeypatch)
    assert capsys.readouterr().out.startswith("target: ")
    assert (tmp_path / "all.png").read_bytes().startswith(b"\x89PNG")

    one = ["--target", "der kleine Hund.", "--layer", "1", "--head", "3", "--kinds", "cross"]
    run_script("plot_attention.py", *common, *one, "--output", tmp_path / "one.png", monkeypatch=monkeypatch)
    assert (tmp_path / "one.png").read_bytes().startswith(b"\x89PNG")

    message = script_error("plot_attention.py", *common, "--target", "x", "--head", "9", monkeypatch=monkeypatch)
    assert message == "error: head 9 does not exist: this attention has heads 0 to 3."
