"""Tests of modeling/onednn_transformer.py: linear layers on oneDNN give the values and gradients of PyTorch's own,
where oneDNN runs them and only there; weights prepacked for decoding (fused Q/K/V among them) change no output."""

import contextlib
import functools
import importlib.util
import platform
import types
from pathlib import Path

import pytest
import torch
from helpers import batch, labelled_batch, sources, tiny_model
from torch.nn.modules import module as torch_module

from modeling import onednn_transformer
from modeling.quantization import quantize_int8

VOCAB = 50  # the tiny model's


@pytest.mark.parametrize(
    ("vendor", "prefers"), [("AuthenticAMD", True), ("HygonGenuine", True), ("GenuineIntel", False), (None, False)]
)
def test_onednn_is_preferred_on_x86_cpus_not_made_by_intel(vendor, prefers):
    assert onednn_transformer.prefers_onednn(vendor) is prefers


@torch.no_grad()
def test_this_cpu_takes_onednn_by_default_only_if_it_prefers_it():
    model = tiny_model()
    prefers = onednn_transformer._ONEDNN_KERNEL and onednn_transformer.prefers_onednn(onednn_transformer._x86_vendor())
    assert onednn_linear_calls(lambda: model(**batch())) == (TINY_FORWARD_LINEAR_LAYERS if prefers else 0)


def test_the_vendor_is_read_from_the_system():
    vendor = onednn_transformer._x86_vendor()
    if onednn_transformer._ONEDNN_KERNEL and Path("/proc/cpuinfo").is_file():  # x86 Linux says who made the CPU
        assert vendor and vendor.isprintable() and vendor == vendor.strip()


def onednn_linear_calls(function) -> int:
    """How many times `function()` ran oneDNN's linear kernel, as torch's profiler records it."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        function()
    return sum(event.count for event in profiler.key_averages() if event.key == "mkldnn::_linear_pointwise")


needs_onednn_linear = pytest.mark.usefixtures("onednn_linear")  # taken on any x86 CPU; skipped elsewhere
# A forward of the tiny model: 2 encoder layers x 6 linear layers (q, k, v, out, fc1, fc2), 2 decoder layers x 10
# (four of self-attention, four of cross-attention, two of the feed-forward), and the output projection.
TINY_FORWARD_LINEAR_LAYERS = 2 * 6 + 2 * 10 + 1


@needs_onednn_linear
@torch.no_grad()
def test_float32_inference_on_an_x86_cpu_runs_every_linear_layer_on_onednn_with_the_same_logits():
    model = tiny_model()
    assert onednn_linear_calls(lambda: model(**batch())) == TINY_FORWARD_LINEAR_LAYERS
    with torch.backends.mkldnn.flags(enabled=False):  # torch's own switch turns it off
        assert onednn_linear_calls(lambda: model(**batch())) == 0
        with_mkl = model(**batch()).logits
    assert torch.allclose(model(**batch()).logits, with_mkl, atol=1e-5)


@needs_onednn_linear
def test_training_on_an_x86_cpu_runs_forward_and_backward_on_onednn_with_the_same_loss_and_gradients():
    def loss_and_gradients(model):
        torch.manual_seed(0)  # the same dropout masks
        loss = model(**labelled_batch()).loss
        loss.backward()
        return loss.detach(), [parameter.grad for parameter in model.parameters()]

    model = tiny_model().train()
    # Forward: 32 linear layers, and the fused loss's product with the output projection; backward: two products
    # for each linear layer (input and weight gradients), two for the fused loss's.
    assert onednn_linear_calls(lambda: loss_and_gradients(model)) == (32 + 1) + (32 * 2 + 2)
    model.zero_grad()
    with_onednn = loss_and_gradients(model)
    model.zero_grad()
    with torch.backends.mkldnn.flags(enabled=False):
        assert onednn_linear_calls(lambda: loss_and_gradients(model)) == 0
        model.zero_grad()
        with_mkl = loss_and_gradients(model)
    assert torch.allclose(with_onednn[0], with_mkl[0], atol=1e-6)
    for ours, reference in zip(with_onednn[1], with_mkl[1], strict=True):
        assert torch.allclose(ours, reference, atol=1e-6)


@needs_onednn_linear
def test_torch_func_and_second_derivatives_run_through_the_model_as_with_mkl():
    """`OneDNNLinear` (no setup_context, once differentiable) and the fused loss failed torch.func.grad, vmap and
    create_graph=True, which run on MarianMT and with oneDNN switched off."""
    model = tiny_model().train()
    model.set_attn_implementation("eager")  # sdpa's CPU kernel has no second derivative
    params = {name: parameter.detach() for name, parameter in model.named_parameters()}

    def loss(parameters):
        torch.manual_seed(0)
        return torch.func.functional_call(model, parameters, kwargs=labelled_batch()).loss

    def gradient_penalty():
        torch.manual_seed(0)
        logits = model(**labelled_batch(), skip_logits=False).logits
        grads = torch.autograd.grad(logits.logsumexp(-1).mean(), list(model.parameters()), create_graph=True)
        penalty = sum(grad.pow(2).sum() for grad in grads)
        return penalty, torch.autograd.grad(penalty, model.model.shared.weight)[0]

    functional, penalty = torch.func.grad(loss)(params), gradient_penalty()
    with torch.backends.mkldnn.flags(enabled=False):
        functional_mkl, penalty_mkl = torch.func.grad(loss)(params), gradient_penalty()
    for name, gradient in functional.items():
        assert torch.allclose(gradient, functional_mkl[name], atol=1e-6), name
    assert torch.allclose(penalty[0], penalty_mkl[0], rtol=1e-5) and torch.allclose(
        penalty[1], penalty_mkl[1], atol=1e-5
    )


@needs_onednn_linear
def test_a_linear_layer_over_no_rows_has_gradients():
    layer = torch.nn.Linear(4, 8)
    no_rows = torch.randn(0, 4, requires_grad=True)
    onednn_transformer.linear(layer, no_rows).sum().backward()
    assert no_rows.grad.shape == (0, 4) and torch.equal(layer.weight.grad, torch.zeros(8, 4))


@needs_onednn_linear
def test_shapes_that_cannot_be_multiplied_get_torchs_error_naming_them_not_onednns():
    """oneDNN's says only "could not create a primitive descriptor for the inner product"."""
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(3x48 and 32x8\)"):
        onednn_transformer.linear(torch.nn.Linear(32, 8), torch.randn(3, 48))
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(3x48 and 32x5\)"):
        onednn_transformer.matmul_transposed(torch.randn(3, 48), torch.randn(5, 32))


@needs_onednn_linear
@torch.no_grad()
def test_onednn_is_not_taken_under_autocast_hooks_replaced_layers_or_other_dtypes():
    model = tiny_model()
    seen = []
    handle = model.lm_head.register_forward_hook(lambda module, args, output: seen.append(output.shape))
    assert onednn_linear_calls(lambda: model(**batch())) == TINY_FORWARD_LINEAR_LAYERS - 1
    assert seen == [(2, 4, VOCAB)]  # the hook ran: lm_head was called as a module
    handle.remove()
    assert onednn_linear_calls(lambda: tiny_model().double()(**batch())) == 0
    assert onednn_linear_calls(lambda: quantize_int8(model)(**batch())) == 0
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's bfloat16 products, not float32 ones
        assert onednn_linear_calls(lambda: model(**batch())) == 0


class MarkedTensor(torch.Tensor):
    """A tensor subclass, as torchao's quantised weights are: it reports float32, but only its own code reads it."""


@needs_onednn_linear
@torch.no_grad()
def test_layers_whose_call_does_more_than_linear_forward_are_called_not_multiplied_by_their_weight(monkeypatch):
    """Each of these ran oneDNN on `module.weight` instead of calling the layer, silently wrong (or failing at
    generate()'s prepacking): a `forward` replaced on the instance, a weight of a tensor subclass, a global hook."""
    model, sources = tiny_model(), batch()
    with torch.backends.mkldnn.flags(enabled=False):
        reference = model(**sources).logits
    fc1 = model.model.decoder.layers[0].ffn.fc1
    fc1.forward = lambda hidden_states: torch.nn.functional.linear(hidden_states, fc1.weight * 0.5, fc1.bias)
    with torch.backends.mkldnn.flags(enabled=False):
        halved = model(**sources).logits
    assert not torch.allclose(halved, reference, atol=1e-3)
    assert torch.allclose(model(**sources).logits, halved, atol=1e-5)
    del fc1.forward

    fc1.weight = torch.nn.Parameter(fc1.weight.detach().as_subclass(MarkedTensor))
    weight_types = []
    kernel = onednn_transformer._onednn_linear
    monkeypatch.setattr(
        onednn_transformer,
        "_onednn_linear",
        lambda x, weight, bias=None: weight_types.append(type(weight)) or kernel(x, weight, bias),
    )
    assert torch.allclose(model(**sources).logits, reference, atol=1e-5)
    assert weight_types and MarkedTensor not in weight_types
    assert (
        model.generate(**{name: sources[name] for name in ("input_ids", "attention_mask")}, num_beams=2).shape[0] == 2
    )
    assert MarkedTensor not in weight_types

    seen = []
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, output: seen.append(module) if isinstance(module, torch.nn.Linear) else None
    )
    try:
        assert onednn_linear_calls(lambda: tiny_model()(**sources)) == 0
    finally:
        hook.remove()
    assert len(seen) == TINY_FORWARD_LINEAR_LAYERS


@needs_onednn_linear
@torch.no_grad()
def test_a_bias_set_as_a_plain_attribute_is_added():
    """`del layer.bias; layer.bias = tensor` (hypernetworks, meta-learning) keeps it out of the layer's parameters,
    where the fast path reads them: it computed without the bias."""
    torch.manual_seed(0)
    layer, hidden_states = torch.nn.Linear(8, 4), torch.randn(3, 8)
    bias = layer.bias.detach() + 10
    del layer.bias
    layer.bias = bias
    assert torch.allclose(onednn_transformer.linear(layer, hidden_states), layer(hidden_states), atol=1e-5)


@needs_onednn_linear
def test_a_backward_hook_on_a_linear_layer_runs_in_training():
    model = tiny_model().train()
    seen = []
    model.model.decoder.layers[0].ffn.fc2.register_full_backward_hook(
        lambda module, grad_input, grad_output: seen.append(grad_output[0].shape)
    )
    model(**labelled_batch()).loss.backward()
    assert seen == [(2, 4, 32)]


@needs_onednn_linear
@torch.no_grad()
def test_a_model_offloaded_by_accelerate_computes_what_it_did_on_the_cpu(tmp_path):
    """accelerate keeps offloaded weights on the meta device and brings them in by replacing each layer's
    `forward`: oneDNN on those meta weights gave NaN logits and one-token translations."""
    from accelerate import cpu_offload, disk_offload

    model, sources = tiny_model(), batch()
    inputs = {name: sources[name] for name in ("input_ids", "attention_mask")}
    logits, translations = model(**sources).logits, model.generate(**inputs, num_beams=4, max_new_tokens=6)
    for offload in (cpu_offload, lambda model, execution_device: disk_offload(model, tmp_path, execution_device)):
        offloaded = offload(tiny_model(), execution_device=torch.device("cpu"))
        assert offloaded.lm_head.weight.is_meta
        assert torch.allclose(offloaded(**sources).logits, logits, atol=1e-5)
        assert torch.equal(offloaded.generate(**inputs, num_beams=4, max_new_tokens=6), translations)


def weight_layouts_of_onednn_calls(monkeypatch) -> list[torch.layout]:
    """The layout of the weight of every oneDNN product from now on: strided (plain) or torch._mkldnn (prepacked)."""
    layouts = []
    kernel = onednn_transformer._onednn_linear

    def recording(hidden_states, weight, bias=None):
        layouts.append(weight.layout)
        return kernel(hidden_states, weight, bias)

    monkeypatch.setattr(onednn_transformer, "_onednn_linear", recording)
    return layouts


@needs_onednn_linear
@pytest.mark.parametrize("loop", ["beam search (this model's loop)", "greedy, with scores (transformers' loop)"])
def test_generate_decodes_with_prepacked_weights_and_the_same_outputs_bit_for_bit(monkeypatch, loop):
    model = tiny_model()

    def generate() -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        if loop.startswith("beam"):
            return model.generate(**sources(), num_beams=4, max_new_tokens=6), ()
        out = model.generate(**sources(), max_new_tokens=6, output_scores=True, return_dict_in_generate=True)
        return out.sequences, out.scores

    layouts = weight_layouts_of_onednn_calls(monkeypatch)
    prepacked = generate()
    encoder_calls = 2 * 6
    assert layouts[:encoder_calls] == [torch.strided] * encoder_calls  # the encoder runs once, on plain weights
    assert len(layouts) > encoder_calls and set(layouts[encoder_calls:]) == {torch._mkldnn}  # every decoding step
    assert onednn_transformer._PREPACKED_WEIGHTS.get() is None  # the copies are dropped with the call
    layouts.clear()
    monkeypatch.setattr(model, "prepacked_for_decoding", contextlib.nullcontext)
    plain = generate()
    assert set(layouts) == {torch.strided}
    assert torch.equal(prepacked[0], plain[0])
    for ours, reference in zip(prepacked[1], plain[1], strict=True):
        assert torch.equal(ours, reference)


@needs_onednn_linear
def test_prepacked_weights_leave_out_what_onednn_does_not_run_and_go_with_the_block(monkeypatch):
    model = tiny_model()
    decoder_layers = [*model.model.decoder.modules(), model.lm_head]
    self_attentions = [
        (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
        for layer in model.model.decoder.layers
    ]
    with model.prepacked_for_decoding():
        prepacked = onednn_transformer._PREPACKED_WEIGHTS.get()
        fused = {key for key in prepacked if isinstance(key, tuple)}
        assert fused == set(self_attentions)  # each self-attention's queries, keys and values: one product
        alone = {module for module in decoder_layers if isinstance(module, torch.nn.Linear)} - set(sum(fused, ()))
        assert set(prepacked) - fused == alone
        assert len(prepacked) == 2 * (1 + 7) + 1
    assert onednn_transformer._PREPACKED_WEIGHTS.get() is None
    for other in (quantize_int8(model), tiny_model().double()):
        with other.prepacked_for_decoding():
            assert onednn_transformer._PREPACKED_WEIGHTS.get() == {}
    with torch.backends.mkldnn.flags(enabled=False), model.prepacked_for_decoding():
        assert onednn_transformer._PREPACKED_WEIGHTS.get() is None
    with pytest.raises(RuntimeError, match="a failing step"), model.prepacked_for_decoding():
        raise RuntimeError("a failing step")
    assert onednn_transformer._PREPACKED_WEIGHTS.get() is None


@needs_onednn_linear
@torch.no_grad()
def test_fused_layers_give_each_layer_s_output_bit_for_bit_in_one_product(monkeypatch):
    torch.manual_seed(0)
    group = tuple(torch.nn.Linear(16, width) for width in (16, 16, 8))
    unfusable = (torch.nn.Linear(16, 16), torch.nn.Linear(16, 16, bias=False))  # one with a bias, one without
    other_inputs = (torch.nn.Linear(16, 8), torch.nn.Linear(8, 8))  # inputs of two widths: no one product
    inputs = torch.randn(5, 1, 16)
    expected = [onednn_transformer.linear(layer, inputs) for layer in group]  # oneDNN, each on its plain weight
    layouts = weight_layouts_of_onednn_calls(monkeypatch)
    layers = [*group, *unfusable, *other_inputs]
    with onednn_transformer.onednn_prepacked(layers, fused=[group, unfusable, other_inputs]):
        prepacked = onednn_transformer._PREPACKED_WEIGHTS.get()
        assert set(prepacked) == {group, *unfusable, *other_inputs}  # the group's layers have no copies of their own
        outputs = onednn_transformer.linears(group, inputs)
        assert layouts == [torch._mkldnn]  # one product
        assert [output.shape for output in outputs] == [(5, 1, 16), (5, 1, 16), (5, 1, 8)]
        assert all(torch.equal(output, reference) for output, reference in zip(outputs, expected, strict=True))
        layouts.clear()
        onednn_transformer.linears(unfusable, inputs)
        assert layouts == [torch._mkldnn, torch._mkldnn]  # each alone, prepacked
        seen = []
        handle = group[0].register_forward_hook(lambda module, args, output: seen.append(output.shape))
        hooked = onednn_transformer.linears(group, inputs)  # a hook added inside the block: each layer called
        handle.remove()
        assert seen == [(5, 1, 16)]
        for output, reference in zip(hooked, expected, strict=True):  # the hooked one by nn.Linear itself (MKL)
            torch.testing.assert_close(output, reference)
    layouts.clear()
    outside = onednn_transformer.linears(group, inputs)  # outside the block: each layer on its plain weight
    assert layouts == [torch.strided] * 3
    assert all(torch.equal(output, reference) for output, reference in zip(outside, expected, strict=True))


@needs_onednn_linear
def test_a_layer_that_records_gradients_inside_the_block_uses_its_own_weight(monkeypatch):
    torch.manual_seed(0)
    layer, inputs = torch.nn.Linear(8, 16), torch.randn(3, 8)
    layer(inputs).square().sum().backward()
    expected, layer.weight.grad = layer.weight.grad, None
    layouts = weight_layouts_of_onednn_calls(monkeypatch)
    with onednn_transformer.onednn_prepacked([layer]):
        onednn_transformer.linear(layer, inputs).square().sum().backward()
    assert layouts and set(layouts) == {torch.strided}
    assert torch.allclose(layer.weight.grad, expected, atol=1e-6)


AMD_CPUINFO = (
    b"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel name\t: AMD EPYC 7763 64-Core Processor\n"
)
INTEL_CPUINFO = b"processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel name\t: Intel(R) Xeon(R) CPU\n"


def onednn_transformer_imported_on(monkeypatch, tmp_path, machine: str, cpuinfo: bytes | None, processor: str):
    """A fresh copy of the module, imported as on a computer whose `platform.machine()` is `machine`, whose
    /proc/cpuinfo holds `cpuinfo` (None: it has none, as Windows and macOS) and whose `platform.processor()` says
    `processor`: its vendor and its choice of oneDNN are made once, at import."""
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(platform, "processor", lambda: processor)
    if cpuinfo is not None:
        (tmp_path / "cpuinfo").write_bytes(cpuinfo)

    def open_cpuinfo(path, *args, **kwargs):  # the only file the module opens
        assert path == "/proc/cpuinfo"
        return open(tmp_path / "cpuinfo", *args, **kwargs)

    spec = importlib.util.spec_from_file_location("onednn_transformer_elsewhere", onednn_transformer.__file__)
    module = importlib.util.module_from_spec(spec)
    module.open = open_cpuinfo  # found before the builtin
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("machine", "cpuinfo", "processor", "vendor", "takes"),
    [
        ("x86_64", AMD_CPUINFO, "x86_64", "AuthenticAMD", True),  # Linux: the vendor is read from /proc/cpuinfo
        ("x86_64", INTEL_CPUINFO, "x86_64", "GenuineIntel", False),
        (
            "x86_64",
            b"processor\t: 0\nmodel name\t: \xe5\x85\x86\xe8\x8a\xaf\nvendor_id\t:   Shanghai  \n",
            "",
            "Shanghai",
            True,
        ),
        ("AMD64", None, "AMD64 Family 25 Model 1 Stepping 1, AuthenticAMD", "AuthenticAMD", True),  # Windows
        ("AMD64", None, "Intel64 Family 6 Model 85 Stepping 7, GenuineIntel", "GenuineIntel", False),
        ("x86_64", None, "i386", None, False),  # macOS on Intel: no vendor told
        ("aarch64", b"processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n", "aarch64", None, False),
    ],
    ids=["linux-amd", "linux-intel", "linux-zhaoxin-non-ascii", "windows-amd", "windows-intel", "macos", "linux-arm"],
)
def test_the_vendor_and_the_choice_of_onednn_on_each_system(
    monkeypatch, tmp_path, machine, cpuinfo, processor, vendor, takes
):
    module = onednn_transformer_imported_on(monkeypatch, tmp_path, machine, cpuinfo, processor)
    assert module._x86_vendor() == vendor
    assert module._ONEDNN_KERNEL is (machine != "aarch64")  # what `onednn_linear` runs the tests on, x86 only
    assert module.takes_onednn(torch.randn(3, 8), torch.randn(4, 8)) is takes


def test_a_torch_without_onednn_s_linear_kernel_keeps_torch_s_own_on_any_cpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.ops, "mkldnn", types.SimpleNamespace())  # a build without oneDNN
    module = onednn_transformer_imported_on(monkeypatch, tmp_path, "x86_64", AMD_CPUINFO, "x86_64")
    assert not module._ONEDNN_KERNEL and not module.takes_onednn(torch.randn(3, 8), torch.randn(4, 8))


HOOKS = {
    "forward": lambda layer, hook: layer.register_forward_hook(hook),
    "forward pre": lambda layer, hook: layer.register_forward_pre_hook(hook),
    "backward": lambda layer, hook: layer.register_full_backward_hook(hook),
    "backward pre": lambda layer, hook: layer.register_full_backward_pre_hook(hook),
    "global forward": lambda layer, hook: torch_module.register_module_forward_hook(hook),
    "global forward pre": lambda layer, hook: torch_module.register_module_forward_pre_hook(hook),
    "global backward": lambda layer, hook: torch_module.register_module_full_backward_hook(hook),
    "global backward pre": lambda layer, hook: torch_module.register_module_full_backward_pre_hook(hook),
}


@needs_onednn_linear
@pytest.mark.parametrize("kind", HOOKS)
def test_a_hook_of_every_kind_runs_when_its_layer_is_trained(kind):
    layer, seen = torch.nn.Linear(8, 4), []
    handle = HOOKS[kind](layer, lambda *args: seen.append(kind))
    try:
        onednn_transformer.linear(layer, torch.randn(3, 8, requires_grad=True)).sum().backward()
    finally:
        handle.remove()
    assert seen == [kind]


@needs_onednn_linear
@torch.no_grad()
@pytest.mark.parametrize("name", ["weight", "bias"])
def test_a_weight_or_bias_of_a_tensor_subclass_is_neither_multiplied_by_onednn_nor_prepacked(monkeypatch, name):
    torch.manual_seed(0)
    layer, inputs = torch.nn.Linear(8, 4), torch.randn(3, 8)
    expected = layer(inputs)
    setattr(layer, name, torch.nn.Parameter(getattr(layer, name).detach().as_subclass(MarkedTensor)))
    layouts = weight_layouts_of_onednn_calls(monkeypatch)
    with onednn_transformer.onednn_prepacked([layer]):
        assert onednn_transformer._PREPACKED_WEIGHTS.get() == {}
        output = onednn_transformer.linear(layer, inputs)
    assert layouts == [] and torch.allclose(output, expected, atol=1e-6)


class RecordingTensor(torch.Tensor):
    """A tensor subclass that sees every torch function called on it, as tracers' and quantisers' tensors do."""

    functions: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.functions.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


@needs_onednn_linear
@torch.no_grad()
def test_an_input_or_weight_of_a_tensor_subclass_sees_torch_s_functions_not_onednn_s(monkeypatch):
    monkeypatch.setattr(RecordingTensor, "functions", [])
    layer, a, b = torch.nn.Linear(8, 4), torch.randn(3, 8), torch.randn(5, 8)

    def functions_called(function) -> str:
        RecordingTensor.functions.clear()
        function()
        return " ".join(map(str, RecordingTensor.functions))

    assert "linear" in functions_called(lambda: onednn_transformer.linear(layer, a.as_subclass(RecordingTensor)))
    for first, second in ((a.as_subclass(RecordingTensor), b), (a, b.as_subclass(RecordingTensor))):
        called = functions_called(functools.partial(onednn_transformer.matmul_transposed, first, second))
        assert "matmul" in called and "mkldnn" not in called


@needs_onednn_linear
@torch.no_grad()
def test_a_layer_left_on_the_meta_device_gets_torch_s_error_and_no_prepacked_copy():
    """oneDNN multiplied CPU inputs by meta weights without a word, into a CPU tensor of no defined values."""
    layer = torch.nn.Linear(8, 4, device="meta")
    with pytest.raises(RuntimeError, match="meta is not on the expected device cpu"):
        onednn_transformer.linear(layer, torch.randn(3, 8))
    with onednn_transformer.onednn_prepacked([layer]):
        assert onednn_transformer._PREPACKED_WEIGHTS.get() == {}


@needs_onednn_linear
@pytest.mark.parametrize(
    "case", ["no bias", "frozen weight", "frozen bias", "inputs without gradients", "the bias alone trained"]
)
def test_gradients_of_a_layer_without_bias_or_with_frozen_parts_are_torch_s(monkeypatch, case):
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 4, bias=case != "no bias")
    if case.startswith("frozen"):
        getattr(layer, case.split()[1]).requires_grad_(False)
    if case == "the bias alone trained":  # BitFit, on inputs that need no gradient: its bias had none
        layer.weight.requires_grad_(False)
    inputs = torch.randn(2, 3, 8, requires_grad=case not in ("inputs without gradients", "the bias alone trained"))

    def gradients(linear) -> list[torch.Tensor | None]:
        inputs.grad = None
        layer.zero_grad(set_to_none=True)
        linear(layer, inputs).square().sum().backward()
        return [inputs.grad, *(parameter.grad for parameter in layer.parameters())]

    expected = gradients(lambda layer, inputs: layer(inputs))
    layouts = weight_layouts_of_onednn_calls(monkeypatch)
    ours = gradients(onednn_transformer.linear)
    assert layouts  # by oneDNN
    assert [grad is None for grad in ours] == [grad is None for grad in expected]
    for grad, reference in zip(ours, expected, strict=True):
        assert grad is None or torch.allclose(grad, reference, atol=1e-5)


@needs_onednn_linear
def test_fused_layers_inside_the_block_go_as_linear_would_where_it_leaves_onednn_s_product(monkeypatch):
    """With gradients, each layer on its own weight (the copies are detached); shapes that cannot be multiplied get
    torch's error naming them."""
    torch.manual_seed(0)
    group, inputs = (torch.nn.Linear(16, 8), torch.nn.Linear(16, 24)), torch.randn(3, 16)
    sum(layer(inputs).square().sum() for layer in group).backward()
    expected = [layer.weight.grad for layer in group]
    for layer in group:
        layer.weight.grad = None
    layouts = weight_layouts_of_onednn_calls(monkeypatch)
    with onednn_transformer.onednn_prepacked(group, fused=[group]):
        with torch.no_grad():
            outputs = onednn_transformer.linears(group, inputs)
        assert layouts == [torch._mkldnn]  # one product, though the first layer's output is narrower than its input
        assert all(torch.allclose(out, layer(inputs), atol=1e-5) for out, layer in zip(outputs, group, strict=True))
        layouts.clear()
        sum(output.square().sum() for output in onednn_transformer.linears(group, inputs)).backward()
        assert set(layouts) == {torch.strided}
        for layer, reference in zip(group, expected, strict=True):
            assert torch.allclose(layer.weight.grad, reference, atol=1e-5)
        for layer in group:  # the biases alone trained (BitFit): they had no gradients
            layer.weight.requires_grad_(False)
            layer.bias.grad = None
        sum(output.sum() for output in onednn_transformer.linears(group, inputs)).backward()
        assert all(torch.equal(layer.bias.grad, torch.full((layer.out_features,), 3.0)) for layer in group)
        with (
            torch.no_grad(),
            pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(3x48 and 16x8\)"),
        ):
            onednn_transformer.linears(group, torch.randn(3, 48))


@needs_onednn_linear
def test_a_block_inside_another_keeps_the_outer_block_s_copies():
    layer = torch.nn.Linear(8, 4)
    with onednn_transformer.onednn_prepacked([layer]):
        outer = onednn_transformer._PREPACKED_WEIGHTS.get()
        with onednn_transformer.onednn_prepacked([layer, torch.nn.Linear(8, 4)]):
            assert onednn_transformer._PREPACKED_WEIGHTS.get() is outer  # no second copy of the weights
        assert onednn_transformer._PREPACKED_WEIGHTS.get() is outer


@needs_onednn_linear
def test_torch_compile_traces_torch_s_linear_not_onednn_s():
    """The compiler's backend chooses the kernels (inductor's CPU backend may take oneDNN's itself)."""
    layer, graphs = torch.nn.Linear(8, 4), []

    def recording_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(lambda x: onednn_transformer.linear(layer, x), backend=recording_backend, fullgraph=True)
    with torch.no_grad():
        compiled(torch.randn(3, 8))
    targets = " ".join(str(node.target) for graph in graphs for node in graph.graph.nodes)
    assert "linear" in targets and "mkldnn" not in targets


@needs_onednn_linear
def test_products_that_record_no_gradient_take_onednn_and_the_copies_with_grad_mode_on(monkeypatch):
    """Grad mode is on by default: a frozen model called without `torch.no_grad()` records nothing either."""
    torch.manual_seed(0)
    layer, inputs = torch.nn.Linear(8, 4, bias=False).requires_grad_(False), torch.randn(3, 8)  # as lm_head
    assert onednn_linear_calls(lambda: onednn_transformer.matmul_transposed(inputs, layer.weight)) == 1
    layouts = weight_layouts_of_onednn_calls(monkeypatch)
    with onednn_transformer.onednn_prepacked([layer]):
        output = onednn_transformer.linear(layer, inputs)
    assert layouts == [torch._mkldnn] and torch.allclose(output, layer(inputs), atol=1e-5)
