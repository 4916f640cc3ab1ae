"""How fast a decoding step could be if torch.compile fused it: a ceiling for issue #16, not a decoding path.

    python benchmarks/investigations/compiled_decoder_step.py --threads 1
    python benchmarks/investigations/compiled_decoder_step.py --rows 4 48 --steps 24 --repeats 9

On the cached trained checkpoint, for R rows (hypotheses) and N one-token steps on random tokens and random encoder
states, it times three ways of running the decoder's steps, log-softmax included, in alternation within one process:

- **generate()**: `_decoder_step` on a `StaticBeamCache`, as beam search runs it, the weights prepacked for oneDNN
  once, outside the timing (generate() prepacks once per call);
- **static, eager**: `StaticShapeStep`, the same layers written for fixed shapes: each layer's self-attention keys
  and values in a buffer with room for `--cache-steps` steps, the ones not yet written masked; one-query attention as
  products and sums; oneDNN products on prepacked weights (the self-attention's three in one);
- **static, compiled**: the same, compiled by inductor (`fullgraph=True, dynamic=False`), whose C++ fuses the small
  operators between the products.

Prints ms per step (medians), the compile time and the largest difference in log-probabilities from generate()'s
way. The rows and the steps written are fixed here; in beam search rows leave and the cache grows at every step, so
a compiled decoding would need a shape per row count (or padded rows) and a compile for each. x86 CPUs with oneDNN
only; inductor needs a C++ compiler.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmark suite: fixtures, harness, ...

import torch
from fixtures import add_decoding_comparison_arguments, decoding_comparison_setup
from harness import measure_alternating, positive_int
from torch import nn
from torch.nn import functional

from modeling.cache_transformer import StaticBeamCache
from modeling.modeling_transformer import TransformerForConditionalGeneration
from modeling.onednn_transformer import _PREPACKED_WEIGHTS, _onednn_linear, linear

SOURCE_LENGTH = 20


@torch.library.custom_op("investigations::onednn_linear", mutates_args=())
def onednn_linear(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's product on a prepacked weight, opaque to inductor (its own lowering of the oneDNN op rejects a
    weight prepacked outside the graph, and without it inductor picks MKL's products, twice as slow here)."""
    return _onednn_linear(hidden_states, weight, bias)


@onednn_linear.register_fake
def _(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return hidden_states.new_empty(*hidden_states.shape[:-1], weight.shape[0])


class StaticShapeStep(nn.Module):
    """One decoding step of `model`'s decoder for a fixed number of rows and a fixed room for steps, as functions of
    tensors only (no Python state that changes between steps), so that inductor compiles it once."""

    def __init__(self, model: TransformerForConditionalGeneration, cache_steps: int):
        """Built inside `model.prepacked_for_decoding()`, whose laid-out weights (the self-attention's three
        projections as one `FusedLinear`) it multiplies by, as generate()'s steps do."""
        super().__init__()
        prepacked = _PREPACKED_WEIGHTS.get()
        if prepacked is None:
            raise RuntimeError("StaticShapeStep multiplies by prepacked weights: build it in prepacked_for_decoding()")
        decoder = model.model.decoder
        self.layers, self.embed_tokens, self.embed_scale = decoder.layers, decoder.embed_tokens, decoder.embed_scale
        self.register_buffer("positions", decoder.embed_positions.table[:cache_steps].clone())  # (S, D)
        self.num_heads = decoder.layers[0].self_attn.num_heads
        self.lm_head = model.lm_head
        self.prepacked = prepacked  # layer -> laid-out weight; (q_proj, k_proj, v_proj) -> FusedLinear

    def product(self, layer: nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
        return onednn_linear(hidden_states, self.prepacked[layer], layer.bias)

    def projections(self, attention: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        """The queries, keys and values of a self-attention in one product: (R, 3D)."""
        fused = self.prepacked[(attention.q_proj, attention.k_proj, attention.v_proj)]
        return onednn_linear(hidden_states, fused.weight, fused.bias)

    @staticmethod
    def attend(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """One query per row and head over S keys, written as products and sums (which inductor fuses into one
        loop) rather than as sdpa (a library call per row and head): (R, H, Dh) with keys (R, H, S, Dh)."""
        scores = (queries[:, :, None, :] * keys).sum(-1) * queries.shape[-1] ** -0.5 + bias  # (R, H, S)
        return (scores.softmax(-1)[..., None] * values).sum(-2)  # (R, H, Dh)

    def forward(
        self,
        tokens: torch.Tensor,
        position: torch.Tensor,
        self_attention: list[torch.Tensor],
        cross_attention: list[torch.Tensor],
        cross_attention_bias: torch.Tensor,
    ) -> torch.Tensor:
        """Log-probabilities (R, V) of the next tokens, given the last ones `tokens` (R,) at `position` (1,);
        `self_attention` holds each layer's keys and values, (R, H, S, Dh) each, and this step's are written into
        it; `cross_attention` the encoder's, (R, H, source length, Dh) each; `cross_attention_bias` (R, 1, source
        length) is 0 where a row may attend and -inf where not."""
        rows, heads = tokens.shape[0], self.num_heads
        hidden_states = self.embed_tokens(tokens) * self.embed_scale + self.positions[position]  # (R, D)
        written = torch.arange(self.positions.shape[0], device=tokens.device) <= position
        self_attention_bias = torch.where(written, 0.0, float("-inf"))[None, None]  # (1, 1, S)
        for index, layer in enumerate(self.layers):
            projections = self.projections(layer.self_attn, hidden_states)  # (R, 3D)
            queries, keys, values = projections.view(rows, 3, heads, -1).unbind(1)
            layer_keys, layer_values = self_attention[2 * index], self_attention[2 * index + 1]
            layer_keys.index_copy_(2, position, keys[:, :, None])
            layer_values.index_copy_(2, position, values[:, :, None])
            attended = self.attend(queries, layer_keys, layer_values, self_attention_bias).flatten(1)  # (R, D)
            hidden_states = layer.self_attn_layer_norm(
                hidden_states + self.product(layer.self_attn.out_proj, attended)
            )
            queries = self.product(layer.encoder_attn.q_proj, hidden_states).view(rows, heads, -1)
            encoder_keys, encoder_values = cross_attention[2 * index], cross_attention[2 * index + 1]
            attended = self.attend(queries, encoder_keys, encoder_values, cross_attention_bias).flatten(1)
            hidden_states = layer.encoder_attn_layer_norm(
                hidden_states + self.product(layer.encoder_attn.out_proj, attended)
            )
            inner = functional.relu(self.product(layer.ffn.fc1, hidden_states))  # (R, d_ff)
            hidden_states = layer.final_layer_norm(hidden_states + self.product(layer.ffn.fc2, inner))
        return functional.log_softmax(self.product(self.lm_head, hidden_states), dim=-1)  # (R, V)


@dataclass
class StepInputs:
    """What N steps of R rows read: random last tokens and encoder states, and the caches both ways fill."""

    tokens: torch.Tensor  # (N, R)
    encoder_hidden_states: torch.Tensor  # (R, source length, D)
    cross_attention: list[torch.Tensor]  # keys, values of each layer: (R, H, source length, Dh)
    cross_attention_bias: torch.Tensor  # (R, 1, source length): nothing masked
    self_attention: list[torch.Tensor]  # keys, values of each layer: (R, H, cache steps, Dh), written in place

    @classmethod
    def random(cls, model: TransformerForConditionalGeneration, rows: int, steps: int, cache_steps: int) -> StepInputs:
        config = model.config
        heads = config.decoder_attention_heads
        generator = torch.Generator().manual_seed(0)
        encoder_hidden_states = torch.randn(rows, SOURCE_LENGTH, config.d_model, generator=generator)

        def split_heads(states: torch.Tensor) -> torch.Tensor:
            return states.view(rows, SOURCE_LENGTH, heads, -1).transpose(1, 2).contiguous()  # (R, H, S, Dh)

        cross_attention = []
        for layer in model.model.decoder.layers:
            attention = layer.encoder_attn
            cross_attention += [split_heads(linear(attention.k_proj, encoder_hidden_states))]
            cross_attention += [split_heads(linear(attention.v_proj, encoder_hidden_states))]
        head_dim = config.d_model // heads
        self_attention = [torch.zeros(rows, heads, cache_steps, head_dim) for _ in range(2 * config.decoder_layers)]
        for buffer in self_attention:
            torch._dynamo.mark_static_address(buffer)  # the compiled step writes into it rather than a copy
        return cls(
            tokens=torch.randint(4, config.vocab_size, (steps, rows), generator=generator),
            encoder_hidden_states=encoder_hidden_states,
            cross_attention=cross_attention,
            cross_attention_bias=torch.zeros(rows, 1, SOURCE_LENGTH),
            self_attention=self_attention,
        )


def decode_as_generate(model: TransformerForConditionalGeneration, inputs: StepInputs) -> torch.Tensor:
    """The last step's log-probabilities (R, V), every step run by `_decoder_step` on a `StaticBeamCache`."""
    steps, rows = inputs.tokens.shape
    cache = StaticBeamCache(rows, steps, model.config.decoder_layers, inputs.encoder_hidden_states, None)
    for tokens in inputs.tokens:
        log_probs = functional.log_softmax(model._decoder_step(tokens, cache), dim=-1)
    return log_probs


def decode_static(step: nn.Module | Callable[..., torch.Tensor], inputs: StepInputs) -> torch.Tensor:
    """The last step's log-probabilities (R, V), every step run by `step` (a `StaticShapeStep`, compiled or not)."""
    for buffer in inputs.self_attention:
        buffer.zero_()
    for position, tokens in enumerate(inputs.tokens):
        log_probs = step(
            tokens,
            torch.tensor([position]),
            inputs.self_attention,
            inputs.cross_attention,
            inputs.cross_attention_bias,
        )
    return log_probs


def compare(
    model: TransformerForConditionalGeneration, rows: int, steps: int, cache_steps: int, repeats: int
) -> dict[str, float | str]:
    """ms per step of the three ways at `rows` rows (medians), the compile time and their largest differences
    from generate()'s way. Inside `model.prepacked_for_decoding()`, as generate() decodes."""
    inputs = StepInputs.random(model, rows, steps, cache_steps)
    step = StaticShapeStep(model, cache_steps)
    expected = decode_as_generate(model, inputs)
    eager_difference = (decode_static(step, inputs) - expected).abs().max().item()
    start = time.perf_counter()
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    compiled_difference = (decode_static(compiled, inputs) - expected).abs().max().item()
    compile_seconds = time.perf_counter() - start
    timings = measure_alternating(
        {
            "generate()": functools.partial(decode_as_generate, model, inputs),
            "static, eager": functools.partial(decode_static, step, inputs),
            "static, compiled": functools.partial(decode_static, compiled, inputs),
        },
        repeats,
    )
    result: dict[str, float | str] = {
        name: 1e3 * statistics.median(timing.seconds) / steps for name, timing in timings.items()
    }
    result["compile s"] = compile_seconds
    result["largest difference"] = f"{eager_difference:.1e} / {compiled_difference:.1e}"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_decoding_comparison_arguments(parser, sentences=None)
    parser.add_argument("--rows", type=positive_int, nargs="+", default=[4, 16, 48, 64])
    parser.add_argument("--steps", type=positive_int, default=24, help="steps timed per pass")
    parser.add_argument("--cache-steps", type=positive_int, default=32, help="room for steps in the static cache")
    arguments = parser.parse_args()
    if arguments.cache_steps < arguments.steps:
        parser.error(f"--cache-steps {arguments.cache_steps} leaves no room for --steps {arguments.steps}")
    _, checkpoint = decoding_comparison_setup(arguments)
    model = checkpoint.load_ours(arguments.attention)
    print(f"ms per step, {arguments.threads} thread(s), medians of {arguments.repeats}; largest difference in")
    print("log-probabilities from generate()'s way: static eager / static compiled")
    print()
    print("| rows | generate() | static, eager | static, compiled | compiled / generate() | compile s | difference |")
    print("|---|---|---|---|---|---|---|")
    with torch.inference_mode(), model.prepacked_for_decoding():
        for rows in arguments.rows:
            result = compare(model, rows, arguments.steps, arguments.cache_steps, arguments.repeats)
            ratio = result["static, compiled"] / result["generate()"]
            print(
                f"| {rows} | {result['generate()']:.2f} | {result['static, eager']:.2f} | "
                f"{result['static, compiled']:.2f} | {ratio:.2f} | {result['compile s']:.1f} | "
                f"{result['largest difference']} |"
            )


if __name__ == "__main__":
    main()
