"""Tests of modeling/model_card.py: the card holds measured numbers only, its model-index validates, the curves
plot."""


import pytest
from helpers import LOG_HISTORY
from hub_server import card_metadata_errors
from huggingface_hub import ModelCard

from modeling.model_card import collect_card_inputs, plot_training_curves, render_model_card

REPO_ID = "tester/tiny-transformer"


def test_card_metadata_has_the_bleu_results_in_model_index(eval_result):
    card = render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result])
    data = ModelCard(str(card)).data  # parse back what would be README.md
    assert data.model_name == "tiny"
    assert data.language == ["en", "de"] and data.pipeline_tag == "translation"
    assert data.library_name == "transformers" and data.license == "apache-2.0"
    by_name = {result.metric_name: result for result in data.eval_results}
    sacrebleu = by_name["sacreBLEU"]
    assert sacrebleu.metric_type == "bleu" and sacrebleu.task_type == "translation"
    assert sacrebleu.metric_value == round(eval_result["sacrebleu"], 2)
    assert sacrebleu.metric_config == eval_result["sacrebleu_signature"]
    assert sacrebleu.dataset_type == "synthetic" and sacrebleu.dataset_split == "test"
    paper = by_name["BLEU (tokenised, compound splitting, as in the paper)"]
    assert paper.metric_value == round(eval_result["paper_bleu"], 2)
    assert by_name["BLEU (tokenised, lowercased)"].metric_value == round(eval_result["tokenized_bleu_lc"], 2)
    assert by_name["chrF"].metric_type == "chrf"
    assert f"{eval_result['sacrebleu']:.2f}" in card.text
    assert "@inproceedings{vaswani2017attention" in card.text
    assert f'from_pretrained("{REPO_ID}", trust_remote_code=True)' in card.text


def test_the_test_hub_validates_model_index_like_the_hub(eval_result):
    card = str(render_model_card(model_name="tiny", repo_id=REPO_ID, eval_results=[eval_result]))
    assert card_metadata_errors(card) == []
    broken = card.replace("value: ", "value: about ", 1)  # the first metric value becomes a string
    assert card_metadata_errors(broken) == ['"model-index[].results[].metrics[]" needs a "type" and a numeric "value"']


def test_card_without_measurements_says_so_and_invents_nothing():
    card = render_model_card(model_name="tiny", repo_id=REPO_ID)
    assert "model-index" not in str(card)
    assert card.data.eval_results is None
    for sentence in ("Not measured", "Hyperparameters: not recorded", "Data statistics: not recorded"):
        assert sentence in card.text
    assert "Training curves: not recorded" in card.text


def test_training_curves_and_collected_inputs(card_dir, tmp_path):
    inputs = collect_card_inputs([card_dir])
    assert inputs["log_history"] == LOG_HISTORY and len(inputs["eval_results"]) == 1
    png = plot_training_curves(inputs["log_history"], tmp_path / "curves.png")
    assert png.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="no train loss"):
        plot_training_curves([{"learning_rate": 1.0, "step": 1}], tmp_path / "empty.png")
