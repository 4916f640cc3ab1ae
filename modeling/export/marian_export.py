"""MarianMT: the exact `MarianMTModel` twin (`modeling.convert.to_marian`), saved with the tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from ..configuration_transformer import TransformerConfig
from ..modeling_transformer import TransformerForConditionalGeneration
from .common import (
    building_directory,
    check_model,
    check_tokenizer_fits,
    paper_decoding_not_expressed,
    refuse,
    single_eos,
    within_positions,
    write_record,
)


def check_marian(model: TransformerForConditionalGeneration) -> TransformerForConditionalGeneration:
    """`check_model(model)`, refused, naming the field, where MarianMTModel cannot compute it exactly (the
    positional table is compared after conversion, in `to_marian`)."""
    model = check_model(model)
    config: TransformerConfig = model.config
    if not config.tie_word_embeddings:
        refuse("tie_word_embeddings", False, "MarianMT", "it shares one embedding matrix three ways")
    if config.layer_norm_eps != 1e-5:
        refuse("layer_norm_eps", config.layer_norm_eps, "MarianMT", "its LayerNorm epsilon is 1e-5")
    for name, paper in (("positional_encoding_frequencies", "paper"), ("positional_encoding_offset", 0)):
        if getattr(config, name) != paper:
            refuse(name, getattr(config, name), "MarianMT", "it adds the paper's sinusoids from position 0")
    single_eos(config, "MarianMT")
    return model


def _check_marian_positions(model: TransformerForConditionalGeneration, marian) -> None:
    """Marian adds its own sinusoids (the paper's formula from position 0, concatenated): this model's positional
    module must add the same ones, up to the permutation of an interleaved layout."""
    from ..convert import interleaved_to_concatenated_permutation

    config: TransformerConfig = model.config
    for ours, theirs in (
        (model.model.encoder.embed_positions, marian.model.encoder.embed_positions),
        (model.model.decoder.embed_positions, marian.model.decoder.embed_positions),
    ):
        table = ours(0, config.max_position_embeddings).detach().float().cpu()
        if config.positional_encoding_layout == "interleaved":
            table = table[:, interleaved_to_concatenated_permutation(config.d_model)]
        if not torch.allclose(table, theirs.weight.detach().float().cpu(), rtol=0, atol=1e-6):
            defaults = TransformerConfig()
            fields = [
                f"{key}={value!r}"
                for key, value in config.to_dict().items()
                if "position" in key and key != "max_position_embeddings" and getattr(defaults, key, value) != value
            ]
            raise ValueError(
                "cannot export to MarianMT exactly: the positional encodings "
                f"({', '.join(fields) or 'positional_encoding_layout=' + repr(config.positional_encoding_layout)}) "
                "differ from Marian's sinusoids, the paper's formula from position 0."
            )


def _check_marian_generation_config(model: TransformerForConditionalGeneration, marian) -> None:
    """Refuse, in one line naming the settings, a generation config that `MarianMTModel.save_pretrained` refuses in
    a dozen lines (`GenerationConfig is invalid`): greedy decoding (`num_beams=1`, as a user sets it in
    generation_config.json) beside the paper's early stopping and length penalty. This model loads and saves such a
    config unchanged with a warning; the twin's copy of it is new to transformers, which validates it strictly."""
    try:
        marian.generation_config.validate(strict=True)
    except ValueError as error:
        lines = str(error).splitlines()
        faults = " ".join(line[2:] for line in lines if line.startswith("- ")) or " ".join(str(error).split())
        source = getattr(model.config, "_name_or_path", "") or "the model"
        raise ValueError(
            f"cannot export to MarianMT: transformers refuses to save the generation config of {source} ({faults})"
        ) from None


def _fairseq_decoding_not_expressed(model: TransformerForConditionalGeneration) -> list[str]:
    """The fields of fairseq's decoding (`set_fairseq_decoding`) set in the generation config, which transformers'
    beam search, MarianMTModel's, does not have."""
    generation = model.generation_config
    a, b = getattr(generation, "max_length_a", None), getattr(generation, "max_length_b", None)
    not_expressed = []
    if a is not None or b is not None:
        not_expressed.append(
            f"max_length_a={a}, max_length_b={b}: MarianMTModel has no limit a · source width + b, only max_length"
        )
    if getattr(generation, "forced_eos_keeps_log_prob", False):
        not_expressed.append("forced_eos_keeps_log_prob=True: MarianMTModel forces no end-of-sentence of its own")
    if getattr(generation, "beam_finalization", None) == "first":
        not_expressed.append(
            "beam_finalization='first': MarianMTModel keeps the best num_beams finished hypotheses, not the first "
            "(the best one is the same)"
        )
    return not_expressed


def to_marian(
    model: TransformerForConditionalGeneration, tokenizer: PreTrainedTokenizerBase | None, output_dir: str | Path
) -> Path:
    """Save the exact `MarianMTModel` twin of `model` (`modeling.convert.to_marian`: same logits, same beam search
    with transformers' length penalty) with `tokenizer` to `output_dir`. It loads with
    `MarianMTModel.from_pretrained` and `AutoTokenizer.from_pretrained`, without remote code.

    Where the generation config caps no length (this model's limit is per sentence, `max_length_offset`), the
    twin's `max_length` is the positional table's length, as Marian checkpoints on the Hub have it: transformers'
    default of 20 tokens would cut most translations without a word. `export.json` lists it."""
    from ..convert import to_marian as convert_to_marian

    model = check_marian(model)
    check_tokenizer_fits(model, tokenizer, "MarianMTModel")
    marian = convert_to_marian(model)
    _check_marian_positions(model, marian)
    _check_marian_generation_config(model, marian)
    not_expressed = paper_decoding_not_expressed(model, "MarianMTModel") + _fairseq_decoding_not_expressed(model)
    limits = marian.generation_config
    positions = model.config.max_position_embeddings
    if limits.max_length is None and limits.max_new_tokens is None:
        limits.max_length = positions
        not_expressed.append(
            f"no max_length or max_new_tokens: MarianMTModel stops every sentence at max_length={limits.max_length} "
            "tokens (the positional table), where transformers' default would be 20"
        )
    else:  # max_new_tokens, where both are set, is the one generate() applies
        new_tokens = limits.max_new_tokens if limits.max_new_tokens is not None else limits.max_length - 1
        if new_tokens >= positions:  # MarianMTModel failed at the table's end (IndexError) where ours ran on
            limits.max_length, limits.max_new_tokens = positions, None
            not_expressed.append(
                f"a limit of {new_tokens} new tokens (max_length or max_new_tokens): MarianMTModel stops every "
                f"sentence at max_length={positions} tokens (the positional table: beyond it, it fails with an "
                f"IndexError), where generate() lets a translation run on to {new_tokens}"
            )
    not_expressed.append(
        f"sources over {positions} tokens: MarianMTModel fails on them (IndexError: index out of range in self, its "
        f"positional table has {positions} rows), where generate() encodes them whole; a tokenizer exported with it "
        f"warns of them (model_max_length at most {positions}) and cuts them with truncation=True"
    )
    with building_directory(output_dir) as directory:
        marian.save_pretrained(directory)
        if tokenizer is not None:
            within_positions(tokenizer, positions).save_pretrained(directory)
        write_record(directory, "marian", model, not_expressed=not_expressed)
    return Path(output_dir)
