"""Scoring translations as the paper did and as sacreBLEU recommends, producing them in bulk, showing attention.

Three BLEU numbers circulate for the same outputs, and they are not comparable with each other:

- **sacreBLEU** (`sacrebleu`): cased, on detokenised text, sacreBLEU's own `13a` tokenisation. The only one of
  the three that is reproducible across papers; always report its signature with it.
- **Paper BLEU** (`paper_bleu`): what Table 2 of Vaswani et al. (2017) reports, computed by tensor2tensor's
  `get_ende_bleu.sh`: Moses punctuation normalisation and tokenisation of hypothesis and reference, then every
  hyphenated compound `a-b` split into `a ##AT##-##AT## b`, then `multi-bleu.perl` on the tokens. Splitting
  compounds adds easy-to-match tokens, so this number is typically higher than sacreBLEU.
- **Lowercased tokenised BLEU** (`tokenized_bleu_lc`): `multi-bleu.perl -lc` on Moses-tokenised text, the
  number most Multi30k papers report.

`multi-bleu.perl` neither smooths nor re-tokenises, so the two tokenised scores use sacreBLEU with
`tokenize="none"` and `smooth_method="none"`, which computes the same corpus statistic.

`translate` batches by token budget and keeps line alignment; `evaluate_split` glues translation and scoring
for `scripts/evaluate.py`; `attention_maps` / `plot_attention_maps` serve `scripts/plot_attention.py`.
"""

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesPunctNormalizer, MosesTokenizer
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

MODEL_TYPE = "vaswani_transformer"
# Recorded with every evaluation, so that its numbers can be reproduced; the last two are this model's own
# generation config fields (GNMT length penalty, per-sentence limit of source length + offset).
DECODING_SETTINGS = (
    "num_beams",
    "length_penalty",
    "early_stopping",
    "max_new_tokens",
    "length_penalty_type",
    "max_length_offset",
)

# `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'` from tensor2tensor's get_ende_bleu.sh. Python's re.sub
# scans left to right without overlaps, like Perl's s///g: "a-b-c" becomes "a ##AT##-##AT## b-c" in both.
_COMPOUND = re.compile(r"(\S)-(\S)")


def split_compounds(tokenized: str) -> str:
    """Put hyphenated compounds in the "ATAT" format of GNMT / ConvS2S / tensor2tensor BLEU scripts."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", tokenized)


@lru_cache(maxsize=8)
def _moses(lang: str) -> tuple[MosesPunctNormalizer, MosesTokenizer]:
    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def moses_tokenize(sentence: str, lang: str) -> str:
    """`replace-unicode-punctuation.perl` then `tokenizer.perl -l LANG` (default escaping, no `-a`)."""
    normalizer, tokenizer = _moses(lang)
    return tokenizer.tokenize(normalizer.replace_unicode_punct(sentence), return_str=True, escape=True)


def _tokenized_bleu(hypotheses: list[str], references: list[str], *, lowercase: bool) -> tuple[float, str]:
    bleu = BLEU(tokenize="none", smooth_method="none", lowercase=lowercase)
    score = bleu.corpus_score(hypotheses, [references]).score
    return score, str(bleu.get_signature())


def corpus_scores(hypotheses: list[str], references: list[str], target_lang: str) -> dict[str, Any]:
    """sacreBLEU, the paper's tokenised BLEU with compound splitting, lowercased tokenised BLEU and chrF.

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
    paper_bleu, paper_signature = _tokenized_bleu(
        [split_compounds(h) for h in hyp_tok], [split_compounds(r) for r in ref_tok], lowercase=False
    )
    lc_bleu, lc_signature = _tokenized_bleu(hyp_tok, ref_tok, lowercase=True)

    return {
        "num_sentences": len(hypotheses),
        "sacrebleu": sacrebleu_score.score,
        "sacrebleu_signature": str(sacrebleu_metric.get_signature()),
        "sacrebleu_details": str(sacrebleu_score),
        "paper_bleu": paper_bleu,
        "paper_bleu_signature": f"moses-tok:{target_lang}|compound-split:atat|{paper_signature}",
        "tokenized_bleu_lc": lc_bleu,
        "tokenized_bleu_lc_signature": f"moses-tok:{target_lang}|{lc_signature}",
        "chrf": chrf_score.score,
        "chrf_signature": str(chrf_metric.get_signature()),
    }


def _token_budget_batches(lengths: Sequence[int], order: Sequence[int], max_tokens: int) -> Iterator[list[int]]:
    """Group indices, taken in `order`, so that a padded batch holds at most `max_tokens` source tokens.

    A sentence longer than the budget still gets a batch of its own rather than being dropped.
    """
    batch: list[int] = []
    longest = 0
    for index in order:
        longest_if_added = max(longest, lengths[index])
        if batch and longest_if_added * (len(batch) + 1) > max_tokens:
            yield batch
            batch, longest_if_added = [], lengths[index]
        batch.append(index)
        longest = longest_if_added
    if batch:
        yield batch


def translate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    *,
    max_tokens: int = 4096,
    num_beams: int | None = None,
    progress: bool = False,
    **generate_kwargs: Any,
) -> list[str]:
    """Translate `sentences` with `model.generate`, returning one line per input line, in the input order.

    Sentences are sorted by length and grouped into batches of at most `max_tokens` padded source tokens,
    which wastes far less compute on padding than fixed-size batches. Empty (or blank) lines are never sent
    to the model and come back as empty lines, so line-aligned files stay aligned. Decoding settings default
    to the model's generation config (the paper's beam 4 and length penalty); `num_beams` and
    `generate_kwargs` override them.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}.")
    outputs = [""] * len(sentences)
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    if not todo:
        return outputs
    if num_beams is not None:
        generate_kwargs["num_beams"] = num_beams

    input_ids = tokenizer([sentences[i].strip() for i in todo])["input_ids"]
    lengths = [len(ids) for ids in input_ids]
    order = sorted(range(len(todo)), key=lambda k: -lengths[k])

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), tqdm(total=len(todo), disable=not progress, unit="sent") as bar:
            for batch in _token_budget_batches(lengths, order, max_tokens):
                features = tokenizer.pad({"input_ids": [input_ids[k] for k in batch]}, return_tensors="pt")
                generated = model.generate(**features.to(model.device), **generate_kwargs)
                texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
                for k, text in zip(batch, texts, strict=True):
                    outputs[todo[k]] = text.strip()
                bar.update(len(batch))
    finally:
        model.train(was_training)
    return outputs


def _looks_like_local_path(name: str) -> bool:
    """Hub repo ids are `name` or `namespace/name`; anything else can only be meant as a directory."""
    return os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or "\\" in name


def load_model_and_tokenizer(
    name_or_path: str, *, attn_implementation: str | None = None, device: str | torch.device | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a saved or Hub checkpoint of this model, refusing anything else with a message that says why.

    Importing this module imports `modeling`, whose registration makes the installed classes load the
    checkpoint: no downloaded code is executed. `attn_implementation="eager"` is needed to return attention
    weights.
    """
    if os.path.isdir(name_or_path):
        if not os.path.isfile(os.path.join(name_or_path, "config.json")):
            raise FileNotFoundError(
                f"{name_or_path!r} has no config.json: it is not a model saved with save_pretrained."
            )
    elif _looks_like_local_path(name_or_path):
        raise FileNotFoundError(f"Model directory {name_or_path!r} does not exist.")
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except OSError as error:
        raise OSError(
            f"Could not load a model config from {name_or_path!r}: it is neither a local directory nor a "
            f"reachable Hub repo id. ({error})"
        ) from error
    if config.model_type != MODEL_TYPE:
        raise ValueError(
            f"{name_or_path!r} holds a {config.model_type!r} checkpoint, not a {MODEL_TYPE!r} one; "
            "these tools only handle this project's models (convert others first, e.g. modeling.convert)."
        )
    model_kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, **model_kwargs)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return model.to(device).eval(), tokenizer


def evaluate_split(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    split: Dataset,
    *,
    source_lang: str,
    target_lang: str,
    max_tokens: int = 4096,
    num_beams: int | None = None,
    progress: bool = False,
    **generate_kwargs: Any,
) -> tuple[dict[str, Any], list[str]]:
    """Translate one split (rows of `{"translation": {src: ..., tgt: ...}}`) and score it against references.

    Returns the metrics (the scores plus the decoding settings that produced them, so that the numbers can be
    reproduced) and the hypotheses in the split's order.
    """
    pairs = list(split["translation"])
    sources = [pair[source_lang] for pair in pairs]
    references = [pair[target_lang] for pair in pairs]
    hypotheses = translate(
        model,
        tokenizer,
        sources,
        max_tokens=max_tokens,
        num_beams=num_beams,
        progress=progress,
        **generate_kwargs,
    )
    overrides = {**generate_kwargs, **({"num_beams": num_beams} if num_beams is not None else {})}
    decoding = {name: overrides.get(name, getattr(model.generation_config, name, None)) for name in DECODING_SETTINGS}
    metrics = {
        "source_lang": source_lang,
        "target_lang": target_lang,
        "max_tokens": max_tokens,
        **decoding,
        **corpus_scores(hypotheses, references, target_lang),
    }
    return metrics, hypotheses


def metrics_filename(split: str) -> str:
    """Name of the metrics JSON of one split; the model card collects every `eval_results_*.json` it finds."""
    return f"eval_results_{split}.json"


def write_json(path: str | Path, data: dict[str, Any]) -> Path:
    """Write `data` as indented UTF-8 JSON, creating parent directories."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


# --- inspecting attention -------------------------------------------------------------------------------------

ATTENTION_KINDS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "cross-attention",
}


@dataclass
class AttentionMaps:
    """Attention weights of every layer and head for one sentence pair, shaped (layers, heads, queries, keys).

    Decoder queries are labelled with the target token each position predicts; decoder self-attention keys with
    the token each position reads (the start token, then the target shifted right).
    """

    source_tokens: list[str]
    target_tokens: list[str]
    decoder_input_tokens: list[str]
    encoder: torch.Tensor
    decoder: torch.Tensor
    cross: torch.Tensor

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(query labels, key labels) of one kind of attention."""
        return {
            "encoder": (self.source_tokens, self.source_tokens),
            "decoder": (self.target_tokens, self.decoder_input_tokens),
            "cross": (self.target_tokens, self.source_tokens),
        }[kind]


def attention_maps(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source: str, target: str
) -> AttentionMaps:
    """Run the model teacher-forced on (source, target) and collect its attention weights.

    SDPA and flash attention never materialise the weights, so the model must be loaded with
    `attn_implementation="eager"`.
    """
    if model.config._attn_implementation != "eager":
        raise ValueError(
            f"The model uses {model.config._attn_implementation!r} attention, which returns no weights: "
            "load it with attn_implementation='eager'."
        )
    source_ids = tokenizer(source, return_tensors="pt")["input_ids"].to(model.device)
    labels = tokenizer(text_target=target, return_tensors="pt")["input_ids"].to(model.device)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    with torch.inference_mode():
        outputs = model(input_ids=source_ids, decoder_input_ids=decoder_input_ids, output_attentions=True)

    def stack(per_layer: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.stack([weights[0] for weights in per_layer]).float().cpu()

    return AttentionMaps(
        source_tokens=tokenizer.convert_ids_to_tokens(source_ids[0].tolist()),
        target_tokens=tokenizer.convert_ids_to_tokens(labels[0].tolist()),
        decoder_input_tokens=tokenizer.convert_ids_to_tokens(decoder_input_ids[0].tolist()),
        encoder=stack(outputs.encoder_attentions),
        decoder=stack(outputs.decoder_attentions),
        cross=stack(outputs.cross_attentions),
    )


def _select(weights: torch.Tensor, head: int | None) -> torch.Tensor:
    heads = weights.shape[0]
    if head is None:
        return weights.mean(0)
    if not 0 <= head < heads:
        raise ValueError(f"head {head} does not exist: this attention has heads 0 to {heads - 1}.")
    return weights[head]


def plot_attention_maps(
    maps: AttentionMaps,
    output_png: str | Path,
    *,
    layer: int | None = None,
    head: int | None = None,
    kinds: Sequence[str] = tuple(ATTENTION_KINDS),
) -> Path:
    """Draw heatmaps, one row per layer (`None`: all layers) and one column per kind of attention.

    `head=None` averages the heads. Uses a bare matplotlib `Figure`, leaving the caller's pyplot backend alone.
    """
    from matplotlib.figure import Figure

    unknown = set(kinds) - set(ATTENTION_KINDS)
    if unknown or not kinds:
        raise ValueError(f"Unknown attention kinds {sorted(unknown)}; choose among {list(ATTENTION_KINDS)}.")
    num_layers = {kind: getattr(maps, kind).shape[0] for kind in kinds}
    layers = range(max(num_layers.values())) if layer is None else [layer]
    for kind, count in num_layers.items():
        if layer is not None and not 0 <= layer < count:
            raise ValueError(f"layer {layer} does not exist: the {kind} has layers 0 to {count - 1}.")

    longest = max(len(maps.source_tokens), len(maps.target_tokens))
    cell = max(3.0, 0.3 * longest)
    figure = Figure(figsize=(cell * len(kinds), cell * len(layers)), layout="constrained")
    grid = figure.subplots(len(layers), len(kinds), squeeze=False)
    head_name = "mean of heads" if head is None else f"head {head}"
    for row, layer_index in enumerate(layers):
        for column, kind in enumerate(kinds):
            axes = grid[row][column]
            if layer_index >= num_layers[kind]:
                axes.set_axis_off()
                continue
            queries, keys = maps.labels(kind)
            image = axes.imshow(_select(getattr(maps, kind)[layer_index], head).numpy(), cmap="viridis", vmin=0)
            axes.set_xticks(range(len(keys)), keys, rotation=90, fontsize=8)
            axes.set_yticks(range(len(queries)), queries, fontsize=8)
            axes.set_title(f"{ATTENTION_KINDS[kind]}, layer {layer_index}, {head_name}", fontsize=9)
            figure.colorbar(image, ax=axes, shrink=0.8)
    output_png = Path(output_png)
    figure.savefig(output_png, dpi=120)
    return output_png
