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


def _onednn_on() -> bool:
    """What `takes_onednn` asks of the context (CPU, autocast, torch's switch, compilation, torch.func), whatever the
    tensors. Asked for every linear layer: torch's own checks, not transformers' wrappers, which import at every
    call."""
    return (
        _ONEDNN_LINEAR
        and not torch.compiler.is_compiling()
        and not torch.compiler.is_exporting()
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
    agree to float32 rounding, not bit for bit. Autocast, torch.compile and export, tensor subclasses, other devices
    and dtypes keep MKL, and so does everything after `torch.backends.mkldnn.enabled = False`. So do shapes that
    cannot be multiplied: torch's error names them, oneDNN's ("could not create a primitive descriptor") does not.
    """
    return (
        type(hidden_states) is torch.Tensor
        and hidden_states.device.type == "cpu"
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


def _records_gradient(*tensors: torch.Tensor) -> bool:
    """Whether autograd would record an operation on `tensors`."""
    return torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors)


def is_plain_linear(module: nn.Module) -> bool:
    """An `nn.Linear` itself (not a subclass, an adapter or a quantised layer) without hooks: code that uses its
    weight directly computes what calling it would."""
    return type(module) is nn.Linear and not module._forward_hooks and not module._forward_pre_hooks


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
        ctx.has_bias = bias is not None
        return _onednn_linear(hidden_states, weight, bias)  # (..., D_out)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
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
        if ctx.has_bias and ctx.needs_input_grad[2]:
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
    if not (is_plain_linear(module) and takes_onednn(hidden_states, module.weight)):
        return module(hidden_states)
    if _records_gradient(hidden_states, module.weight):
        return OneDNNLinear.apply(hidden_states, module.weight, module.bias)
    prepacked = _PREPACKED_WEIGHTS.get()
    weight = prepacked.get(module, module.weight) if prepacked else module.weight
    return _onednn_linear(hidden_states, weight, module.bias)


def linears(modules: tuple[nn.Module, ...], hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`linear(module, hidden_states)` for each of `modules`; in one product where `onednn_prepacked` fused them
    (the same values bit for bit, one call where there were several: the queries, keys and values of a decoding
    step's self-attention). The outputs are then views into that product's."""
    if (
        all(map(is_plain_linear, modules))  # hooks and replaced layers are called as they are, as in `linear`
        and takes_onednn(hidden_states, modules[0].weight)
        and not _records_gradient(hidden_states, *(module.weight for module in modules))
    ):
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
