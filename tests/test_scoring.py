"""Tests of modeling/scoring.py: sacreBLEU, the paper's tokenised BLEU (compounds split into German), lowercased
BLEU and chrF."""

import importlib.util
import logging
import math

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from modeling import scoring
from modeling.scoring import (
    check_scorable,
    corpus_scores,
    moses_finds_words,
    moses_tokenize,
    scoring_language,
    split_compounds,
)

# Made-up Chinese: the hypotheses miss a word, add one, use another.
CHINESE_REFERENCES = ["女人吃红球。", "男人喜欢水。", "小狗看见一个红球，很高兴。", "孩子在大房子里喝水。"]
CHINESE_HYPOTHESES = ["女人吃红球。", "男人喜欢吃水。", "小狗看见红球，很高兴。", "孩子在房子里喝水。"]


def test_split_compounds_matches_the_perl_one_liner():
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    # Perl's s///g does not rescan the consumed "b": only the first hyphen of a chain is split.
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    assert split_compounds("a - b x- -y") == "a - b x- -y"  # a hyphen needs a non-space on both sides
    # The one-liner reads bytes: a one-letter part that is two bytes in UTF-8 leaves the next hyphen a match
    # (perl 5.36 printed this for the tokenised "T-Ö-Shirt").
    assert split_compounds("T-Ö-Shirt") == "T ##AT##-##AT## Ö ##AT##-##AT## Shirt"
    # A hypothesis read from JSON may hold a lone surrogate ("\ud800"): split like any three-byte character, no
    # encoding error.
    assert split_compounds("x-\ud800-y a-b") == "x ##AT##-##AT## \ud800 ##AT##-##AT## y a ##AT##-##AT## b"


def test_moses_tokenisation_splits_punctuation_and_escapes_like_tokenizer_perl():
    assert moses_tokenize("Hallo, Welt!", "de") == "Hallo , Welt !"
    assert moses_tokenize('Er sagte "ja" & ging.', "de") == "Er sagte &quot; ja &quot; &amp; ging ."
    # replace-unicode-punctuation.perl runs first: the ellipsis character becomes three dots.
    assert moses_tokenize("Na…", "de") == "Na ..."


def test_moses_tokenisation_uses_the_english_non_breaking_prefixes_of_2017():
    # tokenizer.perl -l en of mosesdecoder 3a0631a05 (Dec 2017) printed these; "Rs" (rupees) became a prefix in 2019.
    assert moses_tokenize("The shirt costs 500 Rs.", "en") == "The shirt costs 500 Rs ."
    assert moses_tokenize("He paid Rs. 500 for it.", "en") == "He paid Rs . 500 for it ."
    assert moses_tokenize("Mr. Smith paid No. 5.", "en") == "Mr. Smith paid No. 5 ."  # the prefixes of 2017 stay


def test_moses_tokenisation_follows_the_rules_of_the_language_given():
    # tokenizer.perl -l fr (and it) splits after an elided article's apostrophe, -l en before it; German's
    # non-breaking prefixes keep an ordinal's full stop ("3. Mai"), which English's would split off.
    assert moses_tokenize("C'est l'homme.", "fr") == "C&apos; est l&apos; homme ."
    assert moses_tokenize("C'est l'homme.", "en") == "C &apos;est l &apos;homme ."
    assert moses_tokenize("Er kam am 3. Mai.", "de") == "Er kam am 3. Mai ."


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


def test_lowercased_tokenised_bleu_ignores_case_but_sacrebleu_and_the_paper_bleu_do_not():
    hyp, ref = ["THE SMALL DOG SEES A BALL."], ["the small dog sees a ball."]
    scores = corpus_scores(hyp, ref, "en")
    assert scores["tokenized_bleu_lc"] == pytest.approx(100.0)
    # Only the final full stop matches case-sensitively: no bigram, so BLEU is (exp-smoothed) small.
    assert scores["sacrebleu"] < 10
    # get_ende_bleu.sh ran multi-bleu.perl without -lc: cased, and unsmoothed, so no bigram is BLEU 0.
    assert scores["paper_bleu"] == 0.0 and "|case:mixed|" in scores["paper_bleu_signature"]


def test_the_tokenised_scores_raise_no_warning_that_the_text_looks_tokenised(caplog):
    """They are on Moses-tokenised text on purpose: sacreBLEU's warning after 100 lines that end in " ." (forgot to
    detokenize?) would mislead."""
    sentences = [f"Der Hund Nummer {i} läuft." for i in range(100)]
    with caplog.at_level(logging.WARNING):
        corpus_scores(sentences, sentences, "de")
    assert "tokenized period" not in caplog.text


@pytest.mark.parametrize(
    ("hypotheses", "references", "lang", "multi_bleu_lc"),
    [
        (
            ["über der Stadt fliegt ein Flugzeug.", "Ältere Männer sitzen auf einer Bank."],
            ["Über der Stadt fliegt ein Flugzeug.", "ältere Männer sitzen auf einer Bank."],
            "de",
            80.91,  # "BLEU = 80.91, 85.7/83.3/80.0/75.0 (BP=1.000, ratio=1.000, hyp_len=14, ref_len=14)"
        ),
        (["à la plage, des enfants jouent."], ["À la plage, des enfants jouent."], "fr", 84.09),
    ],
)
def test_lowercased_tokenised_bleu_lowercases_ascii_only_as_multi_bleu_perl_does(
    hypotheses, references, lang, multi_bleu_lc
):
    """multi-bleu.perl reads bytes, so its -lc leaves "Ü", "Ä", "À" as they are: a word that differs from the
    reference only in the case of such a letter does not match."""
    # The scores that Moses' replace-unicode-punctuation.perl | tokenizer.perl -l LANG | multi-bleu.perl -lc
    # printed (mosesdecoder 3a0631a05, Dec 2017, and HEAD alike; Perl 5.36).
    scores = corpus_scores(hypotheses, references, lang)
    assert round(scores["tokenized_bleu_lc"], 2) == multi_bleu_lc
    assert "|case:lc-ascii|" in scores["tokenized_bleu_lc_signature"]


def test_brevity_penalty_and_signatures():
    scores = corpus_scores(["der kleine Hund sieht"], ["der kleine Hund sieht einen Ball"], "de")
    # All n-grams of the 4-word hypothesis match; the 6-word reference costs BP = exp(1 - 6/4).
    assert scores["sacrebleu"] == pytest.approx(100 * math.exp(1 - 6 / 4))
    assert scores["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "compound-split:atat" in scores["paper_bleu_signature"]
    assert "tok:none|smooth:none" in scores["paper_bleu_signature"]
    assert "case:lc" in scores["tokenized_bleu_lc_signature"]
    assert scores["chrf_signature"].startswith("nrefs:1|case:mixed")
    # The line sacreBLEU prints, with the n-gram precisions and lengths a reader checks the number against.
    assert (
        scores["sacrebleu_details"]
        == "BLEU = 60.65 100.0/100.0/100.0/100.0 (BP = 0.607 ratio = 0.667 hyp_len = 4 ref_len = 6)"
    )


def test_the_tokenised_scores_signatures_name_each_step():
    """The signatures are what a reader compares numbers by: Moses' rules of the language, the paper BLEU
    unnormalised (compounds split into German only), the other normalised and ASCII-lowercased."""
    tail = f"eff:no|tok:none|smooth:none|version:{sacrebleu.__version__}"
    french = corpus_scores(["Il est allé à la plage."], ["Il est parti à la plage."], "fr")
    assert french["paper_bleu_signature"] == f"moses-tok:fr|unnormalized|nrefs:1|case:mixed|{tail}"
    assert french["tokenized_bleu_lc_signature"] == f"moses-tok:fr|nrefs:1|case:lc-ascii|{tail}"
    german = corpus_scores(["Das ist ein rich-text Format."], ["Das ist ein rich-text Buch."], "de")
    assert german["paper_bleu_signature"] == f"moses-tok:de|unnormalized|compound-split:atat|nrefs:1|case:mixed|{tail}"
    assert german["tokenized_bleu_lc_signature"] == f"moses-tok:de|nrefs:1|case:lc-ascii|{tail}"


def test_mismatched_or_empty_inputs_are_refused():
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_scores(["a", "b"], ["a"], "en")
    with pytest.raises(ValueError, match="Nothing to score"):
        corpus_scores([], [], "en")


@pytest.mark.parametrize("code", ["zh", "zh-CN", "zh_Hans", "ZH", "zho_Hans", "cmn"])
def test_chinese_is_scored_with_sacrebleus_chinese_tokenisation_whatever_the_code_s_spelling(code):
    """sacreBLEU picks its `zh` tokeniser for Chinese; 13a left each clause one word (BLEU 0 for near-matches)."""
    scores = corpus_scores(CHINESE_HYPOTHESES, CHINESE_REFERENCES, code)
    expected = BLEU(tokenize="zh").corpus_score(CHINESE_HYPOTHESES, [CHINESE_REFERENCES]).score
    assert scores["sacrebleu"] == pytest.approx(expected) and scores["sacrebleu"] > 40
    assert "|tok:zh|" in scores["sacrebleu_signature"]


@pytest.mark.parametrize(
    ("code", "references"),
    [
        ("zh", CHINESE_REFERENCES),
        ("zho_Hans", CHINESE_REFERENCES),
        ("lzh", CHINESE_REFERENCES),  # Classical Chinese; Wu, Gan and Cantonese too
        ("wuu", CHINESE_REFERENCES),
        ("th", ["ผู้หญิงกินน้ำ", "ผู้ชายชอบน้ำ"]),
    ],
)
def test_tokenised_bleu_is_not_computed_into_languages_without_spaces_between_words(code, references):
    """Moses splits off punctuation only there: its "tokens" are whole clauses, matched or not as a whole."""
    scores = corpus_scores(references, references, code)
    for key in ("paper_bleu", "tokenized_bleu_lc"):
        assert scores[key] is None
        assert scores[f"{key}_signature"].startswith("not computed: Moses tokenisation finds no words in")
    assert scores["chrf"] == pytest.approx(100.0)


def test_sacrebleu_into_thai_warns_that_13a_counts_clauses_as_words(caplog):
    with caplog.at_level(logging.WARNING, logger="modeling.scoring"):
        scores = corpus_scores(["ผู้หญิงกินน้ำ"], ["ผู้ชายกินน้ำ"], "th")
    assert "|tok:13a|" in scores["sacrebleu_signature"]
    assert "no tokeniser for 'th'" in caplog.text and "chrF" in caplog.text


@pytest.mark.parametrize("code", ["deu_Latn", "de-DE", "DE", "ger"])
def test_german_under_another_code_is_scored_as_german(code):
    hyp, ref = ["Das ist ein rich-text Format."], ["Das ist ein rich-text Buch."]
    german = corpus_scores(hyp, ref, "de")
    assert corpus_scores(hyp, ref, code) == german, "compounds split, Moses' German rules"


def test_scoring_language_reads_bcp47_flores_and_iso_639_3_codes():
    assert [scoring_language(code) for code in ("pt-BR", "sr_Latn", "fra_Latn", "jpn_Jpan", "arb_Arab")] == [
        "pt",
        "sr",
        "fr",
        "ja",
        "arb",  # no 639-1 mapping needed: scored with the language-independent rules either way
    ]


def test_scoring_language_reads_iso_639_2_and_639_3_codes_as_the_scorers_639_1_code():
    """FLORES-200 and NLLB name languages by their 639-3 code; under it unmapped, a language would be scored silently
    with the generic rules (13a, Moses without its own non-breaking prefixes, German without compound splitting).
    The pairs are ISO 639's own, bibliographic 639-2 codes ("ger", "fre", ...) among them."""
    iso_639_1 = {
        **dict.fromkeys(("zho", "chi", "cmn"), "zh"),
        **{"jpn": "ja", "kor": "ko", "eng": "en", "ita": "it", "fin": "fi", "swe": "sv", "spa": "es", "est": "et"},
        **{"gle": "ga", "hun": "hu", "lit": "lt", "lav": "lv", "pol": "pl", "por": "pt", "rus": "ru", "slv": "sl"},
        **{"cat": "ca", "som": "so", "asm": "as", "ben": "bn", "guj": "gu", "hin": "hi", "kan": "kn", "mal": "ml"},
        **{"mar": "mr", "pan": "pa", "tam": "ta", "tel": "te", "tha": "th", "lao": "lo", "khm": "km"},
        **{"deu": "de", "ger": "de", "fra": "fr", "fre": "fr", "ces": "cs", "cze": "cs", "ell": "el", "gre": "el"},
        **{"isl": "is", "ice": "is", "nld": "nl", "dut": "nl", "ron": "ro", "rum": "ro", "slk": "sk", "slo": "sk"},
        **{"ori": "or", "ory": "or", "mya": "my", "bur": "my", "bod": "bo", "tib": "bo"},
    }
    assert {code: scoring_language(f"{code}_Latn") for code in iso_639_1} == iso_639_1


@pytest.mark.parametrize(
    "code",
    ["zh", "zho_Hant", "cmn", "yue", "yue_Hant", "lzh", "wuu", "gan", "ja", "jpn_Jpan", "th", "tha_Thai", "lo"]
    + ["lao_Laoo", "km", "khm_Khmr", "my", "mya_Mymr", "bur", "bo", "bod_Tibt", "tib"],
)
def test_moses_finds_no_words_in_languages_written_without_spaces_whatever_the_code(code):
    """The trainer leaves the paper BLEU out of its metrics there (its Moses "tokens" would be whole clauses)."""
    assert not moses_finds_words(code)


@pytest.mark.parametrize("code", ["de", "deu_Latn", "en", "fr", "ko", "kor_Hang", "vi", "hi", "arb_Arab"])
def test_moses_finds_the_words_of_languages_written_with_spaces(code):
    assert moses_finds_words(code), "Korean, Vietnamese, Hindi: words between spaces"


@pytest.mark.skipif(importlib.util.find_spec("MeCab") is not None, reason="sacreBLEU's MeCab extra is installed")
@pytest.mark.parametrize(("code", "extra"), [("ja", "ja"), ("jpn_Jpan", "ja"), ("ko", "ko")])
def test_japanese_and_korean_without_mecab_are_refused_in_one_line(code, extra):
    """sacreBLEU scores them with MeCab (an extra this project does not install): 13a instead would be a wrong
    number, and sacreBLEU's own error spans several lines."""
    for call in (lambda: check_scorable(code), lambda: corpus_scores(["a"], ["a"], code)):
        with pytest.raises(ValueError) as error:
            call()
        message = str(error.value)
        assert "\n" not in message and f"pip install 'sacrebleu[{extra}]'" in message and repr(code) in message


# --- chrF scored a chunk of references at a time ------------------------------------------------------------------

CHRF_REFERENCES = [
    "Ein Mann läuft über die Straße.",
    "",
    "Zwei Hunde spielen im Schnee, und ein Kind sieht zu.",
    "Die Frau trägt ein rotes T-Shirt.",
    "Ein Mädchen isst einen Apfel.",
    "Kinder spielen Fußball auf einer Wiese.",
    "Der alte Mann liest eine Zeitung.",
]
CHRF_HYPOTHESES = [
    "Ein Mann geht über die Straße.",
    "Hallo.",
    "Zwei Hunde spielen im Schnee.",
    "",
    "Ein Mädchen isst einen Apfel.",
    "Kinder spielen auf einer Wiese Fußball.",
    "Ein alter Mann liest die Zeitung.",
]


@pytest.mark.parametrize("chunk_lines", [1, 2, 3, 6, 7, 8])
def test_chrf_scored_in_chunks_is_bit_identical_to_sacrebleus(chunk_lines, monkeypatch):
    monkeypatch.setattr(scoring, "_CHRF_CHUNK_LINES", chunk_lines)
    whole = CHRF()
    expected = whole.corpus_score(CHRF_HYPOTHESES, [CHRF_REFERENCES]).score
    scores = corpus_scores(CHRF_HYPOTHESES, CHRF_REFERENCES, "de")
    assert scores["chrf"] == expected and 0 < expected < 100
    assert scores["chrf_signature"] == str(whole.get_signature())


def test_chrf_holds_one_chunk_of_references_n_grams_at_a_time(monkeypatch):
    """sacreBLEU's chrF extracted every reference's character n-grams before scoring a sentence: 5.5 GB of memory
    at its peak for 100k WMT-length sentences."""
    monkeypatch.setattr(scoring, "_CHRF_CHUNK_LINES", 3)
    held_at_once = []
    cache_references = CHRF._cache_references

    def counted(self, references):
        held_at_once.append(len(references[0]))
        return cache_references(self, references)

    monkeypatch.setattr(CHRF, "_cache_references", counted)
    corpus_scores(CHRF_HYPOTHESES, CHRF_REFERENCES, "de")
    assert held_at_once == [3, 3, 1]
