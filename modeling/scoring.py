"""Scoring translations as the paper did and as sacreBLEU recommends.

Three BLEU numbers circulate for the same outputs, and they are not comparable with each other:

- **sacreBLEU** (`sacrebleu`): cased, on detokenised text, with the tokenisation sacreBLEU itself chooses for the
  target language: `zh` into Chinese, `ja-mecab` into Japanese and `ko-mecab` into Korean (both need an extra
  package, `sacrebleu[ja]` / `sacrebleu[ko]`, that this project does not install), `13a` otherwise. The only one
  of the three that is reproducible across papers; always report its signature with it.
- **Paper BLEU** (`paper_bleu`): what Table 2 of Vaswani et al. (2017) reports, as tensor2tensor's
  `get_ende_bleu.sh` computed it in 2017: Moses tokenisation of hypothesis and reference (no punctuation
  normalisation: the script added it in 2018, and then to the hypotheses only), every hyphenated compound `a-b`
  split into `a ##AT##-##AT## b` on both sides, then `multi-bleu.perl` on the tokens. The script is English-German
  only: into other languages nothing is split, since splitting French's `peut-être` or `centre-ville` would add
  easy matches. Splitting adds easy-to-match tokens, so the German number is typically higher than sacreBLEU.
- **Lowercased tokenised BLEU** (`tokenized_bleu_lc`): `multi-bleu.perl -lc` on Moses-tokenised text, the
  number most Multi30k papers report. The script reads its files as bytes, so its `-lc` lowercases A-Z only:
  "Über" and "über", "À" and "à" stay different words, as they are here (signature `case:lc-ascii`).

`multi-bleu.perl` neither smooths nor re-tokenises, so the two tokenised scores use sacreBLEU with
`tokenize="none"` and `smooth_method="none"`, which computes the same corpus statistic. Into a language written
without spaces between words (Chinese, Japanese, Thai, ...) Moses splits off punctuation only, so its "tokens" are
whole clauses and the two tokenised scores would count clauses matched verbatim: they are not computed there
(None, and a signature that says why).

Language codes are read as the scorers know them (`scoring_language`): "zh-CN", "zh_Hans", "ZH", "zho_Hans" and
"cmn" are all Chinese, "deu_Latn" is German (compounds split), and so on.
"""

import logging
import re
import string
from functools import lru_cache
from typing import Any

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.chrf import CHRFScore
from sacremoses import MosesPunctNormalizer, MosesTokenizer

logger = logging.getLogger(__name__)

# ISO 639-2 and 639-3 codes (FLORES-200 and NLLB name languages so: "zho_Hans", "deu_Latn") of the languages that
# sacreBLEU or Moses score their own way, by the ISO 639-1 code those tools know them by; under another code they
# would be scored silently as an unknown language (13a and Moses' generic rules, German without compound splitting).
_ISO_639_1 = {
    **dict.fromkeys(("zho", "chi", "cmn"), "zh"),
    "jpn": "ja",
    "kor": "ko",
    **dict.fromkeys(("deu", "ger"), "de"),
    "eng": "en",
    **dict.fromkeys(("fra", "fre"), "fr"),
    "ita": "it",
    "fin": "fi",
    "swe": "sv",
    **dict.fromkeys(("ces", "cze"), "cs"),
    **dict.fromkeys(("ell", "gre"), "el"),
    "spa": "es",
    "est": "et",
    "gle": "ga",
    "hun": "hu",
    **dict.fromkeys(("isl", "ice"), "is"),
    "lit": "lt",
    "lav": "lv",
    **dict.fromkeys(("nld", "dut"), "nl"),
    "pol": "pl",
    "por": "pt",
    **dict.fromkeys(("ron", "rum"), "ro"),
    "rus": "ru",
    **dict.fromkeys(("slk", "slo"), "sk"),
    "slv": "sl",
    "cat": "ca",
    "som": "so",
    "asm": "as",
    "ben": "bn",
    "guj": "gu",
    "hin": "hi",
    "kan": "kn",
    "mal": "ml",
    "mar": "mr",
    **dict.fromkeys(("ori", "ory"), "or"),
    "pan": "pa",
    "tam": "ta",
    "tel": "te",
    "tha": "th",
    "lao": "lo",
    "khm": "km",
    **dict.fromkeys(("mya", "bur"), "my"),
    **dict.fromkeys(("bod", "tib"), "bo"),
}
# Languages written without spaces between words (ISO 639-1, else 639-3), in which Moses tokenisation finds no
# words: the Chinese varieties written in Han characters (Cantonese, Classical, Wu, Gan) among them.
_UNSEGMENTED_LANGUAGES = frozenset({"zh", "yue", "lzh", "wuu", "gan", "ja", "th", "lo", "km", "my", "bo"})


def scoring_language(code: str) -> str:
    """The language of `code` as sacreBLEU and Moses know it: its primary subtag, lowercased ("zh-CN", "zh_Hans",
    "ZH" → "zh"), a 639-2/3 code of a language they score their own way as its 639-1 code ("zho_Hans", "cmn" →
    "zh"). Other codes are returned lowercased, for the language-independent rules."""
    primary = re.split(r"[-_]", code.strip(), maxsplit=1)[0].lower()
    return _ISO_639_1.get(primary, primary)


def moses_finds_words(target_lang: str) -> bool:
    """Whether Moses tokenisation finds the words of `target_lang`: not where it is written without spaces between
    words, into which the two tokenised scores are not computed."""
    return scoring_language(target_lang) not in _UNSEGMENTED_LANGUAGES


def check_scorable(target_lang: str) -> None:
    """Refuse in one line a target language whose sacreBLEU tokeniser needs a package that is not installed
    (MeCab, into Japanese and Korean), before anything is translated: sacreBLEU's own error comes after, in
    several lines, and 13a in its place would count whole clauses as words."""
    _sacrebleu_metric(target_lang)


def _sacrebleu_metric(target_lang: str) -> BLEU:
    language = scoring_language(target_lang)
    try:
        return BLEU(trg_lang=language)
    except (ImportError, RuntimeError) as error:  # sacreBLEU's own message spans several lines
        tokenizer = BLEU._TOKENIZER_MAP.get(language, BLEU.TOKENIZER_DEFAULT)
        raise ValueError(
            f"BLEU into {target_lang!r} uses sacreBLEU's {tokenizer!r} tokeniser, which needs packages that are not "
            f"installed: pip install 'sacrebleu[{language}]'"
        ) from error


# `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'` from tensor2tensor's get_ende_bleu.sh. Python's re.sub
# scans left to right without overlaps, like Perl's s///g: "a-b-c" becomes "a ##AT##-##AT## b-c" in both. Perl
# reads the file as bytes, so the pattern runs on UTF-8 bytes here too: in "T-Ö-Shirt" the first match takes one of
# the two bytes of "Ö" and the second hyphen is split as well.
_COMPOUND = re.compile(rb"(\S)-(\S)")


def split_compounds(tokenized: str) -> str:
    """Put hyphenated compounds in the "ATAT" format of GNMT / ConvS2S / tensor2tensor BLEU scripts."""
    utf8 = tokenized.encode(errors="surrogatepass")  # a lone surrogate (JSON's "\ud800") goes through as before
    return _COMPOUND.sub(rb"\1 ##AT##-##AT## \2", utf8).decode(errors="surrogatepass")


# Non-breaking prefixes that Moses added after 2017 and sacremoses ships: tokenizer.perl of 2017 split their full
# stop like any word's ("500 Rs." -> "500 Rs .").
_PREFIXES_ADDED_AFTER_2017 = {"en": {"Rs"}}  # mosesdecoder 4da86c36, Nov 2019: rupees


@lru_cache(maxsize=8)
def _moses(lang: str) -> tuple[MosesPunctNormalizer, MosesTokenizer]:
    tokenizer = MosesTokenizer(lang=lang)
    added = _PREFIXES_ADDED_AFTER_2017.get(lang, set())
    tokenizer.NONBREAKING_PREFIXES = [prefix for prefix in tokenizer.NONBREAKING_PREFIXES if prefix not in added]
    return MosesPunctNormalizer(lang=lang), tokenizer


def moses_tokenize(sentence: str, lang: str, *, normalize: bool = True) -> str:
    """`replace-unicode-punctuation.perl` (unless `normalize` is False) then `tokenizer.perl -l LANG` (default
    escaping, no `-a`)."""
    normalizer, tokenizer = _moses(lang)
    text = normalizer.replace_unicode_punct(sentence) if normalize else sentence
    return tokenizer.tokenize(text, return_str=True, escape=True)


# multi-bleu.perl's `lc` acts on undecoded UTF-8 bytes, which Perl lowercases in the ASCII range only; sacreBLEU's
# `lowercase` is Unicode's, and would match "Über" with "über" where the script does not.
_ASCII_LOWERCASE = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _tokenized_bleu(hypotheses: list[str], references: list[str], *, lowercase: bool) -> tuple[float, str]:
    if lowercase:
        hypotheses = [h.translate(_ASCII_LOWERCASE) for h in hypotheses]
        references = [r.translate(_ASCII_LOWERCASE) for r in references]
    # force: the text is Moses-tokenised on purpose, so sacreBLEU's "forgot to detokenize?" warning would mislead.
    bleu = BLEU(tokenize="none", smooth_method="none", force=True)
    score = bleu.corpus_score(hypotheses, [references]).score
    signature = bleu.get_signature()
    if lowercase:
        signature.info["case"] = "lc-ascii"
    return score, str(signature)


def corpus_scores(hypotheses: list[str], references: list[str], target_lang: str) -> dict[str, Any]:
    """sacreBLEU, the paper's tokenised BLEU (with compound splitting into German), lowercased tokenised BLEU and
    chrF.

    `hypotheses` and `references` are detokenised sentences in the same order. Scores are on the 0-100
    scale; each comes with the signature that tells how it was computed. Into a language written without spaces
    between words the two tokenised scores are None, their signatures saying why.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references: they must pair up.")
    if not hypotheses:
        raise ValueError("Nothing to score: no hypotheses were given.")

    language = scoring_language(target_lang)
    sacrebleu_metric, chrf_metric = _sacrebleu_metric(target_lang), CHRF()
    sacrebleu_score = sacrebleu_metric.corpus_score(hypotheses, [references])
    chrf_score = _chunked_corpus_score(chrf_metric, hypotheses, references)
    scores = {
        "num_sentences": len(hypotheses),
        "sacrebleu": sacrebleu_score.score,
        "sacrebleu_signature": str(sacrebleu_metric.get_signature()),
        "sacrebleu_details": str(sacrebleu_score),
    }
    if not moses_finds_words(language):
        if sacrebleu_metric.tokenizer_signature == BLEU.TOKENIZER_DEFAULT:
            logger.warning(
                "sacreBLEU has no tokeniser for %r, written without spaces between words: its 13a BLEU counts whole "
                "clauses as words; chrF is the score to compare",
                target_lang,
            )
        refused = f"not computed: Moses tokenisation finds no words in {language} (no spaces between words)"
        scores |= {key: None for key in ("paper_bleu", "tokenized_bleu_lc")}
        scores |= {f"{key}_signature": refused for key in ("paper_bleu", "tokenized_bleu_lc")}
    else:
        scores |= _moses_scores(hypotheses, references, language)
    return scores | {"chrf": chrf_score.score, "chrf_signature": str(chrf_metric.get_signature())}


# References whose chrF n-grams are held at once: sacreBLEU's `corpus_score` extracts every reference's character
# n-grams before scoring any sentence, about 50 KB a sentence of WMT length (5 GB for 100k sentences).
_CHRF_CHUNK_LINES = 1000


def _chunked_corpus_score(metric: CHRF, hypotheses: list[str], references: list[str]) -> CHRFScore:
    """`metric.corpus_score(hypotheses, [references])`, bit for bit, `_CHRF_CHUNK_LINES` sentences' references at
    a time: chrF's corpus statistics are the sums of its sentences' integer statistics, and these are sacreBLEU's
    own steps of `corpus_score` (`Metric._extract_corpus_statistics` then `_aggregate_and_compute`, which its paired
    significance tests call too; private, unchanged since sacreBLEU 2.0). chrF alone: sacreBLEU's BLEU counts its
    "forgot to detokenize?" lines per call, which chunks would change."""
    statistics = []
    for start in range(0, len(hypotheses), _CHRF_CHUNK_LINES):
        end = start + _CHRF_CHUNK_LINES
        statistics += metric._extract_corpus_statistics(hypotheses[start:end], [references[start:end]])
    return metric._aggregate_and_compute(statistics)


def _moses_scores(hypotheses: list[str], references: list[str], language: str) -> dict[str, Any]:
    """The paper's tokenised BLEU and lowercased tokenised BLEU, with their signatures."""
    hyp_tok = [moses_tokenize(h, language) for h in hypotheses]
    ref_tok = [moses_tokenize(r, language) for r in references]
    # get_ende_bleu.sh as of 2017: tokenised, not normalised; compounds split into German.
    split = split_compounds if language == "de" else str
    paper_hyp = [split(moses_tokenize(h, language, normalize=False)) for h in hypotheses]
    paper_ref = [split(moses_tokenize(r, language, normalize=False)) for r in references]
    paper_bleu, paper_signature = _tokenized_bleu(paper_hyp, paper_ref, lowercase=False)
    steps = "unnormalized|compound-split:atat|" if language == "de" else "unnormalized|"
    lc_bleu, lc_signature = _tokenized_bleu(hyp_tok, ref_tok, lowercase=True)
    return {
        "paper_bleu": paper_bleu,
        "paper_bleu_signature": f"moses-tok:{language}|{steps}{paper_signature}",
        "tokenized_bleu_lc": lc_bleu,
        "tokenized_bleu_lc_signature": f"moses-tok:{language}|{lc_signature}",
    }
