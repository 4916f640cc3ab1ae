"""BLEU variants on hand-made examples, and `translate`'s batching, ordering and empty-line contract."""

import json
import math

import pytest
import torch
from datasets import Dataset
from tiny_checkpoint import one_torch_thread, synthetic_pairs, tiny_model, tiny_tokenizer
from transformers import GenerationConfig

from modeling.evaluation import (
    corpus_scores,
    evaluate_split,
    metrics_filename,
    moses_tokenize,
    split_compounds,
    translate,
    write_json,
)


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    with one_torch_thread():
        yield


# --- scores -------------------------------------------------------------------------------------------------


def test_split_compounds_matches_the_perl_one_liner():
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    # Perl's s///g does not rescan the consumed "b": only the first hyphen of a chain is split.
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    assert split_compounds("a - b x- -y") == "a - b x- -y"  # a hyphen needs a non-space on both sides


def test_moses_tokenisation_splits_punctuation_and_escapes_like_tokenizer_perl():
    assert moses_tokenize("Hallo, Welt!", "de") == "Hallo , Welt !"
    assert moses_tokenize('Er sagte "ja" & ging.', "de") == "Er sagte &quot; ja &quot; &amp; ging ."
    # replace-unicode-punctuation.perl runs first: the ellipsis character becomes three dots.
    assert moses_tokenize("Na…", "de") == "Na ..."


def test_identical_hypotheses_score_100_everywhere():
    sentences = ["Das ist ein rich-text Format.", "Der kleine Hund sieht einen roten Ball heute."]
    scores = corpus_scores(sentences, sentences, "de")
    for key in ("sacrebleu", "paper_bleu", "tokenized_bleu_lc", "chrf"):
        assert scores[key] == pytest.approx(100.0), key
    assert scores["num_sentences"] == 2


def test_compound_splitting_gives_the_hand_computed_paper_bleu():
    hyp, ref = ["Das ist ein rich-text Format."], ["Das ist ein rich-text Buch."]
    scores = corpus_scores(hyp, ref, "de")
    # sacreBLEU (13a keeps "rich-text" whole): 6 tokens, n-gram precisions 5/6, 3/5, 2/4, 1/3, BP = 1.
    assert scores["sacrebleu"] == pytest.approx(100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    # Paper BLEU: "rich ##AT##-##AT## text" makes 8 tokens, precisions 7/8, 5/7, 4/6, 3/5: BLEU = 1/sqrt(2).
    assert scores["paper_bleu"] == pytest.approx(100 / math.sqrt(2))
    assert scores["paper_bleu"] > scores["sacrebleu"]


def test_lowercased_tokenised_bleu_ignores_case_but_sacrebleu_does_not():
    hyp, ref = ["THE SMALL DOG SEES A BALL."], ["the small dog sees a ball."]
    scores = corpus_scores(hyp, ref, "en")
    assert scores["tokenized_bleu_lc"] == pytest.approx(100.0)
    # Only the final full stop matches case-sensitively: no bigram, so BLEU is (exp-smoothed) small.
    assert scores["sacrebleu"] < 10


def test_brevity_penalty_and_signatures():
    scores = corpus_scores(["der kleine Hund sieht"], ["der kleine Hund sieht einen Ball"], "de")
    # All n-grams of the 4-word hypothesis match; the 6-word reference costs BP = exp(1 - 6/4).
    assert scores["sacrebleu"] == pytest.approx(100 * math.exp(1 - 6 / 4))
    assert scores["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "compound-split:atat" in scores["paper_bleu_signature"]
    assert "tok:none|smooth:none" in scores["paper_bleu_signature"]
    assert "case:lc" in scores["tokenized_bleu_lc_signature"]
    assert scores["chrf_signature"].startswith("nrefs:1|case:mixed")


def test_mismatched_or_empty_inputs_are_refused():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_scores(["a", "b"], ["a"], "en")
    with pytest.raises(ValueError, match="Nothing to score"):
        corpus_scores([], [], "en")


# --- translate ----------------------------------------------------------------------------------------------


class EchoModel:
    """Stands in for a seq2seq model: "translates" each source into itself and records what it was given.

    With a tokenizer whose decode inverts encode, `translate` must then return its input, line for line.
    """

    def __init__(self):
        self.training = True
        self.device = torch.device("cpu")
        self.generation_config = GenerationConfig(num_beams=4, length_penalty=0.6)
        self.calls: list[dict] = []

    def eval(self):
        return self.train(False)

    def train(self, mode: bool = True):
        self.training = mode
        return self

    def generate(self, input_ids, attention_mask, **kwargs):
        assert not self.training
        self.calls.append({"input_ids": input_ids, "attention_mask": attention_mask, "kwargs": kwargs})
        return input_ids


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_translate_keeps_order_and_empty_lines(tokenizer):
    pairs = synthetic_pairs(30, seed=1)
    sentences = [en for en, _ in pairs]
    sentences[3:3] = [""]
    sentences[10:10] = ["   "]
    sentences.append("")
    model = EchoModel()

    outputs = translate(model, tokenizer, sentences, max_tokens=40, num_beams=2, max_new_tokens=7)

    assert outputs == [s.strip() for s in sentences]
    assert model.training, "the model's train/eval mode is restored"
    seen = [ids for call in model.calls for ids in call["input_ids"].tolist()]
    assert len(seen) == len(sentences) - 3, "empty lines never reach the model"
    for call in model.calls:
        batch_size, width = call["input_ids"].shape
        assert batch_size == 1 or batch_size * width <= 40, "batches respect the token budget"
        assert call["kwargs"] == {"num_beams": 2, "max_new_tokens": 7}
        assert call["attention_mask"].sum(1).max() == width, "no batch is padded beyond its longest sentence"
    assert len(model.calls) > 1


def test_translate_gives_an_oversized_sentence_a_batch_of_its_own(tokenizer):
    long_sentence = " ".join(["the small dog sees a red ball today."] * 4)
    model = EchoModel()
    assert translate(model, tokenizer, ["a cat.", long_sentence], max_tokens=8) == ["a cat.", long_sentence]
    assert [call["input_ids"].shape[0] for call in model.calls] == [1, 1]


def test_translate_of_only_empty_lines_does_not_call_the_model(tokenizer):
    model = EchoModel()
    assert translate(model, tokenizer, ["", " "]) == ["", ""]
    assert model.calls == []


def test_real_model_translations_do_not_depend_on_batching(tokenizer):
    """Padding must not leak into results: one big batch and one sentence per batch agree exactly."""
    model = tiny_model(len(tokenizer))
    sentences = [en for en, _ in synthetic_pairs(6, seed=2)]
    settings = {"num_beams": 2, "max_new_tokens": 6}
    together = translate(model, tokenizer, sentences, max_tokens=10_000, **settings)
    alone = translate(model, tokenizer, sentences, max_tokens=1, **settings)
    assert together == alone


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
