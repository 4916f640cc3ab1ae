"""Exact conversion to and from MarianMTModel: the proof that the architecture is the one it claims to be."""

import re

import pytest
import torch
from helpers import EOS, PAD, TINY_SIZE, tiny_config
from transformers import MarianConfig, MarianMTModel

from modeling import TransformerForConditionalGeneration
from modeling.convert import from_marian, interleaved_to_concatenated_permutation, to_marian
from modeling.modeling_transformer import sinusoidal_positional_encoding


def tiny_marian(seed: int = 0) -> MarianMTModel:
    torch.manual_seed(seed)
    config = MarianConfig(
        vocab_size=61,
        **TINY_SIZE,  # the tests' model size, in the same field names
        activation_function="relu",
        scale_embedding=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        forced_eos_token_id=EOS,
        decoder_start_token_id=PAD,
    )
    model = MarianMTModel(config).eval()
    with torch.no_grad():  # trained checkpoints have non-trivial biases and norms: so should the test
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def inputs() -> dict[str, torch.Tensor]:
    input_ids = torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, 12, EOS, PAD, PAD]])
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(PAD).long()}


DECODER_INPUT_IDS = torch.tensor([[PAD, 20, 21, 22], [PAD, 23, 24, 25]])


def test_interleaved_and_concatenated_tables_differ_by_the_permutation():
    positions = torch.arange(30)
    interleaved = sinusoidal_positional_encoding(positions, 16, "interleaved")
    concatenated = sinusoidal_positional_encoding(positions, 16, "concatenated")
    assert torch.equal(interleaved[:, interleaved_to_concatenated_permutation(16)], concatenated)


@pytest.mark.parametrize("layout", ["concatenated", "interleaved"])
def test_from_marian_gives_the_same_logits_and_beam_outputs(layout):
    marian = tiny_marian()
    ours = from_marian(marian, positional_encoding_layout=layout).eval()
    assert ours.config.positional_encoding_layout == layout
    expected = marian(**inputs(), decoder_input_ids=DECODER_INPUT_IDS).logits
    logits = ours(**inputs(), decoder_input_ids=DECODER_INPUT_IDS).logits
    assert torch.allclose(logits, expected, atol=1e-5)

    marian_beams = marian.generate(**inputs(), num_beams=4, max_new_tokens=12)
    our_beams = ours.generate(
        **inputs(), num_beams=4, max_new_tokens=12, length_penalty_type="transformers", max_length_offset=None
    )
    assert our_beams.tolist() == marian_beams.tolist()


def test_a_marian_checkpoints_banned_padding_travels_with_its_conversion():
    """Hub Marian checkpoints ban their padding token (bad_words_ids); converted without that ban, the model could
    translate into padding where MarianMTModel never does."""
    marian = tiny_marian()
    marian.generation_config.bad_words_ids = [[PAD]]
    marian.generation_config.no_repeat_ngram_size = 2
    ours = from_marian(marian).eval()
    assert ours.generation_config.bad_words_ids == [[PAD]] and ours.generation_config.no_repeat_ngram_size == 2
    settings = {"num_beams": 4, "max_new_tokens": 12}
    ours_out = ours.generate(**inputs(), **settings, length_penalty_type="transformers", max_length_offset=None)
    assert ours_out.tolist() == marian.generate(**inputs(), **settings).tolist()


@pytest.mark.parametrize("layout", ["concatenated", "interleaved"])
def test_to_marian_is_exact_for_both_layouts(layout):
    torch.manual_seed(1)
    config = tiny_config(61, max_position_embeddings=64, positional_encoding_layout=layout)
    ours = TransformerForConditionalGeneration(config).eval()
    marian = to_marian(ours).eval()
    decoder_input_ids = DECODER_INPUT_IDS.clone()
    decoder_input_ids[:, 0] = EOS  # this model starts decoding from </s>
    expected = ours(**inputs(), decoder_input_ids=decoder_input_ids).logits
    assert torch.allclose(marian(**inputs(), decoder_input_ids=decoder_input_ids).logits, expected, atol=1e-5)
    assert marian.config.decoder_start_token_id == EOS

    round_trip = from_marian(marian, positional_encoding_layout=layout).eval()
    assert torch.allclose(round_trip(**inputs(), decoder_input_ids=decoder_input_ids).logits, expected, atol=1e-5)


def test_non_zero_final_logits_bias_is_refused_not_dropped():
    marian = tiny_marian()
    marian.final_logits_bias.fill_(0.5)
    with pytest.raises(ValueError, match="non-zero final_logits_bias"):
        from_marian(marian)


def test_unshared_marian_embeddings_are_refused():
    config = tiny_marian().config
    config.share_encoder_decoder_embeddings = False
    with pytest.raises(ValueError, match="not shared"):
        from_marian(MarianMTModel(config))


@pytest.mark.parametrize(
    "override", [{"positional_encoding_frequencies": "tensor2tensor"}, {"positional_encoding_offset": 2}]
)
def test_to_marian_refuses_positions_marian_does_not_compute(override):
    """A converted fairseq model has both: Marian adds the paper's sinusoids from position 0."""
    model = TransformerForConditionalGeneration(tiny_config(61, **override))
    [(name, value)] = override.items()
    with pytest.raises(ValueError, match=f"this model has {name}={value!r}"):
        to_marian(model)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 70},
            "its decoder_vocab_size (70) differs from its vocab_size (61)",
        ),
        ({"tie_word_embeddings": False}, "its embeddings are not shared by encoder, decoder and output projection"),
        ({"encoder_layerdrop": 0.1}, "it uses LayerDrop"),
        ({"decoder_layerdrop": 0.1}, "it uses LayerDrop"),
    ],
)
def test_marian_models_this_model_cannot_compute_are_refused_naming_the_problem(changes, problem):
    config = tiny_marian().config
    for name, value in changes.items():
        setattr(config, name, value)
    with pytest.raises(ValueError, match=re.escape(problem)):
        from_marian(MarianMTModel(config))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"tie_word_embeddings": False}, "MarianMTModel shares its embeddings; this model was configured with untied"),
        ({"layer_norm_eps": 1e-6}, "MarianMTModel's LayerNorm epsilon is 1e-5; this model uses 1e-06."),
    ],
)
def test_to_marian_refuses_a_model_marian_cannot_compute(override, message):
    model = TransformerForConditionalGeneration(tiny_config(61, **override))
    with pytest.raises(ValueError, match=re.escape(message)):
        to_marian(model)


def test_both_conversions_keep_the_precision_and_the_generation_settings():
    """A half-precision model converts to a half-precision one (not float32, twice the memory), and its beam size
    and length penalty travel: the converted model translates as the original did."""
    marian = tiny_marian().to(torch.bfloat16)
    marian.generation_config.num_beams = 5
    ours = from_marian(marian)
    assert ours.dtype == torch.bfloat16 and ours.generation_config.num_beams == 5

    torch.manual_seed(1)
    ours = TransformerForConditionalGeneration(tiny_config(61)).to(torch.bfloat16)
    ours.generation_config.num_beams, ours.generation_config.length_penalty = 3, 0.7
    marian = to_marian(ours)
    assert marian.dtype == torch.bfloat16
    assert (marian.generation_config.num_beams, marian.generation_config.length_penalty) == (3, 0.7)


def test_a_marian_model_converted_and_back_keeps_its_dropouts_length_limit_embedding_scale_and_logits():
    """Fine-tuned here, an opus-mt model drops out as it did in Marian, bounds sentences by the same position table,
    scales its embeddings only if Marian did (Marian's default is not to), and goes back to MarianMTModel (for
    CTranslate2) with the same settings and logits."""
    settings = {
        "dropout": 0.3,
        "attention_dropout": 0.2,
        "activation_dropout": 0.15,
        "max_position_embeddings": 48,
        "scale_embedding": False,
    }
    config = tiny_marian().config
    for name, value in settings.items():
        setattr(config, name, value)
    torch.manual_seed(2)
    marian = MarianMTModel(config).eval()
    ours = from_marian(marian).eval()
    back = to_marian(ours).eval()
    assert {name: getattr(ours.config, name) for name in settings} == settings
    assert {name: getattr(back.config, name) for name in settings} == settings
    expected = marian(**inputs(), decoder_input_ids=DECODER_INPUT_IDS).logits
    assert torch.allclose(ours(**inputs(), decoder_input_ids=DECODER_INPUT_IDS).logits, expected, atol=1e-5)
    assert torch.allclose(back(**inputs(), decoder_input_ids=DECODER_INPUT_IDS).logits, expected, atol=1e-5)
