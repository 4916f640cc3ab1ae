"""scripts/convert_fairseq.py on the fairseq-made fixtures, in this process: the directory it writes, evaluated with
scripts/evaluate.py, and its one-line errors."""

import argparse
import json
import shutil
import sys

import pytest
import torch
from helpers import FAIRSEQ_FIXTURES, FAIRSEQ_MODELS, fairseq_outputs, run_script, script_error

from modeling.scoring import corpus_scores

pytestmark = pytest.mark.usefixtures("datasets_cache")

NAME = FAIRSEQ_MODELS[1]
ARGUMENTS = ["--data-bin", FAIRSEQ_FIXTURES, "--source-lang", "en", "--target-lang", "de"]


def convert(output_dir, monkeypatch, *extra):
    run_script(
        "convert_fairseq.py",
        "--checkpoint",
        FAIRSEQ_FIXTURES / NAME / "model.pt",
        *ARGUMENTS,
        *extra,
        "--output-dir",
        output_dir,
        monkeypatch=monkeypatch,
    )


def test_converted_directory_evaluates_to_fairseqs_translations(tmp_path, monkeypatch, capsys):
    convert(tmp_path / "model", monkeypatch, "--bpe-codes", FAIRSEQ_FIXTURES / "bpecodes")
    assert capsys.readouterr().out.endswith(f"wrote {tmp_path / 'model'}\n")

    data = tmp_path / "data"  # the 50 held-out sentences as a local test split
    data.mkdir()
    shutil.copy(FAIRSEQ_FIXTURES / "heldout.en", data / "test.en")
    shutil.copy(FAIRSEQ_FIXTURES / "heldout.de", data / "test.de")
    run_script(
        "evaluate.py",
        *("--model", tmp_path / "model", "--data-dir", data, "--source-lang", "en", "--target-lang", "de"),
        *("--output-dir", tmp_path / "eval"),
        monkeypatch=monkeypatch,
    )
    hypotheses = (tmp_path / "eval" / "hypotheses_test.de").read_text(encoding="utf-8").splitlines()
    setting = fairseq_outputs(NAME)["settings"]["interactive/beam4_lenpen0.6_bs1"]
    assert hypotheses == [sentence["nbest"][0]["detok"] for sentence in setting["sentences"]]
    metrics = json.loads((tmp_path / "eval" / "eval_results_test.json").read_text())
    references = (FAIRSEQ_FIXTURES / "heldout.de").read_text(encoding="utf-8").splitlines()
    assert metrics["sacrebleu"] == pytest.approx(corpus_scores(hypotheses, references, "de")["sacrebleu"])
    assert (metrics["num_beams"], metrics["length_penalty"], metrics["max_length_offset"]) == (4, 0.6, None)
    assert (metrics["max_length_b"], metrics["beam_finalization"], metrics["forced_eos_keeps_log_prob"]) == (
        200,
        "first",
        True,
    )


def test_pretokenized_the_tokenizer_takes_tokenised_text(tmp_path, monkeypatch):
    convert(tmp_path / "model", monkeypatch, "--pretokenized")
    assert json.loads((tmp_path / "model" / "tokenizer_config.json").read_text())["pretokenized"] is True
    assert json.loads((tmp_path / "model" / "fairseq_conversion.json").read_text())["bpe_codes"] is None


def test_without_bpe_codes_the_data_bins_are_used_and_none_at_all_is_refused(tmp_path, monkeypatch):
    # A published archive keeps bpecodes beside its dictionaries: without them raw text met <unk> for every word
    # not split already (41% of the held-out source tokens), silently.
    convert(tmp_path / "model", monkeypatch)
    assert json.loads((tmp_path / "model" / "tokenizer_config.json").read_text())["pretokenized"] is False
    assert json.loads((tmp_path / "model" / "fairseq_conversion.json").read_text())["bpe_codes"] == "bpecodes"
    data_bin = tmp_path / "no_codes"
    data_bin.mkdir()
    for name in ("dict.en.txt", "dict.de.txt"):
        shutil.copy(FAIRSEQ_FIXTURES / name, data_bin / name)
    arguments = ["--checkpoint", FAIRSEQ_FIXTURES / NAME / "model.pt", "--data-bin", data_bin]
    arguments += ["--source-lang", "en", "--target-lang", "de", "--output-dir", tmp_path / "out"]
    message = script_error("convert_fairseq.py", *arguments, monkeypatch=monkeypatch)
    assert message == (
        f"error: {data_bin} holds no bpecodes: give the model's subword-nmt codes (--bpe-codes), or --pretokenized "
        "(pretokenized=True) for inputs already Moses-tokenised and BPE-split."
    )
    both = ["--bpe-codes", FAIRSEQ_FIXTURES / "bpecodes", "--pretokenized"]
    assert "not both" in script_error("convert_fairseq.py", *arguments, *both, monkeypatch=monkeypatch)
    assert not (tmp_path / "out").exists()


def test_errors_are_one_line_and_nothing_is_written(tmp_path, monkeypatch):
    def error(checkpoint, *extra):
        arguments = ["--checkpoint", checkpoint, *ARGUMENTS, *extra, "--output-dir", tmp_path / "out"]
        return script_error("convert_fairseq.py", *arguments, monkeypatch=monkeypatch)

    assert error(tmp_path / "missing.pt") == f"error: fairseq checkpoint {tmp_path / 'missing.pt'} does not exist."
    with torch.serialization.safe_globals([argparse.Namespace]):
        checkpoint = torch.load(FAIRSEQ_FIXTURES / NAME / "model.pt", weights_only=True)
    checkpoint["cfg"]["model"].encoder_normalize_before = True
    torch.save(checkpoint, tmp_path / "pre_ln.pt")
    message = error(tmp_path / "pre_ln.pt")
    assert message.startswith("error: cannot convert this fairseq model exactly: encoder_normalize_before=True")
    assert "\n" not in message
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    assert "is not a fairseq checkpoint" in error(tmp_path / "other.pt")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("keep me")
    assert "is not a converted fairseq model" in error(FAIRSEQ_FIXTURES / NAME / "model.pt")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["other.pt", "out", "pre_ln.pt"]
    assert [path.name for path in (tmp_path / "out").iterdir()] == ["notes.txt"]


def test_a_truncated_checkpoint_is_a_one_line_error(tmp_path, monkeypatch):
    truncated = tmp_path / "trunc.pt"
    truncated.write_bytes((FAIRSEQ_FIXTURES / NAME / "model.pt").read_bytes()[:100_000])
    arguments = ["--checkpoint", truncated, *ARGUMENTS, "--output-dir", tmp_path / "out"]
    message = script_error("convert_fairseq.py", *arguments, monkeypatch=monkeypatch)
    assert message == (
        f"error: {truncated} is not a readable PyTorch checkpoint (truncated or not a checkpoint): "
        "PytorchStreamReader failed reading zip archive: failed finding central directory"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["trunc.pt"]


@pytest.mark.parametrize("script", ["translate.py", "evaluate.py", "export.py"])
def test_without_sacremoses_a_converted_model_says_so(script, converted_fairseq_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sacremoses", None)  # as where it is not installed
    arguments = {
        "translate.py": ["A dog."],
        "evaluate.py": ["--data-dir", tmp_path, "--source-lang", "en", "--target-lang", "de"],
        "export.py": ["--to", "ctranslate2", "--output-dir", tmp_path / "ct2"],
    }[script]
    message = script_error(script, "--model", converted_fairseq_dir, *arguments, monkeypatch=monkeypatch)
    needs = "needs the package 'sacremoses': pip install sacremoses"
    assert message == f"error: The tokenizer of {str(converted_fairseq_dir)!r} {needs}"
