"""One prepared GPU check (single H100/H200, nothing reachable, nothing downloaded), with its table printed last.

- Training: tokens/s and model FLOPs utilisation (MFU) of the paper's base and big models (shared vocabulary of
  37,000) with bf16 autocast, fused AdamW, sdpa attention, and flash attention where the package is installed;
  the MarianMT twin of base for comparison. MFU = analytic FLOPs (`harness.training_flops`) per second over the
  dense bf16 peak of the card (989 TFLOP/s for H100/H200 SXM), next to the bf16 matmul rate measured here.
- Generation: beam-4 sentences/s and tokens/s of base in bf16 at a fixed output length (min = max new tokens: the
  cost of a decoding step), this model (its static-cache beam search) vs its Marian twin, and CTranslate2
  (float16 / int8_float16) when it is installed with CUDA: the work is the same for every contender.
- Real sentences (with `--checkpoint`, a trained checkpoint of this model with its tokenizer, and `--sources`, one
  sentence per line): the three workloads of `benchmarks/run.py` (fixed output length, sorted by length, file
  order; `generation.workloads`) in bf16, this model vs its Marian twin and CTranslate2 float16 / int8_float16
  exported from it: what a user translating a file meets, where sentences end at different lengths (a random
  model never ends one). No CUDA graphs: the static-cache loop runs eagerly.
- Memory: torch.cuda.max_memory_allocated during each contender's first call, less what was allocated before it
  (all contenders' weights, earlier contenders' optimizer states).

    bash benchmarks/gpu_check.sh               # on the GPU machine: about 3-5 minutes
    bash benchmarks/gpu_check.sh --checkpoint benchmarks/.cache/trained-.../ours --sources sources.en   # + real
    bash benchmarks/gpu_check.sh --dry-run     # anywhere, on CPU: tiny sizes, a few steps (a random checkpoint
                                               # and made-up sentences stand in for the real ones)
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import transformers
from harness import (
    Section,
    format_spread,
    measure_alternating,
    measure_matmul_peak,
    model_shape,
    positive_int,
    ratio,
    synchronize,
    training_flops,
)
from tokenizers import Tokenizer, models
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

from modeling import TransformerConfig, TransformerForConditionalGeneration
from modeling.convert import to_marian

if TYPE_CHECKING:  # imported where used: datasets and sacrebleu come with it, which a bare GPU image may lack
    import generation

BF16_PEAK_TFLOPS = 989.0  # H100 / H200 SXM, dense bf16 (the card's data sheet)
PAD, EOS = 0, 2


@dataclass(frozen=True)
class GpuPlan:
    configs: dict[str, TransformerConfig]
    batch_size: int
    length: int
    steps: int  # training steps per timed call
    repeats: int
    generation_batch: int
    generation_new_tokens: int
    matmul_size: int
    real_sentences: int  # the first ones of --sources
    real_batch: int
    real_max_new_tokens: int


def full_plan() -> GpuPlan:
    vocab = 37000  # the paper's shared BPE (Sec. 5.1)
    configs = {"base": TransformerConfig.base(vocab_size=vocab), "big": TransformerConfig.big(vocab_size=vocab)}
    return GpuPlan(configs, 256, 64, 5, 5, 64, 64, 8192, 400, 64, 64)


def dry_run_plan() -> GpuPlan:
    tiny = {
        "d_model": 64,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128,
        "vocab_size": 256,
    }
    configs = {"base": TransformerConfig.base(**tiny), "big": TransformerConfig.big(**tiny, dropout=0.3)}
    return GpuPlan(configs, 4, 12, 1, 2, 4, 6, 128, 12, 4, 6)


def attention_implementations(device: torch.device) -> list[str]:
    """sdpa always; flash attention 2 / 3 where its package is installed (CUDA only)."""
    found = ["sdpa"]
    if device.type == "cuda":
        found += [
            name
            for name, ok in (
                ("flash_attention_2", is_flash_attn_2_available),
                ("flash_attention_3", is_flash_attn_3_available),
            )
            if ok()
        ]
    return found


def random_batch(plan: GpuPlan, vocab_size: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Full-length batch (no padding, so that flash kernels apply), labels ending in </s>."""
    generator = torch.Generator().manual_seed(seed)
    shape = (plan.batch_size, plan.length)
    input_ids = torch.randint(3, vocab_size, shape, generator=generator)
    labels = torch.randint(3, vocab_size, shape, generator=generator)
    input_ids[:, -1] = labels[:, -1] = EOS
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    return {name: tensor.to(device) for name, tensor in batch.items()}


def training_contender(
    model: PreTrainedModel, batch: dict[str, torch.Tensor], steps: int, device: torch.device
) -> Callable[[], None]:
    """`steps` bf16-autocast updates with fused AdamW (fp32 master weights), synchronised at the end."""
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)

    def call() -> None:
        for _ in range(steps):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        synchronize(device)

    return call


def with_first_call_memory(contenders: dict[str, Callable[[], object]], device: torch.device) -> dict[str, float]:
    """Run each contender once (the warm-up) and return the GPU memory it allocated at its peak in GiB, above what
    was allocated before it (0 on CPU): the contenders' weights are on the GPU from the start, and the optimizer
    states of those run before stay, which would otherwise count against whichever runs last."""
    peaks = {}
    for name, call in contenders.items():
        resident = 0
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            resident = torch.cuda.memory_allocated(device)
        call()
        peaks[name] = (torch.cuda.max_memory_allocated(device) - resident) / 2**30 if device.type == "cuda" else 0.0
    return peaks


def run_training(plan: GpuPlan, name: str, device: torch.device, peak_tflops: float) -> Section:
    config = plan.configs[name]
    torch.manual_seed(0)
    ours = TransformerForConditionalGeneration(config)
    batch = random_batch(plan, config.vocab_size, device)
    contenders: dict[str, Callable[[], object]] = {}
    for attention in attention_implementations(device):
        model = copy.deepcopy(ours)
        model.set_attn_implementation(attention)
        contenders[f"{name}: this model ({attention})"] = training_contender(model, batch, plan.steps, device)
    marian = to_marian(ours)
    marian.set_attn_implementation("sdpa")
    contenders[f"{name}: MarianMT (sdpa)"] = training_contender(marian, batch, plan.steps, device)
    del ours

    memory = with_first_call_memory(contenders, device)
    timings = measure_alternating(contenders, plan.repeats, warmup=0)
    tokens = plan.steps * plan.batch_size * 2 * plan.length
    flops = plan.steps * training_flops(
        **model_shape(config), batch_size=plan.batch_size, source_length=plan.length, target_length=plan.length
    )
    section = Section(
        title=f"Training, {name} (d={config.d_model}, {config.encoder_layers}+{config.decoder_layers} layers, "
        f"V={config.vocab_size}): {plan.batch_size}×{plan.length} batches, bf16 autocast, fused AdamW",
        headers=["contender", "tokens/s (median)", "min–max", "TFLOP/s", "MFU", "vs MarianMT", "peak GiB"],
    )
    baseline = timings[f"{name}: MarianMT (sdpa)"].rate(tokens).median
    for contender, timing in timings.items():
        rate = timing.rate(tokens)
        tflops = timing.rate(flops / 1e12).median
        mfu = f"{100 * tflops / peak_tflops:.1f}%"
        section.rows.append(
            [contender, rate.median, format_spread(rate), tflops, mfu, ratio(rate.median, baseline), memory[contender]]
        )
        section.data.setdefault("tokens_per_second", {})[contender] = rate.to_dict()
        section.data.setdefault("mfu", {})[contender] = tflops / peak_tflops
    section.notes.append(
        f"{flops / plan.steps / 1e12:.2f} TFLOP per step (analytic); MFU against {peak_tflops:g} TFLOP/s; "
        f"{plan.repeats} repeats of {plan.steps} steps after one warm-up call."
    )
    return section


def word_level_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A vocabulary "t<i>" for CTranslate2's conversion of random-weight models (no BPE to train offline)."""
    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2} | {f"t{i}": i for i in range(3, vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")


def generation_inputs(plan: GpuPlan, vocab_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded sources of 10 to 40 tokens (fewer for the dry run), ending in </s>."""
    generator = torch.Generator().manual_seed(1)
    longest = min(40, plan.length)
    lengths = torch.randint(longest // 4, longest + 1, (plan.generation_batch,), generator=generator)
    input_ids = torch.randint(3, vocab_size, (plan.generation_batch, longest), generator=generator)
    positions = torch.arange(longest)[None, :]
    input_ids[positions == lengths[:, None] - 1] = EOS
    attention_mask = (positions < lengths[:, None]).long()
    return {
        "input_ids": input_ids.masked_fill(attention_mask == 0, PAD).to(device),
        "attention_mask": attention_mask.to(device),
    }


def ctranslate2_translators(
    ours: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, device: torch.device, workdir: Path
) -> dict:
    """{name: translator}: CTranslate2 (float16 / int8_float16 on a GPU) exported from this model (float32, on the
    CPU), if it is installed with CUDA."""
    try:
        import ctranslate2

        from modeling.export import to_ctranslate2
    except ImportError:
        return {}
    if device.type == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        return {}
    to_ctranslate2(ours, tokenizer, workdir / "ct2")
    compute_types = ("float16", "int8_float16") if device.type == "cuda" else ("float32", "int8")
    return {
        f"CTranslate2 {compute_type}": ctranslate2.Translator(
            str(workdir / "ct2"), device=device.type, compute_type=compute_type
        )
        for compute_type in compute_types
    }


def ctranslate2_contenders(
    ours: PreTrainedModel, inputs: dict[str, torch.Tensor], plan: GpuPlan, device: torch.device, workdir: Path
) -> dict[str, Callable[[], int]]:
    """CTranslate2 on the same device, if it is installed (with CUDA, on a GPU), on the random sources."""
    translators = ctranslate2_translators(ours, word_level_tokenizer(ours.config.vocab_size), device, workdir)
    sources = [
        [f"t{i}" if i > 2 else "</s>" for i in ids[mask.bool()].tolist()]
        for ids, mask in zip(inputs["input_ids"].cpu(), inputs["attention_mask"].cpu(), strict=True)
    ]
    contenders = {}
    for name, translator in translators.items():

        def call(t=translator) -> int:
            length = plan.generation_new_tokens
            results = t.translate_batch(sources, beam_size=4, min_decoding_length=length, max_decoding_length=length)
            return sum(len(result.hypotheses[0]) for result in results)

        contenders[name] = call
    return contenders


def run_generation(plan: GpuPlan, device: torch.device) -> Section:
    config = plan.configs["base"]
    torch.manual_seed(0)
    ours = TransformerForConditionalGeneration(config).eval()
    marian = to_marian(ours).eval()
    inputs = generation_inputs(plan, config.vocab_size, device)
    length = plan.generation_new_tokens  # fixed: min = max, the cost of a decoding step
    kwargs = {"num_beams": 4, "min_new_tokens": length, "max_new_tokens": length, "length_penalty": 0.6}
    dtype, dtype_name = (torch.bfloat16, "bf16") if device.type == "cuda" else (torch.float32, "fp32")

    def hf_contender(model: PreTrainedModel, extra: dict) -> Callable[[], int]:
        model = model.to(device, dtype)

        @torch.inference_mode()
        def call() -> int:
            output = model.generate(**inputs, **kwargs, **extra)
            synchronize(device)
            generated = output[:, 1:]
            return int((generated.ne(PAD) & generated.ne(EOS)).sum())  # as CTranslate2 counts: no </s>

        return call

    with tempfile.TemporaryDirectory() as workdir:
        # Exported before hf_contender moves this model to the device in bf16.
        ctranslate2 = ctranslate2_contenders(ours, inputs, plan, device, Path(workdir))
        contenders: dict[str, Callable[[], object]] = {
            f"this model ({dtype_name})": hf_contender(
                ours, {"length_penalty_type": "transformers", "max_length_offset": None}
            ),
            f"MarianMT ({dtype_name})": hf_contender(copy.deepcopy(marian), {}),
        }
        contenders |= ctranslate2
        memory = with_first_call_memory(contenders, device)
        timings = measure_alternating(contenders, plan.repeats, warmup=0)

    sentences = plan.generation_batch
    section = Section(
        title=f"Beam-4 generation, base, random weights: {sentences} sources of up to {min(40, plan.length)} tokens, "
        f"exactly {length} new tokens",
        headers=["contender", "sentences/s (median)", "min–max", "output tokens/s", "vs MarianMT", "peak GiB"],
    )
    baseline = next(timing for name, timing in timings.items() if name.startswith("MarianMT")).rate(sentences).median
    for name, timing in timings.items():
        rate = timing.rate(sentences)
        section.rows.append(
            [name, rate.median, format_spread(rate), timing.rate().median, ratio(rate.median, baseline), memory[name]]
        )
        section.data.setdefault("sentences_per_second", {})[name] = rate.to_dict()
    section.notes.append(f"Every hypothesis is forced to {length} new tokens: every contender decodes the same steps.")
    return section


def stand_in_checkpoint(plan: GpuPlan, directory: Path) -> tuple[Path, list[str]]:
    """For the dry run: a random checkpoint of the tiny base config with the word-level tokenizer, and made-up
    sentences of 3 to 20 words, in place of a trained checkpoint and real ones."""
    config = plan.configs["base"]
    directory = directory / "random-tiny-checkpoint"
    torch.manual_seed(0)
    TransformerForConditionalGeneration(config).save_pretrained(directory)
    word_level_tokenizer(config.vocab_size).save_pretrained(directory)
    generator = torch.Generator().manual_seed(2)
    lengths = torch.randint(3, 21, (plan.real_sentences,), generator=generator).tolist()
    words = [torch.randint(3, config.vocab_size, (n,), generator=generator).tolist() for n in lengths]
    return directory, [" ".join(f"t{i}" for i in sentence) for sentence in words]


def real_contenders(
    models: dict[str, tuple[PreTrainedModel, bool]],
    translators: dict,
    tokenizer: PreTrainedTokenizerBase,
    workload: generation.Workload,
    device: torch.device,
) -> dict[str, Callable[[], list[list[int]]]]:
    """{name: call translating the workload's batches}, each returning token ids per sentence, in batch order."""
    from decoding import ctranslate2_translate
    from generation import encode_batches, transformers_translate

    batches = [batch.to(device) for batch in encode_batches(tokenizer, workload.sources, workload.batches)]
    settings = workload.settings
    contenders = {
        name: lambda m=model, paper=paper_fields: transformers_translate(m, batches, settings, paper)
        for name, (model, paper_fields) in models.items()
    }
    tokens = [
        [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer([workload.sources[i] for i in batch])["input_ids"]]
        for batch in workload.batches
    ]
    for name, translator in translators.items():
        contenders[name] = lambda t=translator: [
            tokenizer.convert_tokens_to_ids(hypothesis) for hypothesis in ctranslate2_translate(t, tokens, settings)
        ]
    return contenders


def run_real_generation(
    plan: GpuPlan, checkpoint: Path, sources: list[str], device: torch.device, repeats: int
) -> Section:
    """`benchmarks/run.py`'s three generation workloads on the device, in bf16 (float32 on CPU)."""
    from decoding import DecodingSettings
    from generation import MARIAN, OURS, agreement, workloads

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    ours = TransformerForConditionalGeneration.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    marian = to_marian(ours).eval()
    marian.set_attn_implementation("sdpa")
    dtype, dtype_name = (torch.bfloat16, "bf16") if device.type == "cuda" else (torch.float32, "fp32")
    settings = DecodingSettings(max_new_tokens=plan.real_max_new_tokens)
    section = Section(
        title=f"Beam-4 generation of real sentences, {checkpoint} ({ours.config.d_model}-wide, "
        f"{ours.config.encoder_layers}+{ours.config.decoder_layers} layers): {len(sources)} sentences, "
        f"batches of {plan.real_batch}",
        headers=["workload", "contender", "sentences/s (median)", "min–max", "vs baseline", "same as this model"],
    )
    this_model = f"{OURS} ({dtype_name})"
    with tempfile.TemporaryDirectory() as workdir:
        translators = ctranslate2_translators(ours, tokenizer, device, Path(workdir))  # before bf16
        models = {
            this_model: (ours.to(device, dtype), True),
            f"{MARIAN} ({dtype_name})": (marian.to(device, dtype), False),
        }
        baseline = next(iter(translators), f"{MARIAN} ({dtype_name})")
        for workload in workloads(tokenizer, sources, None, plan.real_batch, settings):
            contenders = real_contenders(models, translators, tokenizer, workload, device)
            outputs = {name: call() for name, call in contenders.items()}  # also the warm-up
            timings = measure_alternating(contenders, repeats, warmup=0)
            rates = {name: timing.rate(len(workload.sources)) for name, timing in timings.items()}
            fixed = workload.settings.min_new_tokens > 0
            for name, rate in rates.items():
                same = agreement(outputs[name], outputs[this_model], prefix=fixed)
                speedup = ratio(rate.median, rates[baseline].median)
                section.rows.append(
                    [workload.name, name, rate.median, format_spread(rate), speedup, f"{100 * same:.1f}%"]
                )
                record = {"sentences_per_second": rate.to_dict(), "agreement": same}
                section.data.setdefault(workload.name, {})[name] = record
    section.data["baseline"] = baseline
    section.notes.append(
        f"Beam 4, at most {settings.max_new_tokens} new tokens, length penalty score / length^0.6 for all; "
        f"{repeats} repeats after one warm-up pass, alternating. Baseline: {baseline}. In bf16, contenders may "
        "part ways at near ties; at the fixed length CTranslate2 ranks beams differently by design (it removes </s> "
        "before its softmax, transformers after: benchmarks/README.md)."
    )
    return section


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, a few steps: checks the script")
    parser.add_argument("--time-budget", type=float, default=420, help="skip what would start after this (s)")
    parser.add_argument("--threads", type=positive_int, help="CPU threads for torch (default: torch's choice)")
    parser.add_argument("--output-json", type=Path, help="also write every number here")
    parser.add_argument("--checkpoint", type=Path, help="a trained checkpoint of this model (with its tokenizer)")
    parser.add_argument("--sources", type=Path, help="source sentences for --checkpoint, one per line")
    return parser.parse_args()


def real_generation_inputs(
    arguments: argparse.Namespace, plan: GpuPlan, stand_in_directory: Path
) -> tuple[Path, list[str]] | None:
    """The checkpoint and sentences of the real-sentence workloads: `--checkpoint` and the first sentences of
    `--sources`; for a dry run without them, a stand-in made in `stand_in_directory`; otherwise None."""
    if arguments.checkpoint is not None:
        lines = arguments.sources.read_text(encoding="utf-8").splitlines()
        return arguments.checkpoint, [line for line in lines if line.strip()][: plan.real_sentences]
    if arguments.dry_run:
        return stand_in_checkpoint(plan, stand_in_directory)
    return None


def main() -> None:
    arguments = parse_arguments()
    if (arguments.checkpoint is None) != (arguments.sources is None):
        raise SystemExit("error: --checkpoint and --sources go together (the real-sentence workloads need both)")
    start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and not arguments.dry_run else "cpu")
    plan = dry_run_plan() if arguments.dry_run else full_plan()
    transformers.logging.set_verbosity_error()
    if arguments.threads:
        torch.set_num_threads(arguments.threads)

    sections: dict[str, Section] = {}
    skipped = []
    matmul = measure_matmul_peak([plan.matmul_size], plan.repeats, device, torch.bfloat16)[plan.matmul_size]
    peak_tflops = BF16_PEAK_TFLOPS
    steps: list[tuple[str, Callable[[], Section]]] = [
        ("train_base", lambda: run_training(plan, "base", device, peak_tflops)),
        ("train_big", lambda: run_training(plan, "big", device, peak_tflops)),
        ("generate", lambda: run_generation(plan, device)),
    ]
    with tempfile.TemporaryDirectory() as stand_in:
        real = real_generation_inputs(arguments, plan, Path(stand_in))
        if real is not None:
            try:
                import generation  # noqa: F401
            except ImportError as error:
                skipped.append(f"generate_real ({error})")
            else:
                repeats = min(plan.repeats, 3)
                steps.append(("generate_real", lambda: run_real_generation(plan, *real, device, repeats)))
        for key, step in steps:
            if time.perf_counter() - start > arguments.time_budget:
                skipped.append(f"{key} (time)")
                continue
            print(f"[{time.perf_counter() - start:.0f} s] {key}", flush=True)
            sections[key] = step()
            if device.type == "cuda":
                torch.cuda.empty_cache()

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    lines = [
        f"## GPU check on {device_name}"
        + (" (--dry-run: tiny sizes, NOT a measurement)" if arguments.dry_run else ""),
        f"torch {torch.__version__}, transformers {transformers.__version__}; bf16 torch.mm {plan.matmul_size}²: "
        f"{matmul.median / 1e3:.1f} TFLOP/s measured (MFU is against {peak_tflops:g}); "
        f"attention: {', '.join(attention_implementations(device))}; total {time.perf_counter() - start:.0f} s"
        + (f"; skipped: {', '.join(skipped)}" if skipped else ""),
        *(section.markdown() for section in sections.values()),
    ]
    if arguments.output_json:
        payload = {"device": device_name, "matmul_bf16_gflops": matmul.to_dict(), "skipped": skipped}
        payload["sections"] = {key: section.to_dict() for key, section in sections.items()}
        arguments.output_json.write_text(json.dumps(payload, indent=2, default=str))
    print("\n\n".join(lines))


if __name__ == "__main__":
    main()
