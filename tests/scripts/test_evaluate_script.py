"""scripts/evaluate.py end to end on a tiny checkpoint, in this process (`helpers.run_script`)."""

import errno
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import (
    HUB_TOKEN,
    SCRIPTS,
    push_translation_dataset,
    run_script,
    script_error,
    subprocess_env,
    synthetic_pairs,
    training_run_holding,
)
from transformers import MarianConfig

from modeling import evaluation, translation
from modeling.checkpoints import weights_record
from modeling.model_card import _eval_results_metadata, result_caveats
from modeling.scoring import corpus_scores

# The scripts load local datasets: their Arrow files go to a temporary cache, not the user's.
pytestmark = pytest.mark.usefixtures("datasets_cache")


def test_evaluate_writes_scores_signature_and_hypotheses(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch, capsys
):
    model_dir, _, _ = tiny_checkpoint
    common = ["--model", model_dir, "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    run_script("evaluate.py", *common, "--num-beams", "2", "--output-dir", tmp_path, monkeypatch=monkeypatch)

    printed = capsys.readouterr().out
    metrics = json.loads((tmp_path / "eval_results_test.json").read_text())
    assert metrics["sacrebleu_signature"] in printed and "sacreBLEU" in printed
    assert metrics["split"] == "test" and metrics["dataset"] == eval_data_dir.name
    assert metrics["num_beams"] == 2 and metrics["num_sentences"] == 6

    hypotheses = (tmp_path / "hypotheses_test.de").read_text().split("\n")[:-1]
    references = (eval_data_dir / "test.de").read_text().split("\n")[:-1]
    assert len(hypotheses) == 6
    rescored = corpus_scores(hypotheses, references, "de")
    for key in ("sacrebleu", "paper_bleu", "tokenized_bleu_lc", "chrf"):
        assert metrics[key] == pytest.approx(rescored[key])


def test_a_hub_test_set_is_read_at_the_revision_asked_for_and_its_commit_reaches_the_cards_model_index(
    tiny_checkpoint, hub_here, tmp_path, monkeypatch, capsys
):
    """Scores of a Hub dataset named it, not the version of it that was scored: a BLEU on a test set since
    corrected could not be told from one on the corrected set."""
    first = push_translation_dataset(hub_here[0], "tester/newstest", {"test": synthetic_pairs(3)})
    push_translation_dataset(hub_here[0], "tester/newstest", {"test": synthetic_pairs(5, seed=1)})
    common = ["--model", tiny_checkpoint[0], "--dataset", "tester/newstest", "--language-pair", "de-en"]
    common += ["--source-lang", "en", "--target-lang", "de", "--output-dir", tmp_path]
    run_script("evaluate.py", *common, "--dataset-revision", first, monkeypatch=monkeypatch)
    metrics = json.loads((tmp_path / "eval_results_test.json").read_text())
    assert (metrics["dataset_commit"], metrics["num_sentences"]) == (first, 3)
    assert {entry.dataset_revision for entry in _eval_results_metadata([metrics], None)} == {first}
    local = ["--model", tiny_checkpoint[0], "--data-dir", tmp_path, "--source-lang", "en", "--target-lang", "de"]
    assert script_error("evaluate.py", *local, "--dataset-revision", first, monkeypatch=monkeypatch) == "2"
    assert "error: --dataset-revision names a version of a Hub dataset (--dataset)" in capsys.readouterr().err
    # ignored beside local files, it was recorded with the scores and in the card's model-index
    assert script_error("evaluate.py", *local, "--language-pair", "de-en", monkeypatch=monkeypatch) == "2"
    assert "error: --language-pair names a configuration of a Hub dataset (--dataset)" in capsys.readouterr().err


def test_scores_of_other_weights_in_the_output_directory_are_replaced_with_a_warning(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch, caplog
):
    """Another model (or the same directory averaged again) evaluated into the same directory: its scores replaced
    the earlier ones without a word. The same weights evaluated again replace them quietly."""
    model_dir = tiny_checkpoint[0]
    common = ["--model", model_dir, "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    metrics_path = tmp_path / "eval_results_test.json"
    earlier = {"model": "runs/other/averaged", "model_weights": [{"name": "model.safetensors", "sha256": "0" * 64}]}
    metrics_path.write_text(json.dumps(earlier))
    run_script("evaluate.py", *common, "--output-dir", tmp_path, monkeypatch=monkeypatch)
    replaced = [message for message in caplog.messages if "which this evaluation replaces" in message]
    assert replaced == [
        f"{metrics_path} holds the scores of other weights (those of runs/other/averaged then), which this "
        "evaluation replaces: another output directory keeps both"
    ]
    assert json.loads(metrics_path.read_text())["model_weights"] == weights_record(model_dir)
    caplog.clear()
    run_script("evaluate.py", *common, "--output-dir", tmp_path, monkeypatch=monkeypatch)
    assert "which this evaluation replaces" not in caplog.text


def test_scores_of_another_evaluation_of_the_same_weights_are_replaced_with_a_warning(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch, caplog
):
    """A quick check (`--limit`, another beam) of the model evaluated into the directory of its full evaluation
    replaced the full test set's scores without a word, and the card then showed the quick ones."""
    common = ["--model", tiny_checkpoint[0], "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    run_script("evaluate.py", *common, "--output-dir", tmp_path, monkeypatch=monkeypatch)
    caplog.clear()
    run_script(
        "evaluate.py", *common, "--limit", "2", "--num-beams", "1", "--output-dir", tmp_path, monkeypatch=monkeypatch
    )
    replaced = [message for message in caplog.messages if "which this evaluation replaces" in message]
    assert replaced == [
        f"{tmp_path / 'eval_results_test.json'} holds the scores of another evaluation of these weights "
        "(num_sentences 6, not 2; num_beams 4, not 1), which this evaluation replaces: another output directory "
        "keeps both"
    ]
    caplog.clear()
    run_script(
        "evaluate.py", *common, "--limit", "2", "--num-beams", "1", "--output-dir", tmp_path, monkeypatch=monkeypatch
    )
    assert "which this evaluation replaces" not in caplog.text


class FullDisk(io.StringIO):
    """Standard output redirected to a file on a full disk."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_scores_that_cannot_be_printed_are_still_written_to_the_metrics_file(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch
):
    """`evaluate.py ... > scores.txt` on a full disk, a terminal gone, `| head -1`: the print of the scores raised,
    a traceback, and the metrics file was never written."""
    monkeypatch.setattr(sys, "stdout", FullDisk())
    common = ["--model", tiny_checkpoint[0], "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    message = script_error("evaluate.py", *common, "--output-dir", tmp_path, monkeypatch=monkeypatch)
    assert message == "error: cannot write to standard output: [Errno 28] No space left on device"
    assert json.loads((tmp_path / "eval_results_test.json").read_text())["num_sentences"] == 6


def test_a_log_that_cannot_be_written_leaves_the_evaluation_to_finish(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch
):
    """`evaluate.py ... 2> log` with the log on a full disk: transformers' bar of the weights loaded raised, and
    the script ended before translating anything."""
    monkeypatch.setattr(sys, "stderr", FullDisk())
    common = ["--model", tiny_checkpoint[0], "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    run_script("evaluate.py", *common, "--output-dir", tmp_path, monkeypatch=monkeypatch)
    assert json.loads((tmp_path / "eval_results_test.json").read_text())["num_sentences"] == 6


def test_evaluation_into_chinese_scores_characters_and_says_why_tokenised_bleu_is_not_given(
    tiny_checkpoint, tmp_path, monkeypatch, capsys
):
    """sacreBLEU's Chinese tokenisation (13a made each clause one word), no Moses-tokenised BLEU (it finds no words
    in Chinese): "n/a" with the reason, where the script crashed on formatting None."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "test.en").write_text("The dog eats the apple.\nA man likes the water.\n", encoding="utf-8")
    (data_dir / "test.zh").write_text("狗吃苹果。\n男人喜欢水。\n", encoding="utf-8")
    common = ["--model", tiny_checkpoint[0], "--data-dir", data_dir, "--source-lang", "en", "--target-lang", "zh"]
    run_script("evaluate.py", *common, "--output-dir", tmp_path / "eval", monkeypatch=monkeypatch)
    printed = capsys.readouterr().out
    metrics = json.loads((tmp_path / "eval" / "eval_results_test.json").read_text())
    assert "|tok:zh|" in metrics["sacrebleu_signature"]
    assert metrics["paper_bleu"] is None and metrics["tokenized_bleu_lc"] is None
    assert "BLEU, tokenised as in the paper:   n/a   not computed: Moses tokenisation finds no words in zh" in printed


@pytest.mark.skipif(importlib.util.find_spec("MeCab") is not None, reason="sacreBLEU's MeCab extra is installed")
def test_evaluation_into_japanese_without_mecab_is_refused_before_translating(
    tiny_checkpoint, eval_data_dir, monkeypatch
):
    def not_reached(*args, **kwargs):
        raise AssertionError("translated although it could not be scored")

    monkeypatch.setattr(evaluation, "load_scored_model", not_reached)
    common = ["--model", tiny_checkpoint[0], "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "ja"]
    message = script_error("evaluate.py", *common, monkeypatch=monkeypatch)
    assert message == (
        "error: BLEU into 'ja' uses sacreBLEU's 'ja-mecab' tokeniser, which needs packages that are not installed: "
        "pip install 'sacrebleu[ja]'"
    )


def test_a_limited_evaluation_records_the_split_it_was_cut_from(tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch):
    """What a card needs to show `--limit` scores as part of the split's, not as the split's (`result_caveats`)."""
    model_dir, _, _ = tiny_checkpoint
    common = ["--model", model_dir, "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    run_script("evaluate.py", *common, "--limit", "3", "--output-dir", tmp_path, monkeypatch=monkeypatch)
    metrics = json.loads((tmp_path / "eval_results_test.json").read_text())
    assert (metrics["num_sentences"], metrics["limit"], metrics["sentences_in_split"]) == (3, 3, 6)
    assert result_caveats(metrics) == ["the first 3 of 6 sentences only (`--limit`)"]


def test_evaluate_with_two_workers_scores_the_same_hypotheses(tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch):
    model_dir, _, _ = tiny_checkpoint
    common = ["--model", model_dir, "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    common += ["--num-beams", "2", "--max-tokens", "16"]  # several batches of the 6 sentences
    for workers in ("1", "2"):
        run_script(
            "evaluate.py", *common, "--workers", workers, "--output-dir", tmp_path / workers, monkeypatch=monkeypatch
        )
    one, two = (json.loads((tmp_path / w / "eval_results_test.json").read_text()) for w in ("1", "2"))
    assert (tmp_path / "1" / "hypotheses_test.de").read_text() == (tmp_path / "2" / "hypotheses_test.de").read_text()
    assert one["sacrebleu"] == two["sacrebleu"] and one["num_sentences"] == two["num_sentences"] == 6


def test_evaluate_lists_the_available_splits_for_an_unknown_one(tiny_checkpoint, eval_data_dir, monkeypatch):
    model_dir, _, _ = tiny_checkpoint
    message = script_error(
        "evaluate.py",
        *("--model", model_dir, "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"),
        *("--split", "validation"),
        monkeypatch=monkeypatch,
    )
    assert message.startswith("error: no split 'validation'") and "['test']" in message


def test_evaluate_refuses_a_missing_directory_and_another_model_type(eval_data_dir, tmp_path, monkeypatch):
    common = ["--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    message = script_error("evaluate.py", "--model", tmp_path / "missing", *common, monkeypatch=monkeypatch)
    assert message == f"error: Model directory '{tmp_path / 'missing'}' does not exist."

    MarianConfig(vocab_size=16, d_model=8).save_pretrained(tmp_path / "marian")
    message = script_error("evaluate.py", "--model", tmp_path / "marian", *common, monkeypatch=monkeypatch)
    assert "holds a 'marian' checkpoint, not a 'vaswani_transformer' one" in message

    (tmp_path / "no_config").mkdir()
    message = script_error("evaluate.py", "--model", tmp_path / "no_config", *common, monkeypatch=monkeypatch)
    assert message.endswith("has no config.json: it is not a model saved with save_pretrained.")

    (tmp_path / "no_config" / "config.json").write_text("{}")  # the file, where the directory was meant
    message = script_error(
        "evaluate.py", "--model", tmp_path / "no_config" / "config.json", *common, monkeypatch=monkeypatch
    )
    assert message.endswith("config.json' is a file: pass the model directory that holds config.json and the weights.")


def test_an_unwritable_output_is_named_before_the_test_set_is_translated(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch
):
    def not_reached(*args, **kwargs):
        raise AssertionError("translated although its results could not be written")

    monkeypatch.setattr(evaluation, "evaluate_split", not_reached)
    blocker = tmp_path / "runs"
    blocker.write_text("")
    common = ["--model", tiny_checkpoint[0], "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    message = script_error("evaluate.py", *common, "--output-dir", blocker / "eval", monkeypatch=monkeypatch)
    written = blocker / "eval" / "eval_results_test.json"
    assert message == f"error: cannot write {written}: {blocker} is a file, not a directory"
    message = script_error("evaluate.py", *common, "--hypotheses-file", tmp_path, monkeypatch=monkeypatch)
    assert message == f"error: cannot write {tmp_path}: it is a directory; give a file name"
    # Before, `-` became a file of that name and stdin was scored; a .gz name held plain text, then failed to read.
    message = script_error("evaluate.py", *common, "--hypotheses-file", "-", monkeypatch=monkeypatch)
    assert message == "error: cannot write -: it would be a file named '-', not standard output"
    message = script_error("evaluate.py", *common, "--hypotheses-file", tmp_path / "h.de.gz", monkeypatch=monkeypatch)
    assert message.startswith(f"error: cannot write {tmp_path / 'h.de.gz'}: the output is plain text")


def test_outputs_inside_a_checkpoint_of_a_run_still_training_are_refused_before_translating(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch
):
    """`--output-dir runs/x/checkpoint-N/eval`, evaluating a checkpoint as the run goes on: its rotation
    (`--save_total_limit`) deleted the directory, hypotheses and scores with it, while the evaluation went on."""

    def not_reached(*args, **kwargs):
        raise AssertionError("translated")

    monkeypatch.setattr(evaluation, "evaluate_split", not_reached)
    checkpoint = tmp_path / "run" / "checkpoint-8"
    shutil.copytree(tiny_checkpoint[0], checkpoint)
    common = ["--model", checkpoint, "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    with training_run_holding(checkpoint.parent) as holder:
        for output, written in (
            (["--output-dir", checkpoint / "eval"], checkpoint / "eval" / "eval_results_test.json"),
            (["--hypotheses-file", checkpoint / "test.de"], checkpoint / "test.de"),
        ):
            message = script_error("evaluate.py", *common, *output, monkeypatch=monkeypatch)
            assert message == (
                f"error: the output {written} lies inside {checkpoint}, which the training run in {checkpoint.parent} "
                f"({holder}) deletes when it rotates its checkpoints: write it outside that directory"
            )
        outside = tmp_path / "run" / "eval-8"  # beside the checkpoints, in the run's directory: kept
        with pytest.raises(AssertionError, match="translated"):
            run_script("evaluate.py", *common, "--output-dir", outside, monkeypatch=monkeypatch)


def test_weights_replaced_while_they_load_are_refused_rather_than_recorded_as_scored(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch
):
    """An average replaced while evaluate.py loaded it: the record named the weights hashed before loading, the
    scores were those of the weights loaded."""
    model_dir = tmp_path / "averaged"
    shutil.copytree(tiny_checkpoint[0], model_dir)
    load = evaluation.load_model_and_tokenizer

    def replaced_meanwhile(name, **kwargs):
        loaded = load(name, **kwargs)
        with open(model_dir / "model.safetensors", "ab") as weights:
            weights.write(b" ")  # another average, written in place of the one hashed
        return loaded

    monkeypatch.setattr(evaluation, "load_model_and_tokenizer", replaced_meanwhile)
    common = ["--model", model_dir, "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    message = script_error("evaluate.py", *common, "--output-dir", tmp_path / "eval", monkeypatch=monkeypatch)
    assert message == (
        f"error: {model_dir}'s weights changed while they were loaded (averaged or converted again meanwhile?): "
        "evaluate it once they are written"
    )
    assert not (tmp_path / "eval").exists()


def test_outputs_that_would_overwrite_the_test_set_or_each_other_are_refused(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch
):
    data = tmp_path / "data"
    shutil.copytree(eval_data_dir, data)
    references = (data / "test.de").read_text()
    common = ["--model", tiny_checkpoint[0], "--data-dir", data, "--source-lang", "en", "--target-lang", "de"]
    message = script_error("evaluate.py", *common, "--hypotheses-file", data / "test.de", monkeypatch=monkeypatch)
    assert message.startswith(f"error: the hypotheses file {data / 'test.de'} is the reference file ")
    assert (data / "test.de").read_text() == references
    both = tmp_path / "eval.txt"
    message = script_error(
        "evaluate.py", *common, "--hypotheses-file", both, "--metrics-json", both, monkeypatch=monkeypatch
    )
    assert message == f"error: the hypotheses file and the metrics file are one file, {both}: give each its own"


def test_outputs_that_would_overwrite_the_models_files_are_refused_and_its_directory_still_holds_scores(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch
):
    """`--metrics-json MODEL/config.json` wrote the scores over the model's config (exit 0), as `translate.py
    --output-file` no longer could. Evaluated into the model's directory, its earlier scores are written again."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_checkpoint[0], model_dir)
    config = (model_dir / "config.json").read_text()
    common = ["--model", model_dir, "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    message = script_error(
        "evaluate.py", *common, "--metrics-json", model_dir / "config.json", monkeypatch=monkeypatch
    )
    assert message == (
        f"error: the metrics file {model_dir / 'config.json'} is the model's config.json {model_dir / 'config.json'}: "
        "writing it would destroy it; choose another path"
    )
    assert (model_dir / "config.json").read_text() == config
    for _ in range(2):
        run_script("evaluate.py", *common, "--output-dir", model_dir, monkeypatch=monkeypatch)
    assert json.loads((model_dir / "eval_results_test.json").read_text())["num_sentences"] == 6


def test_a_hub_model_s_scores_record_the_commit_and_the_weights_scored(hub, tiny_checkpoint, eval_data_dir, tmp_path):
    """Scores of `--model owner/name` recorded `model_weights: null` and no version: not tied to what was scored."""
    from huggingface_hub import HfApi, snapshot_download

    endpoint, _ = hub
    api = HfApi(endpoint=endpoint, token=HUB_TOKEN)
    api.create_repo("scored/tiny", exist_ok=True)
    commit = api.upload_folder(folder_path=tiny_checkpoint[0], repo_id="scored/tiny").oid
    snapshot_download("scored/tiny", cache_dir=tmp_path / "hub", endpoint=endpoint, token=HUB_TOKEN)
    common = ["--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de", "--output-dir", tmp_path]
    evaluated = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "evaluate.py"),
            "--model",
            "scored/tiny",
            "--num-beams",
            "2",
            *map(str, common),
        ],
        env=subprocess_env(HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "datasets")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    metrics = json.loads((tmp_path / "eval_results_test.json").read_text())
    assert metrics["model"] == "scored/tiny" and metrics["model_commit"] == commit
    assert metrics["model_weights"] == weights_record(tiny_checkpoint[0])


def test_an_evaluation_killed_while_scoring_scores_its_hypotheses_when_run_again(
    tiny_checkpoint, eval_data_dir, tmp_path, monkeypatch
):
    """Ctrl-C while the scores were computed, after every hypothesis was written: the same command translated the
    whole split again."""
    translated = []
    translate = translation.translate

    def counted(model, tokenizer, sentences, **kwargs):
        translated.extend(sentences)
        return translate(model, tokenizer, sentences, **kwargs)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(translation, "translate", counted)
    common = ["--model", tiny_checkpoint[0], "--data-dir", eval_data_dir, "--source-lang", "en", "--target-lang", "de"]
    with monkeypatch.context() as scoring:
        scoring.setattr(evaluation, "corpus_scores", interrupted)
        message = script_error("evaluate.py", *common, "--output-dir", tmp_path / "eval", monkeypatch=monkeypatch)
    hypotheses = tmp_path / "eval" / "hypotheses_test.de"
    assert message == f"interrupted: the same command resumes from the hypotheses written into {hypotheses}"
    assert len(translated) == 6

    run_script("evaluate.py", *common, "--output-dir", tmp_path / "eval", monkeypatch=monkeypatch)
    assert len(translated) == 6, "translated again"
    metrics = json.loads((tmp_path / "eval" / "eval_results_test.json").read_text())
    rescored = corpus_scores(
        hypotheses.read_text().split("\n")[:-1], (eval_data_dir / "test.de").read_text().split("\n")[:-1], "de"
    )
    assert metrics["num_sentences"] == 6 and metrics["chrf"] == rescored["chrf"]
    assert sorted(path.name for path in (tmp_path / "eval").iterdir()) == [
        "eval_results_test.json",
        "hypotheses_test.de",
    ]
