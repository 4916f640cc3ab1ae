"""Linear layers on oneDNN (x86 CPUs not made by Intel): how this model's products run fast on a CPU, apart from
what they compute.

`modeling_transformer.py` calls every linear layer through `linear` (and a decoding step's self-attention
projections through `linears`); the fused training loss multiplies through `matmul_transposed`. Each computes what
`nn.Linear` / `@` would, to float32 rounding, with oneDNN's kernel where `takes_onednn` says so and PyTorch's own
elsewhere (GPUs, other dtypes, autocast, torch.compile, replaced or hooked layers). While decoding,
`onednn_prepacked` lays the weights out once for oneDNN instead of at every call. Nothing here is in the paper:
the model reads the same without this file's speed.

Remote code, beside `modeling_transformer.py`: it imports only torch.
"""

import contextlib
import contextvars
import platform
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as torch_module


def _x86_vendor() -> str | None:
    """The CPU's vendor string (`GenuineIntel`, `AuthenticAMD`, ...) where the system tells it, else None."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:  # Linux
            for line in cpuinfo:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    processor = platform.processor()  # Windows: "Intel64 Family 6 Model 85 Stepping 7, GenuineIntel"
    return next((vendor for vendor in ("GenuineIntel", "AuthenticAMD") if vendor in processor), None)


def prefers_onednn(vendor: str | None) -> bool:
    """Whether this model's linear layers run faster on oneDNN than on MKL, PyTorch's own, on an x86 CPU of `vendor`:
    on CPUs not made by Intel, where MKL picks slow kernels (1.5-2.3x oneDNN's time at this model's shapes on an AMD
    EPYC); not on Intel's, where MKL ran faster (training 1.14-1.34x, decoding 1.05-1.12x on a Xeon: docs/results.md),
    nor where the vendor is unknown. CTranslate2 chooses its backend the same way."""
    return vendor is not None and vendor != "GenuineIntel"


# oneDNN's linear kernel, as PyTorch ships it (what torch.compile's CPU backend calls), where this CPU can run it;
# taken where it beats MKL.
_ONEDNN_KERNEL = platform.machine().lower() in ("x86_64", "amd64") and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_ONEDNN_LINEAR = _ONEDNN_KERNEL and prefers_onednn(_x86_vendor())


# torch.export in torch < 2.7, which has no `is_exporting`, traces with dynamo, which `is_compiling` tells: so the
# remote code runs on every torch transformers runs on (2.6 and later).
_is_exporting = getattr(torch.compiler, "is_exporting", torch.compiler.is_compiling)


def _onednn_on() -> bool:
    """What `takes_onednn` asks of the context (CPU, autocast, torch's switch, compilation, torch.func), whatever the
    tensors. Asked for every linear layer: torch's own checks, not transformers' wrappers, which import at every
    call."""
    return (
        _ONEDNN_LINEAR
        and not torch.compiler.is_compiling()
        and not _is_exporting()
        and not torch.is_autocast_enabled("cpu")
        and torch.backends.mkldnn.enabled
        and not functorch_active()
    )


def functorch_active() -> bool:
    """Whether a torch.func transform (grad, vmap, jacrev, ...) is under way: autograd functions without
    `setup_context`, such as `OneDNNLinear`, cannot run inside one."""
    return torch._C._are_functorch_transforms_active()


def takes_onednn(hidden_states: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether products of these float32 CPU tensors are computed by oneDNN rather than MKL.

    PyTorch's CPU `nn.Linear` and `@` call MKL, which picks its kernels by processor vendor and runs well below
    oneDNN on AMD CPUs; oneDNN (shipped with PyTorch, which already uses it for convolutions and bfloat16 products)
    picks them by instruction set. So oneDNN is taken on x86 CPUs not made by Intel (`prefers_onednn`). The two
    agree to float32 rounding, not bit for bit. Autocast, torch.compile and export, tensor subclasses (torchao's
    quantised weights among them), other devices and dtypes keep MKL, and so does everything after
    `torch.backends.mkldnn.enabled = False`. So do shapes that cannot be multiplied: torch's error names them,
    oneDNN's ("could not create a primitive descriptor") does not.
    """
    return (
        type(hidden_states) is torch.Tensor
        and type(weight) in _PLAIN_TENSOR_TYPES
        and hidden_states.device.type == weight.device.type == "cpu"
        and hidden_states.dtype == weight.dtype == torch.float32
        and hidden_states.numel() > 0  # oneDNN has no product over an empty dimension (a backward's over 0 rows)
        and hidden_states.shape[-1] == weight.shape[-1]
        and _onednn_on()
    )


def _onednn_linear(
    hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """hidden_states @ weight.T + bias by oneDNN, outside autograd: (..., D_in) x (D_out, D_in) -> (..., D_out)."""
    return torch.ops.mkldnn._linear_pointwise.default(hidden_states, weight, bias, "none", [], "")


def _records_gradient(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd would record an operation on `tensors` (None for a layer's missing bias)."""
    return torch.is_grad_enabled() and any(tensor is not None and tensor.requires_grad for tensor in tensors)


# What a parameter or buffer is when nothing wraps it: a tensor subclass (torchao's quantised weights, DTensor)
# reports float32 but is no array oneDNN can read.
_PLAIN_TENSOR_TYPES = (torch.Tensor, nn.Parameter)


def is_plain_linear(module: nn.Module) -> bool:
    """An `nn.Linear` that calling would run as `nn.Linear.forward` on plain tensors, so that code using its weight
    directly computes what calling it would: not a subclass (an adapter, a quantised or parametrized layer), no
    hooks (pruning's, global ones), no `forward` replaced on the instance (accelerate's offloading brings the weights
    in that way, from the meta device), no tensor subclass as weight or bias (torchao's quantisation)."""
    if type(module) is not nn.Linear or "forward" in module.__dict__ or _has_hooks(module):
        return False
    if "bias" not in module._parameters:  # deleted, or set as a plain attribute that `_weight_and_bias` misses
        return False
    weight, bias = _weight_and_bias(module)
    return type(weight) in _PLAIN_TENSOR_TYPES and (bias is None or type(bias) in _PLAIN_TENSOR_TYPES)


def _weight_and_bias(module: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`module.weight` and `module.bias` of a linear layer, read from its parameters: `nn.Module`'s attribute lookup
    takes about 0.6 us a name here (it fails once before `__getattr__`), at every layer of every decoding step."""
    return module._parameters.get("weight"), module._parameters.get("bias")


def _has_hooks(module: nn.Module) -> bool:
    """Whether calling `module` would run hooks, its own or those for every module: `nn.Module.__call__`'s test."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
        or torch_module._global_backward_hooks
        or torch_module._global_backward_pre_hooks
    )


def matmul_transposed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T, by oneDNN where `takes_onednn` says so and no gradient is asked of it (the products of autograd
    functions, such as the fused loss's)."""
    if takes_onednn(a, b) and not _records_gradient(a, b):
        return _onednn_linear(a, b)
    return a @ b.T


class OneDNNLinear(torch.autograd.Function):
    """`F.linear`'s value and gradients (input, weight, bias), each of its three products computed by oneDNN."""

    @staticmethod
    def forward(ctx, hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(hidden_states, weight)
        return _onednn_linear(hidden_states, weight, bias)  # (..., D_out)

    @staticmethod
    def backward(
        ctx, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        hidden_states, weight = ctx.saved_tensors
        # With create_graph=True (a second derivative) autograd records the backward: plain products then, which
        # it can differentiate.
        product = matmul_transposed if torch.is_grad_enabled() else _onednn_linear
        grad_rows = grad_output.reshape(-1, grad_output.shape[-1])  # (N, D_out)
        grad_hidden_states = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_hidden_states = product(grad_output, weight.T)  # grad @ W: (..., D_in)
        if ctx.needs_input_grad[1]:
            rows = hidden_states.reshape(-1, hidden_states.shape[-1])  # (N, D_in)
            grad_weight = product(grad_rows.T, rows.T)  # grad^T @ x: (D_out, D_in)
        if ctx.needs_input_grad[2]:  # False where there is no bias
            grad_bias = grad_rows.sum(dim=0)  # (D_out,)
        return grad_hidden_states, grad_weight, grad_bias


class FusedLinear(NamedTuple):
    """Linear layers that read the same input, as one: their weights stacked and laid out for oneDNN, their biases
    stacked (or None), and each layer's share of the output."""

    weight: torch.Tensor  # laid out by `_reorder_linear_weight`: (sum of D_out, D_in) before
    bias: torch.Tensor | None
    widths: list[int]


# The weights of `onednn_prepacked`'s block (None outside one): laid-out copies by the layer they copy, and
# `FusedLinear`s by the tuple of layers they stand for. A context variable: each thread's decoding loop has its own.
_PREPACKED_WEIGHTS: contextvars.ContextVar[dict[nn.Module | tuple[nn.Module, ...], torch.Tensor | FusedLinear] | None]
_PREPACKED_WEIGHTS = contextvars.ContextVar("prepacked_weights", default=None)


def linear(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """`module(hidden_states)`, computed by oneDNN for a float32 `nn.Linear` where `takes_onednn` says so, with
    gradients when autograd needs them, with its prepacked weight inside `onednn_prepacked`. A module with hooks or
    replaced (int8, adapters) is called as it is."""
    weight, bias = _weight_and_bias(module)
    if not (is_plain_linear(module) and takes_onednn(hidden_states, weight)):
        return module(hidden_states)
    if _records_gradient(hidden_states, weight, bias):  # the bias alone, as BitFit trains it, needs autograd too
        return OneDNNLinear.apply(hidden_states, weight, bias)
    prepacked = _PREPACKED_WEIGHTS.get()
    return _onednn_linear(hidden_states, prepacked.get(module, weight) if prepacked else weight, bias)


def linears(modules: tuple[nn.Module, ...], hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`linear(module, hidden_states)` for each of `modules`; in one product where `onednn_prepacked` fused them
    (the same values bit for bit, one call where there were several: the queries, keys and values of a decoding
    step's self-attention). The outputs are then views into that product's."""
    if all(map(is_plain_linear, modules)):  # hooks and replaced layers are called as they are, as in `linear`
        parameters = [tensor for module in modules for tensor in _weight_and_bias(module)]  # weight, bias, ...
        if takes_onednn(hidden_states, parameters[0]) and not _records_gradient(hidden_states, *parameters):
            prepacked = _PREPACKED_WEIGHTS.get()
            fused = prepacked.get(modules) if prepacked else None
            if fused is not None:
                return _onednn_linear(hidden_states, fused.weight, fused.bias).split(fused.widths, dim=-1)
    return tuple(linear(module, hidden_states) for module in modules)


def _prepackable(module: nn.Module) -> bool:
    return is_plain_linear(module) and module.weight.device.type == "cpu" and module.weight.dtype == torch.float32


def _fusable(group: tuple[nn.Module, ...]) -> bool:
    """Layers that one oneDNN product can stand for: plain float32 CPU layers of one input width, all with a bias
    or none."""
    return (
        all(_prepackable(module) for module in group)
        and len({module.in_features for module in group}) == 1
        and len({module.bias is None for module in group}) == 1
    )


@contextlib.contextmanager
def onednn_prepacked(modules: Iterable[nn.Module], fused: Iterable[tuple[nn.Module, ...]] = ()) -> Iterator[None]:
    """Within the block, `linear` multiplies by copies of these layers' weights laid out once for oneDNN's kernel
    (where it runs them on oneDNN, without gradients), instead of the plain weights, which oneDNN lays out anew at
    every call. That costs most when few rows are multiplied, as in decoding steps: at 4 rows a step of the
    benchmarks' d_model 256 model took 2.8 ms instead of 4.3, one of the base model 12 instead of 18
    (docs/results.md). Each group of `fused` (layers that read the same input) becomes one product for `linears`,
    its layers' weights stacked, instead of one copy each. The results are the same bit for bit. The copies hold the
    layers' weights a second time until the block ends (about the decoder's size); the weights must not change
    inside it."""
    if not _onednn_on() or _PREPACKED_WEIGHTS.get() is not None:
        yield
        return
    prepacked: dict[nn.Module | tuple[nn.Module, ...], torch.Tensor | FusedLinear] = {}
    for group in filter(_fusable, map(tuple, fused)):
        weight = torch.cat([module.weight.detach() for module in group])  # (sum of D_out, D_in)
        bias = torch.cat([module.bias.detach() for module in group]) if group[0].bias is not None else None
        widths = [module.out_features for module in group]
        prepacked[group] = FusedLinear(torch.ops.mkldnn._reorder_linear_weight(weight), bias, widths)
    in_fused_groups = {module for key in prepacked for module in key}
    for module in modules:
        if _prepackable(module) and module not in in_fused_groups:
            prepacked[module] = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach())
    token = _PREPACKED_WEIGHTS.set(prepacked)
    try:
        yield
    finally:
        _PREPACKED_WEIGHTS.reset(token)
