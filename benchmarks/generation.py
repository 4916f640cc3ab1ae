"""Benchmark 3: beam-search translation, measured the ways users translate.

Three workloads, each at every thread count asked for (1 and 2 by default):

- **fixed length**: 16 validation sentences of 8–20 tokens, every hypothesis forced to 24 new tokens (min = max):
  the cost of a decoding step, with nothing to gain from ending sentences early;
- **sorted by length**: the validation sentences sorted by source length and cut into batches, as
  `modeling.translation.translate` batches (its token budget cut into fixed-size batches here, so that every
  contender gets the same ones);
- **file order**: the same sentences in file order, in batches of the same size.

Contenders, all on the same weights: this model (float32, and int8 through `modeling.quantization`), its exact
MarianMT twin, and CTranslate2 float32 and int8 exported by `modeling.export`. At more than one thread, on the
workloads of several batches, this model and CTranslate2 also decode that many batches side by side, one thread each
(`modeling.translation.generate_batches(workers=...)`; CTranslate2's inter_threads), the other way a user spends
the cores. All decode with the same beam search (`decoding.DecodingSettings`: transformers' length penalty form, a
fixed cap on new tokens), and this model and its twin must agree token for token at float32: the run stops if they
do not. Agreement of the others with this model is reported, and so is the sacreBLEU of each on the real workloads.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from decoding import DecodingSettings, ctranslate2_translate, load_translator
from fixtures import Checkpoint
from harness import Section, format_spread, measure_alternating, ratio
from transformers import BatchEncoding, PreTrainedModel, PreTrainedTokenizerBase

from modeling.quantization import quantize_int8
from modeling.scoring import corpus_scores
from modeling.translation import generate_batches

OURS = "this model"
MARIAN = "MarianMT"
CT2_BASELINE = "CTranslate2 float32"
FIXED_SOURCES, FIXED_SOURCE_LENGTHS, FIXED_NEW_TOKENS = 16, (8, 20), 24
SIDE_BY_SIDE = " ({} batches at once)"  # a contender decoding that many batches side by side, one thread each


def base_contender(name: str) -> str:
    """The contender a side-by-side variant is of: "this model (2 batches at once)" -> "this model"."""
    return re.sub(r" \(\d+ batches at once\)$", "", name)


@dataclass(frozen=True)
class Workload:
    """Sentences in batches (indices into `sources`), the decoding to run on them, references when they exist."""

    name: str
    sources: list[str]
    batches: list[list[int]]
    settings: DecodingSettings
    references: list[str] | None = None


def workloads(
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    references: list[str] | None,
    batch_size: int,
    settings: DecodingSettings,
) -> list[Workload]:
    """The fixed-length, sorted and file-order workloads on `sources` (see the module docstring)."""
    lengths = [len(ids) for ids in tokenizer(sources)["input_ids"]]
    low, high = FIXED_SOURCE_LENGTHS
    in_range = [i for i, length in enumerate(lengths) if low <= length <= high]
    fixed_indices = (in_range or list(range(len(sources))))[:FIXED_SOURCES]
    fixed = Workload(
        f"fixed length ({len(fixed_indices)} sources, {FIXED_NEW_TOKENS} new tokens)",
        [sources[i] for i in fixed_indices],
        [list(range(len(fixed_indices)))],
        replace(settings, min_new_tokens=FIXED_NEW_TOKENS, max_new_tokens=FIXED_NEW_TOKENS),
    )
    by_length = sorted(range(len(sources)), key=lambda i: (-lengths[i], i))
    return [
        fixed,
        Workload("sorted by length", sources, in_batches(by_length, batch_size), settings, references),
        Workload("file order", sources, in_batches(range(len(sources)), batch_size), settings, references),
    ]


def in_batches(order: Sequence[int], batch_size: int) -> list[list[int]]:
    """`order` cut into consecutive batches of `batch_size` (the last one shorter)."""
    order = list(order)
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def strip_output(ids: list[int], eos_token_id: int) -> list[int]:
    """Generated tokens without the decoder start token, the end-of-sentence token and the padding after it."""
    generated = ids[1:]
    return generated[: generated.index(eos_token_id)] if eos_token_id in generated else generated


def encode_batches(
    tokenizer: PreTrainedTokenizerBase, sources: list[str], batches: list[list[int]]
) -> list[BatchEncoding]:
    """Right-padded batches with attention masks, as the tokenizer gives them."""
    return [tokenizer([sources[i] for i in batch], padding=True, return_tensors="pt") for batch in batches]


def transformers_translate(
    model: PreTrainedModel,
    batches: list[BatchEncoding],
    settings: DecodingSettings,
    paper_fields: bool,
    batches_at_once: int = 1,
) -> list[list[int]]:
    kwargs = settings.transformers_kwargs(paper_fields)
    generated = generate_batches(model, batches, workers=batches_at_once, **kwargs)
    return [strip_output(row, model.config.eos_token_id) for output in generated for row in output.tolist()]


def alternating_translations(
    translations: Mapping[str, Callable[[], list[list[int]]]], sentences: int, repeats: int
) -> tuple[dict[str, float], bool]:
    """Sentences/s of each way of translating the same `sentences` sentences (medians, timed alternately by
    `measure_alternating`), and whether every way gave the same outputs token for token."""
    outputs: dict[str, list[list[int]]] = {}

    def translate(name: str) -> int:
        outputs[name] = translations[name]()
        return sentences

    timings = measure_alternating({name: functools.partial(translate, name) for name in translations}, repeats)
    first, *others = outputs.values()
    return {name: timing.rate().median for name, timing in timings.items()}, all(other == first for other in others)


def generation_contenders(
    checkpoint: Checkpoint,
    tokenizer: PreTrainedTokenizerBase,
    workload: Workload,
    attentions: list[str],
    threads: int,
) -> dict[str, Callable[[], list[list[int]]]]:
    """{name: call translating the workload's batches}, each returning token ids per sentence, in batch order.

    With `threads` > 1 and several batches, this model (float32 and int8) and CTranslate2 also run as `threads`
    batches side by side (named with `SIDE_BY_SIDE`)."""
    batches = encode_batches(tokenizer, workload.sources, workload.batches)
    settings = workload.settings
    side_by_side = [threads] if threads > 1 and len(batches) > 1 else []
    contenders: dict[str, Callable[[], list[list[int]]]] = {}
    for attention in attentions:
        suffix = "" if attention == "sdpa" else f" ({attention})"
        ours, marian = checkpoint.load_ours(attention), checkpoint.load_marian(attention)
        contenders[OURS + suffix] = lambda m=ours: transformers_translate(m, batches, settings, True)
        if attention == "sdpa":
            int8 = quantize_int8(ours)
            contenders[f"{OURS} int8"] = lambda m=int8: transformers_translate(m, batches, settings, True)
            for n in side_by_side:
                for name, model in ((OURS, ours), (f"{OURS} int8", int8)):
                    contenders[name + SIDE_BY_SIDE.format(n)] = lambda m=model, n=n: transformers_translate(
                        m, batches, settings, True, batches_at_once=n
                    )
        contenders[MARIAN + suffix] = lambda m=marian: transformers_translate(m, batches, settings, False)
    tokens = [
        [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer([workload.sources[i] for i in batch])["input_ids"]]
        for batch in workload.batches
    ]
    for compute_type in ("float32", "int8"):
        for n in [1, *side_by_side]:
            translator = load_translator(checkpoint.ct2, compute_type, threads, batches_at_once=n)
            name = f"CTranslate2 {compute_type}" + (SIDE_BY_SIDE.format(n) if n > 1 else "")
            contenders[name] = lambda t=translator: [
                tokenizer.convert_tokens_to_ids(hypothesis)
                for hypothesis in ctranslate2_translate(t, tokens, settings)
            ]
    return contenders


def check_twins_agree(outputs: dict[str, list[list[int]]], workload: Workload) -> None:
    """This model and its Marian twin must produce identical translations at float32."""
    order = [i for batch in workload.batches for i in batch]
    for name in outputs:
        if not name.startswith(MARIAN):
            continue
        ours, marian = outputs[OURS + name.removeprefix(MARIAN)], outputs[name]
        for position, (a, b) in enumerate(zip(ours, marian, strict=True)):
            if a != b:
                source = workload.sources[order[position]]
                raise AssertionError(f"this model and {name} disagree on {source!r} ({workload.name}): {a} != {b}")


def agreement(outputs: list[list[int]], reference: list[list[int]], prefix: bool = False) -> float:
    """Share of sentences translated identically; with `prefix`, identical up to the shorter of the two (at a fixed
    length, CTranslate2 counts the forced end-of-sentence among its max_decoding_length tokens, transformers not)."""
    pairs = zip(outputs, reference, strict=True)
    same = (a[: len(b)] == b[: len(a)] if prefix else a == b for a, b in pairs)
    return sum(same) / len(reference)


def sacrebleu_of(
    tokenizer: PreTrainedTokenizerBase, outputs: list[list[int]], workload: Workload, target_lang: str
) -> float | None:
    if workload.references is None:
        return None
    order = [i for batch in workload.batches for i in batch]
    hypotheses = [text.strip() for text in tokenizer.batch_decode(outputs, skip_special_tokens=True)]
    references = [workload.references[i] for i in order]
    return corpus_scores(hypotheses, references, target_lang)["sacrebleu"]


def run_generation(
    checkpoint: Checkpoint,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    references: list[str] | None,
    batch_size: int,
    settings: DecodingSettings,
    attentions: list[str],
    repeats: int,
    thread_counts: list[int],
    model_note: str,
    target_lang: str = "de",
) -> list[Section]:
    """The generation table (every workload × thread count × contender) and the table at each contender's best
    thread count."""
    main = Section(
        title=f"Beam-{settings.num_beams} generation: {len(sources)} validation sentences, batches of {batch_size}",
        headers=[
            "workload",
            "threads",
            "contender",
            "sentences/s (median)",
            "min–max",
            "vs CTranslate2 float32",
            "sacreBLEU",
            "same output as this model",
        ],
    )
    best = Section(
        title="The same, each contender at its best thread count (one batch at a time, or several side by side)",
        headers=["workload", "contender", "threads", "sentences/s", f"vs {CT2_BASELINE} at its best"],
    )
    threads_before = torch.get_num_threads()
    for workload in workloads(tokenizer, sources, references, batch_size, settings):
        rates_by_threads: dict[int, dict[str, float]] = {}
        for threads in thread_counts:
            torch.set_num_threads(threads)
            contenders = generation_contenders(checkpoint, tokenizer, workload, attentions, threads)
            outputs = {name: call() for name, call in contenders.items()}  # also the warm-up
            check_twins_agree(outputs, workload)
            timings = measure_alternating(contenders, repeats, warmup=0)
            rates = {name: timing.rate(len(workload.sources)) for name, timing in timings.items()}
            fixed = workload.settings.min_new_tokens > 0
            rates_by_threads[threads] = {name: rate.median for name, rate in rates.items()}
            for name, rate in rates.items():
                bleu = sacrebleu_of(tokenizer, outputs[name], workload, target_lang)
                main.rows.append(
                    [
                        workload.name,
                        threads,
                        name,
                        rate.median,
                        format_spread(rate),
                        ratio(rate.median, rates[CT2_BASELINE].median),
                        "–" if bleu is None else f"{bleu:.2f}",
                        f"{100 * agreement(outputs[name], outputs[OURS], fixed):.1f}%",
                    ]
                )
                record = main.data.setdefault(workload.name, {}).setdefault(str(threads), {})
                record[name] = {
                    "sentences_per_second": rate.to_dict(),
                    "sacrebleu": bleu,
                    "agreement": agreement(outputs[name], outputs[OURS], fixed),
                }
        best_of: dict[str, tuple[float, str]] = {}  # base contender: (sentences/s, how)
        for threads, rates in rates_by_threads.items():
            for name, rate in rates.items():
                base = base_contender(name)
                how = f"{threads}{name.removeprefix(base)}"
                if base not in best_of or rate > best_of[base][0]:
                    best_of[base] = (rate, how)
        for base, (rate, how) in best_of.items():
            best.rows.append([workload.name, base, how, rate, ratio(rate, best_of[CT2_BASELINE][0])])
    torch.set_num_threads(threads_before)
    main.notes += [
        f"Model: {model_note}.",
        f"Decoding: beam {settings.num_beams}, at most {settings.max_new_tokens} new tokens (fixed length: exactly "
        f"{FIXED_NEW_TOKENS}), length penalty score / length^{settings.length_penalty} (this model with "
        "length_penalty_type='transformers', max_length_offset=None), early stopping; outputs of this model and "
        "MarianMT asserted identical.",
        "At the fixed length CTranslate2 removes </s> before its softmax (transformers masks it after), so its "
        "beams rank differently and few outputs agree; the steps decoded are the same.",
        f"{repeats} repeats after one warm-up pass, contenders alternating; torch and CTranslate2 get the same "
        "number of threads: on one batch at a time (CTranslate2's intra_threads), or one each for as many batches "
        'side by side ("N batches at once": generate_batches(workers=N), inter_threads=N). sacreBLEU against '
        "the validation references, on the same sentences.",
    ]
    return [main, best]
