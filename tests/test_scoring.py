"""Tests of modeling/scoring.py: sacreBLEU, the paper's tokenised BLEU (compounds split into German), lowercased
BLEU and chrF."""

import math

import pytest

from modeling.scoring import corpus_scores, moses_tokenize, split_compounds


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


def test_compounds_are_split_into_german_only():
    hyp, ref = ["Il est peut-être allé au centre-ville."], ["Il est peut-être parti au centre-ville."]
    french = corpus_scores(hyp, ref, "fr")
    assert french["paper_bleu"] == pytest.approx(french["tokenized_bleu_lc"])  # the same case: only splitting differs
    assert "compound-split" not in french["paper_bleu_signature"]
    split = corpus_scores(hyp, ref, "de")  # the same words scored as German: split, more easy matches
    assert split["paper_bleu"] > french["paper_bleu"]


def test_the_paper_bleu_normalises_no_punctuation_as_get_ende_bleu_did_in_2017():
    reference = ["Er sagte „ja“ und ging nach Hause, weil es schon spät war."]
    assert corpus_scores(reference, reference, "de")["paper_bleu"] == pytest.approx(100.0)
    hypothesis = ['Er sagte „ja" und ging nach Hause, weil es schon spät war.']  # a plain closing quote
    german = corpus_scores(hypothesis, reference, "de")
    # 16 tokens; unnormalised, the hypothesis's " (&quot;) misses the reference's “, and so do the n-grams over it.
    assert german["paper_bleu"] == pytest.approx(100 * (15 / 16 * 13 / 15 * 11 / 14 * 9 / 13) ** 0.25)
    assert german["tokenized_bleu_lc"] == pytest.approx(100.0), "normalised, both are &quot;"
    assert "unnormalized|compound-split:atat" in german["paper_bleu_signature"]


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
