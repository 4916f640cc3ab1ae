"""Measurement helpers shared by every benchmark: alternating timed repeats, robust statistics, the fp32
matrix-multiply peak, analytic FLOP counts, markdown tables and profiler summaries.

Nothing here knows about a particular model: the benchmarks build contenders (zero-argument callables that do
one unit of work) and hand them to `measure_alternating`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch.utils import flop_counter


@dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements of one quantity (seconds, or a rate derived from them)."""

    median: float
    minimum: float
    maximum: float
    q1: float
    q3: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        if not samples:
            raise ValueError("no measurements to summarise: time at least one repeat")
        values = sorted(samples)
        if len(values) >= 2:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        else:
            q1 = q3 = values[0]
        return cls(statistics.median(values), values[0], values[-1], q1, q3, tuple(samples))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of each repeat of one contender, and the work each repeat reported (or None)."""

    seconds: tuple[float, ...]
    work: tuple[float | None, ...]

    @property
    def stats(self) -> Stats:
        return Stats.of(self.seconds)

    def rate(self, work: float | None = None) -> Stats:
        """Work per second of each repeat: `work` if given, else what the contender returned for that repeat.
        A slow repeat becomes a low rate, so min and max swap roles against `stats`."""
        amounts = [work if work is not None else done for done in self.work]
        if any(amount is None for amount in amounts):
            raise ValueError("this contender reports no work: pass it")
        return Stats.of([amount / seconds for amount, seconds in zip(amounts, self.seconds, strict=True)])


def positive_int(text: str) -> int:
    """argparse type for counts that must be at least 1 (repeats, steps, threads, sentences). The scripts' own is
    `modeling.cli.positive_int`; this file imports no `modeling` at its top, because `train_peers.py`'s workers
    import it under a peer's interpreter, where the project's dependencies are absent."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def measure_alternating(
    contenders: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, Timing]:
    """Time each contender's call, interleaved: repeat r runs every contender once, in an order rotated by r, so
    that a noisy neighbour or thermal drift hits all contenders alike instead of whichever ran last. A contender
    may return the work it did (a number of tokens, say) when that varies between calls; other results are
    dropped."""
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    work: dict[str, list[float | None]] = {name: [] for name in names}
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            done = contenders[name]()
            seconds[name].append(time.perf_counter() - start)
            work[name].append(float(done) if isinstance(done, int | float) else None)
    return {name: Timing(tuple(seconds[name]), tuple(work[name])) for name in names}


def synchronize(device: torch.device | str) -> None:
    """Wait for queued GPU work, so that wall-clock timings cover it; a no-op on CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def matmul_contender(
    size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, kernel: str = "torch.mm"
) -> tuple[Callable[[], None], float]:
    """A contender doing one `size` × `size` matrix product, and its FLOP count (2 size³): `torch.mm` (MKL on a
    CPU), or `"oneDNN"`, the kernel this model's linear layers take on x86 CPUs not made by Intel
    (`matmul_transposed`).

    Run inside `measure_alternating` with the models, it gives the peak that the models could reach under the same
    load, in the same process and with the same number of threads."""
    # Imported here: `train_peers.py` imports this module in the peers' environments, which lack this project.
    from modeling.onednn_transformer import matmul_transposed

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device, dtype)
    b = torch.randn(size, size, generator=generator).to(device, dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)

    def call() -> None:
        if kernel == "oneDNN":
            matmul_transposed(a, b)
        else:
            torch.mm(a, b, out=out)
        synchronize(device)

    return call, 2.0 * size**3


def matmul_peak_name(size: int, kernel: str = "torch.mm") -> str:
    return f"fp32 {kernel} {size}×{size}"


def add_matmul_peak_contenders(contenders: dict[str, Callable[[], object]], sizes: Sequence[int]) -> dict[str, float]:
    """Add a `matmul_contender` per size and kernel (oneDNN where this CPU takes it) to `contenders`, to be timed in
    the same alternating loop as the models; returns each one's FLOP count by name, for `peak_gflops`."""
    from modeling.onednn_transformer import takes_onednn  # here, as in `matmul_contender`

    float32 = torch.ones(1)
    kernels = ["torch.mm"] + (["oneDNN"] if takes_onednn(float32, float32) else [])
    flops = {}
    for size in sizes:
        for kernel in kernels:
            name = matmul_peak_name(size, kernel)
            contenders[name], flops[name] = matmul_contender(size, kernel=kernel)
    return flops


def peak_gflops(timings: Mapping[str, Timing], matmul_flops: Mapping[str, float]) -> float:
    """The best median GFLOP/s of the matmul contenders that `add_matmul_peak_contenders` added."""
    return max(timings[name].rate(flops / 1e9).median for name, flops in matmul_flops.items())


def measure_matmul_peak(
    sizes: Sequence[int], repeats: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> dict[int, Stats]:
    """GFLOP/s of torch.mm on square matrices of each size, over `repeats` after one warm-up."""
    results = {}
    for size in sizes:
        call, flops = matmul_contender(size, device, dtype)
        results[size] = measure_alternating({"mm": call}, repeats)["mm"].rate(flops / 1e9)
    return results


# --------------------------------------------------------------------------------------------------------------
# Analytic FLOP counts
# --------------------------------------------------------------------------------------------------------------


# Off Intel x86 CPUs the model's linear layers run oneDNN's kernel (`onednn_transformer.linear`), whose FLOPs torch's
# counter does not know: counted as the product it computes, input (..., K) times weight (N, K) transposed.
ONEDNN_LINEAR = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
if ONEDNN_LINEAR is not None and ONEDNN_LINEAR not in flop_counter.flop_registry:

    @flop_counter.register_flop_formula(ONEDNN_LINEAR)
    def onednn_linear_flops(input_shape, weight_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * math.prod(input_shape[:-1]) * input_shape[-1] * weight_shape[0]


def forward_flops(
    *,
    d_model: int,
    encoder_layers: int,
    decoder_layers: int,
    encoder_ffn_dim: int,
    decoder_ffn_dim: int,
    vocab_size: int,
    batch_size: int,
    source_length: int,
    target_length: int,
) -> int:
    """FLOPs (2 per multiply-add) of the matrix products of one encoder-decoder forward pass on a padded batch.

    Per encoder layer and source token: Q, K, V, O projections 4 d², feed-forward 2 d d_ff, attention scores and
    weighted values 2 S d. Per decoder layer and target token: self-attention projections 4 d², cross-attention
    Q and O 2 d², feed-forward 2 d d_ff, self-attention 2 T d (the full T × T product, as eager attention and
    sdpa's math kernel compute it, not the causal half), cross-attention 2 S d; per decoder layer and source
    token: cross-attention K and V 2 d². Output projection d V per target token. Embedding lookups, LayerNorm,
    softmax, biases and the loss are not matrix products and are left out (a few % at these sizes).
    Padded positions count: they are computed.
    """
    d, s, t = d_model, source_length, target_length
    encoder_macs = encoder_layers * s * (4 * d * d + 2 * d * encoder_ffn_dim + 2 * s * d)
    decoder_macs = decoder_layers * (t * (6 * d * d + 2 * d * decoder_ffn_dim + 2 * t * d + 2 * s * d) + s * 2 * d * d)
    head_macs = t * d * vocab_size
    return 2 * batch_size * (encoder_macs + decoder_macs + head_macs)


def training_flops(**shape: int) -> int:
    """FLOPs of forward + backward: the backward pass of a matrix product computes two products of the same size
    (gradient of the input and of the weight), so a training step costs 3 × the forward pass. Same arguments as
    `forward_flops`."""
    return 3 * forward_flops(**shape)


def model_shape(config) -> dict[str, int]:
    """The `forward_flops` arguments that a `TransformerConfig` or `MarianConfig` fixes."""
    return {
        "d_model": config.d_model,
        "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers,
        "encoder_ffn_dim": config.encoder_ffn_dim,
        "decoder_ffn_dim": config.decoder_ffn_dim,
        "vocab_size": config.vocab_size,
    }


# --------------------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Section:
    """One benchmark's report: a titled markdown table, notes under it, and the raw numbers for JSON."""

    title: str
    headers: list[str]
    rows: list[list[object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def markdown(self) -> str:
        parts = [f"### {self.title}", "", markdown_table(self.headers, self.rows)]
        if self.notes:
            parts += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(parts)

    def to_dict(self) -> dict:
        return {"title": self.title, "headers": self.headers, "rows": self.rows, "notes": self.notes, **self.data}


def format_number(value: float | int | str | None) -> str:
    """Three significant digits, thousands separators for large values, '–' for a missing value."""
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    if abs(value) >= 999.5:  # below, three significant digits of 999.5 are "1e+03"
        return f"{value:,.0f}"
    return f"{value:.3g}"


def format_spread(stats: Stats) -> str:
    return f"{format_number(stats.minimum)}–{format_number(stats.maximum)}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; cells are formatted with `format_number` unless already strings."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(format_number(cell) for cell in row) + " |")  # type: ignore[arg-type]
    return "\n".join(lines)


def ratio(value: float, baseline: float | None) -> str:
    """'1.23×' of value over baseline, or '–' when there is no baseline."""
    return "–" if not baseline else f"{value / baseline:.2f}×"


# --------------------------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------------------------


def operator_table(prof: torch.profiler.profile, steps: int, wall_us: float, top: int) -> tuple[str, float]:
    """Markdown table of the top operators by self CPU time, and the share of wall time inside operators."""
    events = [event for event in prof.key_averages() if event.self_cpu_time_total > 0]
    events.sort(key=lambda event: event.self_cpu_time_total, reverse=True)
    inside = sum(event.self_cpu_time_total for event in events)
    rows = [
        [
            event.key,
            event.self_cpu_time_total / 1e3,
            f"{100 * event.self_cpu_time_total / wall_us:.1f}%",
            event.count / steps,
            event.self_cpu_time_total / event.count,
        ]
        for event in events[:top]
    ]
    headers = ["operator", "self ms", "% of wall", "calls / step", "µs / call"]
    return markdown_table(headers, rows), inside / wall_us
