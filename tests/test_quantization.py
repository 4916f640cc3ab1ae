"""Tests of modeling/quantization.py: the int8 model translates like the float one, and the float one is untouched."""

import warnings

import pytest
import torch
from helpers import batch, synthetic_pairs, tiny_tokenizer, tiny_translator
from torch import nn

from modeling.modeling_transformer import int8_layer_names
from modeling.quantization import quantize_int8
from modeling.translation import translate


def test_every_linear_layer_is_int8_and_the_float_model_is_untouched():
    model = tiny_translator(50, seed=1)
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    quantized = quantize_int8(model)
    linear_layers = [name for name, module in model.named_modules() if type(module) is nn.Linear]
    quantized_modules = dict(quantized.named_modules())
    assert linear_layers and all(type(quantized_modules[name]) is not nn.Linear for name in linear_layers)
    assert all(torch.equal(weights[name], tensor) for name, tensor in model.state_dict().items())
    assert model.lm_head.weight is model.model.shared.weight, "the float model keeps its tied matrix"


def test_quantising_prints_none_of_torchs_deprecation_notices():
    model = tiny_translator(50, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantize_int8(model)
    assert [str(warning.message)[:60] for warning in caught] == []


def test_int8_logits_stay_close_to_float32_and_decoding_takes_the_static_cache(decoder_steps):
    model = tiny_translator(50, seed=2)
    quantized = quantize_int8(model)
    inputs = batch()
    with torch.inference_mode():
        reference, approximate = model(**inputs).logits, quantized(**inputs).logits
    assert (approximate - reference).abs().max() < 0.05 * reference.abs().max()
    generated = quantized.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    assert decoder_steps and generated.shape[0] == 2


def test_translate_with_the_int8_model_keeps_order_and_empty_lines():
    tokenizer = tiny_tokenizer()
    quantized = quantize_int8(tiny_translator(len(tokenizer)))
    sentences = [en for en, _ in synthetic_pairs(5, seed=3)]
    outputs = translate(quantized, tokenizer, sentences[:2] + [""] + sentences[2:])
    assert len(outputs) == 6 and outputs[2] == ""


def test_saving_the_int8_model_is_refused_in_one_line_before_anything_is_written(tmp_path):
    quantized = quantize_int8(tiny_translator(50))
    with pytest.raises(ValueError, match=r"cannot save to .*packed int8 weights.*save the float model") as error:
        quantized.save_pretrained(tmp_path / "int8")
    assert "\n" not in str(error.value) and not (tmp_path / "int8").exists()
    layers = int8_layer_names(quantized)
    assert f"{len(layers)} layers ({layers[0]}, ...)" in str(error.value), "how many, and the first by name"


def test_a_bfloat16_model_is_quantised_from_float32_and_another_device_is_refused():
    model = tiny_translator(50, seed=2)
    inputs = batch()
    quantized = quantize_int8(model.to(torch.bfloat16))
    assert model.dtype == torch.bfloat16, "the caller's model is left as it was"
    with torch.inference_mode():  # failed with "expected scalar type Float but found BFloat16"
        generated = quantized.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    assert generated.shape[0] == 2
    with pytest.raises(ValueError, match=r"^quantize_int8 makes a CPU model .* this one is on meta: pass model.to"):
        quantize_int8(tiny_translator(50).to("meta"))
