"""Benchmark 3: beam-search translation of real validation sentences.

This model, its MarianMT twin and CTranslate2 (float32 and int8, exported by `modeling.export`) translate the same
sentences in the same batches (file order, right-padded with attention masks as the tokenizer gives them) with
the same beam search (`decoding.DecodingSettings`). This model and its twin must agree token for token at float32:
the run stops if they do not. CTranslate2's agreement is reported, not asserted (its beam search ends and ranks
hypotheses slightly differently; int8 changes the numbers).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from decoding import DecodingSettings, ctranslate2_translate, load_translator
from fixtures import Checkpoint
from harness import Section, format_spread, measure_alternating, ratio
from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

REFERENCE = "this model (sdpa)"
BASELINE = "MarianMT (sdpa)"
CT2_BASELINE = "CTranslate2 float32"


def encode_batches(tokenizer: PreTrainedTokenizerBase, sources: list[str], batch_size: int) -> list[BatchEncoding]:
    return [
        tokenizer(sources[start : start + batch_size], padding=True, return_tensors="pt")
        for start in range(0, len(sources), batch_size)
    ]


def token_batches(tokenizer: PreTrainedTokenizerBase, sources: list[str], batch_size: int) -> list[list[list[str]]]:
    """The same batches as CTranslate2 takes them: token strings, unpadded, ending in </s>."""
    return [
        [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(sources[start : start + batch_size])["input_ids"]]
        for start in range(0, len(sources), batch_size)
    ]


def strip_output(ids: list[int], eos_token_id: int) -> list[int]:
    """Generated tokens without the decoder start token, the end-of-sentence token and the padding after it."""
    generated = ids[1:]
    return generated[: generated.index(eos_token_id)] if eos_token_id in generated else generated


@torch.inference_mode()
def transformers_translate(
    model: PreTrainedModel, batches: list[BatchEncoding], settings: DecodingSettings, paper_fields: bool
) -> list[list[int]]:
    outputs = []
    kwargs = settings.transformers_kwargs(paper_fields)
    for batch in batches:
        for row in model.generate(**batch, **kwargs).tolist():
            outputs.append(strip_output(row, model.config.eos_token_id))
    return outputs


def generation_contenders(
    checkpoint: Checkpoint,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    batch_size: int,
    settings: DecodingSettings,
    attentions: list[str],
    threads: int,
) -> dict[str, Callable[[], list[list[int]]]]:
    """{name: call translating every source}, each returning token ids per sentence."""
    batches = encode_batches(tokenizer, sources, batch_size)
    contenders: dict[str, Callable[[], list[list[int]]]] = {}
    for attention in attentions:
        ours, marian = checkpoint.load_ours(attention), checkpoint.load_marian(attention)
        contenders[f"this model ({attention})"] = lambda m=ours: transformers_translate(m, batches, settings, True)
        contenders[f"MarianMT ({attention})"] = lambda m=marian: transformers_translate(m, batches, settings, False)
    tokens = token_batches(tokenizer, sources, batch_size)
    for compute_type in ("float32", "int8"):
        translator = load_translator(checkpoint.ct2, compute_type, threads)
        contenders[f"CTranslate2 {compute_type}"] = lambda t=translator: [
            tokenizer.convert_tokens_to_ids(hypothesis) for hypothesis in ctranslate2_translate(t, tokens, settings)
        ]
    return contenders


def check_twins_agree(outputs: dict[str, list[list[int]]], attentions: list[str], sources: list[str]) -> None:
    """This model and its Marian twin must produce identical translations at float32."""
    for attention in attentions:
        ours, marian = outputs[f"this model ({attention})"], outputs[f"MarianMT ({attention})"]
        for index, (a, b) in enumerate(zip(ours, marian, strict=True)):
            if a != b:
                raise AssertionError(
                    f"this model and MarianMT ({attention}) disagree on sentence {index} ({sources[index]!r}): "
                    f"{a} != {b}"
                )


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> float:
    return sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(reference)


def run_generation(
    checkpoint: Checkpoint,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    batch_size: int,
    settings: DecodingSettings,
    attentions: list[str],
    repeats: int,
    threads: int,
    model_note: str,
) -> Section:
    contenders = generation_contenders(checkpoint, tokenizer, sources, batch_size, settings, attentions, threads)
    outputs = {name: call() for name, call in contenders.items()}  # also the warm-up
    check_twins_agree(outputs, attentions, sources)
    reference = outputs.get(REFERENCE, outputs[f"this model ({attentions[0]})"])
    timings = measure_alternating(contenders, repeats, warmup=0)

    sentence_rates = {name: timing.rate(len(sources)) for name, timing in timings.items()}
    baseline = sentence_rates.get(BASELINE, sentence_rates[f"MarianMT ({attentions[0]})"]).median
    section = Section(
        title=f"Beam-{settings.num_beams} generation: {len(sources)} validation sentences, batches of {batch_size}",
        headers=[
            "contender",
            "sentences/s (median)",
            "min–max",
            "output tokens/s",
            "vs MarianMT",
            "vs CTranslate2 float32",
            "same output as this model",
        ],
    )
    for name, rate in sentence_rates.items():
        output_tokens = sum(len(ids) for ids in outputs[name])
        token_rate = timings[name].rate(output_tokens).median
        section.rows.append(
            [
                name,
                rate.median,
                format_spread(rate),
                token_rate,
                ratio(rate.median, baseline),
                ratio(rate.median, sentence_rates[CT2_BASELINE].median),
                f"{100 * agreement(outputs[name], reference):.1f}%",
            ]
        )
        section.data.setdefault("sentences_per_second", {})[name] = rate.to_dict()
        section.data.setdefault("output_tokens_per_second", {})[name] = token_rate
        section.data.setdefault("agreement", {})[name] = agreement(outputs[name], reference)
    mean_length = sum(len(ids) for ids in reference) / len(reference)
    section.notes += [
        f"Model: {model_note}. Mean output length {mean_length:.1f} tokens (without </s>).",
        f"Decoding: beam {settings.num_beams}, at most {settings.max_new_tokens} new tokens, length penalty "
        f"score / length^{settings.length_penalty} (this model with length_penalty_type='transformers', "
        "max_length_offset=None), early stopping; outputs of this model and MarianMT asserted identical.",
        f"{repeats} repeats after one warm-up pass, contenders alternating; {threads} threads for torch and "
        "CTranslate2 (intra_threads); output tokens/s counts tokens without </s>.",
    ]
    return section
