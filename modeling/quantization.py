"""CPU int8 inference: the model's linear layers with int8 weights, their inputs quantised on the fly.

`quantize_int8(model)` is torch's dynamic quantisation (`torch.ao.quantization.quantize_dynamic`, the fbgemm / x86
kernels) with one scale per output channel, as CTranslate2's int8 uses: every projection, both feed-forward layers
and the output projection become `DynamicQuantizedLinear`; embeddings, LayerNorm and attention stay float32. It
speeds up what the matrix products cost at small batch sizes, above all the (rows × d_model) × (d_model × V) output
projection of every decoding step. torch marks `torch.ao.quantization` as deprecated in favour of torchao, whose CPU
int8 path needs torch.compile to be fast; until torch removes it, this is the eager path that runs at int8 speed.

The quantised model translates (`generate`, `modeling.translation.translate`) like the float one; it does not
train, and it is not saved or exported (both refuse it in one line): quantise the float checkpoint after loading
it, and export the float model (CTranslate2 quantises its own copy, `quantization="int8"`).

Each layer's input is quantised with one scale for the whole batch (torch's dynamic quantisation), where
CTranslate2 takes one per row: a sentence's translation can change with the sentences batched with it (32 of 150
Multi30k sentences translated alone differed from the same sentences in sorted batches; none in float32, none with
CTranslate2 int8, docs/results.md). A per-row path on `torch._int_mm` differed on 1 of 150, at the same BLEU,
but ran at float32's speed in eager PyTorch (86 sentences/s against this path's 111 and float32's 83), the speed
being this path's reason to be.
"""

import copy
import warnings

from torch import nn
from transformers import PreTrainedModel


def quantize_int8(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of `model`, in evaluation mode, whose `nn.Linear` layers hold per-channel int8 weights; the rest of
    it float32 (a bfloat16 or float16 model is converted: torch's int8 kernels take and give float32). The model
    must be on the CPU, where those kernels run."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    devices = {parameter.device.type for parameter in model.parameters()}
    if devices != {"cpu"}:
        raise ValueError(
            f"quantize_int8 makes a CPU model (torch's int8 kernels run on the CPU); this one is on "
            f"{', '.join(sorted(devices))}: pass model.to('cpu')."
        )
    quantized = copy.deepcopy(model).float().eval()
    # torch's deprecation notices for torch.ao: a DeprecationWarning on every call, and a UserWarning from C++ on
    # the first ("torch.quantize_per_tensor, torch.quantize_per_channel and other quantized tensor creation ...")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions")
        quantize_dynamic(quantized, {nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
    return quantized


__all__ = ["quantize_int8"]
