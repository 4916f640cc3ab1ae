"""Scoring translations as the paper did and as sacreBLEU recommends.

Three BLEU numbers circulate for the same outputs, and they are not comparable with each other:

- **sacreBLEU** (`sacrebleu`): cased, on detokenised text, sacreBLEU's own `13a` tokenisation. The only one of
  the three that is reproducible across papers; always report its signature with it.
- **Paper BLEU** (`paper_bleu`): what Table 2 of Vaswani et al. (2017) reports, as tensor2tensor's
  `get_ende_bleu.sh` computed it in 2017: Moses tokenisation of hypothesis and reference (no punctuation
  normalisation: the script added it in 2018, and then to the hypotheses only), every hyphenated compound `a-b`
  split into `a ##AT##-##AT## b` on both sides, then `multi-bleu.perl` on the tokens. The script is English-German
  only: into other languages nothing is split, since splitting French's `peut-être` or `centre-ville` would add
  easy matches. Splitting adds easy-to-match tokens, so the German number is typically higher than sacreBLEU.
- **Lowercased tokenised BLEU** (`tokenized_bleu_lc`): `multi-bleu.perl -lc` on Moses-tokenised text, the
  number most Multi30k papers report.

`multi-bleu.perl` neither smooths nor re-tokenises, so the two tokenised scores use sacreBLEU with
`tokenize="none"` and `smooth_method="none"`, which computes the same corpus statistic.
"""

import re
from functools import lru_cache
from typing import Any

from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesPunctNormalizer, MosesTokenizer

# `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'` from tensor2tensor's get_ende_bleu.sh. Python's re.sub
# scans left to right without overlaps, like Perl's s///g: "a-b-c" becomes "a ##AT##-##AT## b-c" in both.
_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(tokenized: str) -> str:
    """Put hyphenated compounds in the "ATAT" format of GNMT / ConvS2S / tensor2tensor BLEU scripts."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


@lru_cache(maxsize=8)
def _moses(lang: str) -> tuple[MosesPunctNormalizer, MosesTokenizer]:
    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def moses_tokenize(sentence: str, lang: str, *, normalize: bool = True) -> str:
    """`replace-unicode-punctuation.perl` (unless `normalize` is False) then `tokenizer.perl -l LANG` (default
    escaping, no `-a`)."""
    normalizer, tokenizer = _moses(lang)
    text = normalizer.replace_unicode_punct(sentence) if normalize else sentence
    return tokenizer.tokenize(text, return_str=True, escape=True)


def _tokenized_bleu(hypotheses: list[str], references: list[str], *, lowercase: bool) -> tuple[float, str]:
    # force: the text is Moses-tokenised on purpose, so sacreBLEU's "forgot to detokenize?" warning would mislead.
    bleu = BLEU(tokenize="none", smooth_method="none", lowercase=lowercase, force=True)
    score = bleu.corpus_score(hypotheses, [references]).score
    return score, str(bleu.get_signature())


def corpus_scores(hypotheses: list[str], references: list[str], target_lang: str) -> dict[str, Any]:
    """sacreBLEU, the paper's tokenised BLEU (with compound splitting into German), lowercased tokenised BLEU and
    chrF.

    `hypotheses` and `references` are detokenised sentences in the same order. Scores are on the 0-100
    scale; each comes with the signature that tells how it was computed.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references: they must pair up.")
    if not hypotheses:
        raise ValueError("Nothing to score: no hypotheses were given.")

    sacrebleu_metric, chrf_metric = BLEU(), CHRF()
    sacrebleu_score = sacrebleu_metric.corpus_score(hypotheses, [references])
    chrf_score = chrf_metric.corpus_score(hypotheses, [references])

    hyp_tok = [moses_tokenize(h, target_lang) for h in hypotheses]
    ref_tok = [moses_tokenize(r, target_lang) for r in references]
    # get_ende_bleu.sh as of 2017: tokenised, not normalised; compounds split into German.
    split = split_compounds if target_lang == "de" else str
    paper_hyp = [split(moses_tokenize(h, target_lang, normalize=False)) for h in hypotheses]
    paper_ref = [split(moses_tokenize(r, target_lang, normalize=False)) for r in references]
    paper_bleu, paper_signature = _tokenized_bleu(paper_hyp, paper_ref, lowercase=False)
    steps = "unnormalized|compound-split:atat|" if target_lang == "de" else "unnormalized|"
    lc_bleu, lc_signature = _tokenized_bleu(hyp_tok, ref_tok, lowercase=True)

    return {
        "num_sentences": len(hypotheses),
        "sacrebleu": sacrebleu_score.score,
        "sacrebleu_signature": str(sacrebleu_metric.get_signature()),
        "sacrebleu_details": str(sacrebleu_score),
        "paper_bleu": paper_bleu,
        "paper_bleu_signature": f"moses-tok:{target_lang}|{steps}{paper_signature}",
        "tokenized_bleu_lc": lc_bleu,
        "tokenized_bleu_lc_signature": f"moses-tok:{target_lang}|{lc_signature}",
        "chrf": chrf_score.score,
        "chrf_signature": str(chrf_metric.get_signature()),
    }
