"""ONNX: `encoder.onnx` and `decoder.onnx` (without cache) for onnxruntime, traced by `torch.onnx.export`."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ..configuration_transformer import TransformerConfig
from ..modeling_transformer import TransformerForConditionalGeneration, TransformerPositionalEncoding
from .common import building_directory, check_model, check_tokenizer_fits, write_record

ONNX_OPSET = 18


class OnnxEncoder(nn.Module):
    """encoder.onnx: (input_ids, attention_mask) → encoder_hidden_states."""

    def __init__(self, model: TransformerForConditionalGeneration):
        super().__init__()
        self.encoder = model.model.encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class OnnxDecoder(nn.Module):
    """decoder.onnx: (decoder_input_ids, encoder_hidden_states, encoder_attention_mask) → logits of every
    position, without cache."""

    def __init__(self, model: TransformerForConditionalGeneration):
        super().__init__()
        self.decoder = model.model.decoder
        self.lm_head = model.lm_head

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        hidden_states = self.decoder(
            input_ids=decoder_input_ids,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            use_cache=False,
        ).last_hidden_state
        return self.lm_head(hidden_states)


class FormulaPositions(nn.Module):
    """A stack's positional encodings for any length: the table's rows, then rows computed from the formula, as
    the model computes those beyond its table. The table alone, sliced in a graph, made onnxruntime fail on a longer
    input with a broadcast error ("64 by 91") that named no limit, where the model translates it whole."""

    def __init__(self, positions: TransformerPositionalEncoding):
        super().__init__()
        self.positions = positions

    def forward(self, start: int, length: int) -> torch.Tensor:
        table = self.positions.table
        within = table[start : start + length]
        beyond = self.positions.compute_table(length - within.shape[0], start + within.shape[0])
        return torch.cat((within, beyond.to(table.device, table.dtype)))


@contextmanager
def positions_from_formula(model: TransformerForConditionalGeneration) -> Iterator[None]:
    """Within the block, both stacks of `model` take their positional encodings from `FormulaPositions`."""
    stacks = (model.model.encoder, model.model.decoder)
    tables = [stack.embed_positions for stack in stacks]
    for stack, table in zip(stacks, tables, strict=True):
        stack.embed_positions = FormulaPositions(table)
    try:
        yield
    finally:
        for stack, table in zip(stacks, tables, strict=True):
            stack.embed_positions = table


def _example_inputs(config: TransformerConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A padded batch of 2 sources (lengths 7 and 4) and 2 decoder prefixes of length 5: shapes for tracing."""
    input_ids = torch.full((2, 7), 3, dtype=torch.long)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 4:] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, config.pad_token_id or 0)
    decoder_input_ids = torch.full((2, 5), config.decoder_start_token_id, dtype=torch.long)
    return input_ids, attention_mask, decoder_input_ids


def to_onnx(
    model: TransformerForConditionalGeneration,
    output_dir: str | Path,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    opset_version: int = ONNX_OPSET,
) -> Path:
    """Write `encoder.onnx` and `decoder.onnx` of `model` (float32, from a float32 copy of a bfloat16 or float16
    model; dynamic batch and lengths; eager attention traced by `torch.onnx.export(dynamo=True)`), with the config,
    generation config and tokenizer.

    encoder.onnx: `input_ids` (B, S) int64, `attention_mask` (B, S) int64 → `encoder_hidden_states` (B, S, D).
    decoder.onnx: `decoder_input_ids` (B, T) int64, `encoder_hidden_states` (B, S, D), `encoder_attention_mask`
    (B, S) int64 → `logits` (B, T, V), for every decoder position. S and T have no limit: the graphs compute the
    positional encodings from their formula, as the model does beyond its table of `max_position_embeddings` rows.

    No decoder-with-cache graph: it would take and return 4 tensors per decoder layer and need a second graph for
    the first step (as optimum builds), while a runtime that wants fast beam search is better served by
    `to_ctranslate2`, which has the cache, the beam search and int8 in C++. Without cache, step t recomputes the
    t previous positions; at sentence lengths (outputs of 10 to 60 tokens) that is the price of one simple graph.
    """
    import onnx  # noqa: F401 (the exporter needs it; fail here with its name rather than deep inside torch)
    import onnxscript  # noqa: F401

    model = check_model(model)
    check_tokenizer_fits(model, tokenizer, "ONNX")
    # in one line before the tracing: transformers refused the generation config in a dozen lines after it
    model.check_generation_config_savable(output_dir)
    if model.dtype != torch.float32:
        # onnxruntime's CPU kernels lack bfloat16 and float16 for most operators: such a graph would not even load.
        model = copy.deepcopy(model).float()
    config: TransformerConfig = model.config
    input_ids, attention_mask, decoder_input_ids = (tensor.to(model.device) for tensor in _example_inputs(config))
    was_training = model.training
    implementation = config._attn_implementation
    model.eval()
    model.set_attn_implementation("eager")
    try:
        with building_directory(output_dir) as directory, torch.no_grad(), positions_from_formula(model):
            encoder = OnnxEncoder(model).eval()
            encoder_hidden_states = encoder(input_ids, attention_mask)
            batch, source, target = (torch.export.Dim(name) for name in ("batch", "source", "target"))
            _export_graph(
                encoder,
                (input_ids, attention_mask),
                directory / "encoder.onnx",
                ["input_ids", "attention_mask"],
                ["encoder_hidden_states"],
                {"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source}},
                opset_version,
            )
            _export_graph(
                OnnxDecoder(model).eval(),
                (decoder_input_ids, encoder_hidden_states, attention_mask),
                directory / "decoder.onnx",
                ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"],
                ["logits"],
                {
                    "decoder_input_ids": {0: batch, 1: target},
                    "encoder_hidden_states": {0: batch, 1: source},
                    "encoder_attention_mask": {0: batch, 1: source},
                },
                opset_version,
            )
            config.to_json_file(directory / "config.json")  # without the remote code: the graphs replace it
            model.generation_config.save_pretrained(directory)
            if tokenizer is not None:
                tokenizer.save_pretrained(directory)
            write_record(
                directory,
                "onnx",
                model,
                opset_version=opset_version,
                graphs={
                    "encoder.onnx": "input_ids, attention_mask -> encoder_hidden_states",
                    "decoder.onnx": "decoder_input_ids, encoder_hidden_states, encoder_attention_mask -> logits",
                },
            )
    finally:
        model.set_attn_implementation(implementation)
        model.train(was_training)
    return Path(output_dir)


def _export_graph(module, args, path: Path, input_names, output_names, dynamic_shapes, opset_version) -> None:
    with warnings.catch_warnings():
        # The exporter's notes on the shared batch/source dimensions and pytree deprecations concern its internals.
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.onnx.export(
            module,
            args,
            dynamo=True,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
            opset_version=opset_version,
            external_data=False,
            verbose=False,
        )
    # Below the opsets it implements (18), torch converts the graph down, and where that fails (LayerNormalization
    # has no version before 17) it keeps 18 with a warning: the graph would then hold another opset than the one
    # asked for, and export.json would record the one asked for.
    written = program.model.opset_imports.get("")
    if written != opset_version:
        raise ValueError(
            f"cannot export to ONNX at opset_version={opset_version}: torch's exporter could not convert {path.name} "
            f"to it (it holds opset {written}); pass a later opset_version (the default is {ONNX_OPSET})."
        )
    program.save(str(path))
