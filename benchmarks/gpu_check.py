"""One prepared GPU check (single H100/H200, nothing reachable, nothing downloaded), with its table printed last.

- Training: tokens/s and model FLOPs utilisation (MFU) of the paper's base and big models (shared vocabulary of
  37,000) with bf16 autocast, fused AdamW, sdpa attention, and flash attention where the package is installed;
  the MarianMT twin of base for comparison. MFU = analytic FLOPs (`harness.training_flops`) per second over the
  dense bf16 peak of the card (989 TFLOP/s for H100/H200 SXM), next to the bf16 matmul rate measured here.
- Generation: beam-4 sentences/s and tokens/s of base in bf16 at a fixed output length (min = max new tokens: the
  cost of a decoding step), this model (its static-cache beam search) vs its Marian twin, and CTranslate2
  (float16 / int8_float16) when it is installed with CUDA: the work is the same for every contender.
- Memory: torch.cuda.max_memory_allocated during each contender's first call.

    bash benchmarks/gpu_check.sh               # on the GPU machine: about 3-5 minutes
    bash benchmarks/gpu_check.sh --dry-run     # anywhere, on CPU: tiny sizes, a few steps
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
from transformers import PreTrainedModel, PreTrainedTokenizerFast
from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

from modeling import TransformerConfig, TransformerForConditionalGeneration
from modeling.convert import to_marian

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


def full_plan() -> GpuPlan:
    vocab = 37000  # the paper's shared BPE (Sec. 5.1)
    configs = {"base": TransformerConfig.base(vocab_size=vocab), "big": TransformerConfig.big(vocab_size=vocab)}
    return GpuPlan(configs, 256, 64, 5, 5, 64, 64, 8192)


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
    return GpuPlan(configs, 4, 12, 1, 2, 4, 6, 128)


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
    """Run each contender once (the warm-up) and return its peak allocated GPU memory in GiB (0 on CPU)."""
    peaks = {}
    for name, call in contenders.items():
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        call()
        peaks[name] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
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


def ctranslate2_contenders(
    ours: PreTrainedModel, inputs: dict[str, torch.Tensor], plan: GpuPlan, device: torch.device, workdir: Path
) -> dict[str, Callable[[], int]]:
    """CTranslate2 on the same device, if it is installed (with CUDA, on a GPU), exported from this model (still
    float32 on the CPU) with `modeling.export.to_ctranslate2`."""
    try:
        import ctranslate2

        from modeling.export import to_ctranslate2
    except ImportError:
        return {}
    if device.type == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        return {}
    to_ctranslate2(ours, word_level_tokenizer(ours.config.vocab_size), workdir / "ct2")
    sources = [
        [f"t{i}" if i > 2 else "</s>" for i in ids[mask.bool()].tolist()]
        for ids, mask in zip(inputs["input_ids"].cpu(), inputs["attention_mask"].cpu(), strict=True)
    ]
    compute_types = ("float16", "int8_float16") if device.type == "cuda" else ("float32", "int8")
    contenders = {}
    for compute_type in compute_types:
        translator = ctranslate2.Translator(str(workdir / "ct2"), device=device.type, compute_type=compute_type)

        def call(t=translator) -> int:
            length = plan.generation_new_tokens
            results = t.translate_batch(sources, beam_size=4, min_decoding_length=length, max_decoding_length=length)
            return sum(len(result.hypotheses[0]) for result in results)

        contenders[f"CTranslate2 {compute_type}"] = call
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


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, a few steps: checks the script")
    parser.add_argument("--time-budget", type=float, default=420, help="skip what would start after this (s)")
    parser.add_argument("--threads", type=positive_int, help="CPU threads for torch (default: torch's choice)")
    parser.add_argument("--output-json", type=Path, help="also write every number here")
    return parser.parse_args()


def main() -> None:
    arguments = parse_arguments()
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
    for key, step in steps:
        if time.perf_counter() - start > arguments.time_budget:
            skipped.append(key)
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
        + (f"; skipped for time: {', '.join(skipped)}" if skipped else ""),
        *(section.markdown() for section in sections.values()),
    ]
    if arguments.output_json:
        payload = {"device": device_name, "matmul_bf16_gflops": matmul.to_dict(), "skipped": skipped}
        payload["sections"] = {key: section.to_dict() for key, section in sections.items()}
        arguments.output_json.write_text(json.dumps(payload, indent=2, default=str))
    print("\n\n".join(lines))


if __name__ == "__main__":
    main()
