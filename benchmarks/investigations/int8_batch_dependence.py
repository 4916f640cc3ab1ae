"""Whether an int8 translation depends on the sentences batched with it, and what a per-row int8 path would cost.

    python benchmarks/investigations/int8_batch_dependence.py --threads 1 --sentences 400 --alone 150

torch's dynamic int8 layers (`modeling.quantization.quantize_int8`) quantise each layer's input with one scale for
the whole batch; CTranslate2's int8 takes one per row. On the cached trained checkpoint this counts, of the first
`--alone` validation sentences, how many translate differently alone than within `modeling.translation.translate`'s
sorted batches: this model in float32, with `quantize_int8`, with a per-row int8 path (int8 products by
`torch._int_mm`, each row's input quantised with its own scale; written here, not in `modeling/`), and CTranslate2
float32 and int8 (beam 4, length penalty 0.6). Then it times the three torch paths on `--sentences` sentences in
`translate()`'s batches (alternated, medians of `--repeats`) and gives each one's sacreBLEU against the references.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: fixtures, harness, ...

import sacrebleu
from decoding import DecodingSettings, ctranslate2_translate, load_translator
from fixtures import add_decoding_comparison_arguments, decoding_comparison_setup
from generation import in_batches
from harness import measure_alternating, positive_int

from modeling.quantization import quantize_int8
from modeling.translation import translate


class RowwiseInt8Linear(nn.Module):
    """`nn.Linear` with per-channel int8 weights and each input row quantised with its own scale: a row's output
    depends on that row alone (the int32 products are exact)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127  # (out,)
        self.register_buffer("weight_t", torch.round(weight / scale[:, None]).to(torch.int8).t().contiguous())
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.reshape(-1, hidden_states.shape[-1])  # (N, in)
        row_scale = rows.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).div_(127)  # (N, 1)
        products = torch._int_mm(torch.round(rows / row_scale).to(torch.int8), self.weight_t)  # (N, out) int32
        output = products.float().mul_(row_scale).mul_(self.weight_scale)
        if self.bias is not None:
            output.add_(self.bias)
        return output.reshape(*hidden_states.shape[:-1], output.shape[-1])


def rowwise_int8(model: nn.Module) -> nn.Module:
    quantized = copy.deepcopy(model).float().eval()
    for module in list(quantized.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, RowwiseInt8Linear(child))
    return quantized


def ctranslate2_translations(directory: Path, tokenizer, sources: list[str], compute_type: str, alone: bool):
    """CTranslate2's translations of `sources`, one at a time or in batches of 32 sorted by length, in order."""
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(source).input_ids) for source in sources]
    by_length = sorted(range(len(tokens)), key=lambda i: (-len(tokens[i]), i))
    batches = in_batches(by_length, 1 if alone else 32)
    translator = load_translator(directory, compute_type, threads=1)
    settings = DecodingSettings(max_new_tokens=256)
    outputs = ctranslate2_translate(translator, [[tokens[i] for i in batch] for batch in batches], settings)
    translations = [None] * len(tokens)
    for index, output in zip((i for batch in batches for i in batch), outputs, strict=True):
        translations[index] = output
    return translations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decoding_comparison_arguments(parser, sentences=400)
    parser.add_argument("--alone", type=positive_int, default=150, help="sentences also translated one at a time")
    arguments = parser.parse_args()

    corpus, checkpoint = decoding_comparison_setup(arguments)
    model = checkpoint.load_ours(arguments.attention)
    tokenizer = corpus.tokenizer
    paths = {"float32": model, "int8 (quantize_int8)": quantize_int8(model), "int8 per row": rowwise_int8(model)}
    sample = corpus.validation_sources[: arguments.alone]
    with torch.inference_mode():
        for name, path in paths.items():
            batched = translate(path, tokenizer, sample)
            alone = [translate(path, tokenizer, [sentence])[0] for sentence in sample]
            differing = sum(a != b for a, b in zip(batched, alone, strict=True))
            print(f"{name}: {differing} of {len(sample)} sentences differ alone and in batches")
    if checkpoint.ct2.is_dir():
        for compute_type in ("float32", "int8"):
            batched, alone = (
                ctranslate2_translations(checkpoint.ct2, tokenizer, sample, compute_type, one) for one in (False, True)
            )
            differing = sum(a != b for a, b in zip(batched, alone, strict=True))
            print(f"CTranslate2 {compute_type}: {differing} of {len(sample)} sentences differ alone and in batches")

    sources = corpus.validation_sources[: arguments.sentences]
    references = corpus.validation_references[: arguments.sentences]
    outputs: dict[str, list[str]] = {}

    def run(name: str) -> int:
        with torch.inference_mode():
            outputs[name] = translate(paths[name], tokenizer, sources)
        return len(sources)

    timings = measure_alternating({name: (lambda name=name: run(name)) for name in paths}, arguments.repeats)
    for name, timing in timings.items():
        bleu = sacrebleu.corpus_bleu(outputs[name], [references]).score
        print(f"{name}: {timing.rate().median:.1f} sentences/s, sacreBLEU {bleu:.2f} ({len(sources)} sentences)")


if __name__ == "__main__":
    main()
