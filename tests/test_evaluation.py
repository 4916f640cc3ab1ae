"""Tests of modeling/evaluation.py: a split translated, scored and recorded with its decoding settings."""

import json

import pytest
from datasets import Dataset
from helpers import EchoModel, synthetic_pairs, tiny_tokenizer

from modeling.evaluation import evaluate_split, metrics_filename
from modeling.files import write_json


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_evaluate_split_scores_the_split_and_records_decoding_settings(tokenizer, tmp_path):
    pairs = synthetic_pairs(8, seed=3)
    split = Dataset.from_list([{"translation": {"en": en, "de": en}} for en, _ in pairs])
    metrics, hypotheses = evaluate_split(EchoModel(), tokenizer, split, source_lang="en", target_lang="de")

    assert hypotheses == [en for en, _ in pairs]
    assert metrics["sacrebleu"] == pytest.approx(100.0)
    assert metrics["num_beams"] == 4 and metrics["length_penalty"] == 0.6
    assert metrics["num_sentences"] == 8 and metrics["target_lang"] == "de"

    path = write_json(tmp_path / "out" / metrics_filename("test"), metrics)
    assert path.name == "eval_results_test.json"
    assert json.loads(path.read_text()) == metrics
