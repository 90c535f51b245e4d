"""Weight-only int8 / int4 linear layers for CPU: fewer bytes read per decoding step.

A decoding step of a small model on CPU is memory bound: every pass reads every weight once.
``quantize_cpu(model, "int8" | "int4")`` replaces the model's ``nn.Linear`` layers (the output
head included) with ``WeightOnlyLinear`` layers computed by PyTorch's own weight-only kernels:

* int8: ``aten._weight_int8pack_mm``, one scale per output channel (symmetric, absmax / 127);
* int4: ``aten._convert_weight_to_int4pack_for_cpu`` / ``aten._weight_int4pack_mm_for_cpu``,
  a scale and an offset per group of 32 input weights (the layout of GGUF's Q4_1 blocks).

Both kernels are fast only with bfloat16 activations (float32 inputs take a scalar path ~10x
slower, torch 2.13), so each layer casts its input to bfloat16 and its output back to the
model's dtype. Each output row depends only on its own input row (checked bitwise for 1..12
rows), so a verification pass over several positions computes what single-position passes
compute: every strategy run on the same quantized model is exact against target autoregressive
under greedy decoding. The quantized model is a different model from the float32 one (its
greedy text may differ); it is lossless against itself.

With int4 the output head stays int8, as GGUF's Q4_1 files keep it (Q8_0): on the embedded
SmolLM2 (a Q4_1 file), int4 blocks with an int8 head agree with the float32 model's greedy token
at 96.5% of the positions of a 400-token text (int4 head: 82%; int8 everywhere: 93%). Layers whose
shapes the int4 kernel refuses (output features not a multiple of 16, input features not a
multiple of the group size) are quantized to int8 too.
"""
from typing import Dict, Optional

import torch
from torch import Tensor
from torch.nn import Module

CPU_QUANTIZATIONS = ("int8", "int4")
INT4_GROUP = 32
_ACT = torch.bfloat16  # the kernels' fast path


def _int8(weight: Tensor):
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(_ACT)  # rounded first, so the grid matches it
    q = torch.round(w / scale.float()[:, None]).clamp(-128, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def _int4(weight: Tensor, group: int = INT4_GROUP):
    w = weight.detach().float()
    n, k = w.shape
    blocks = w.reshape(n, k // group, group)
    low, high = blocks.amin(-1), blocks.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-12).to(_ACT).float()
    # the kernel computes (q - 8) * scale + zero: zero is the value of q = 8, low the value of q = 0
    zero = (low + 8 * scale).to(_ACT).float()
    q = torch.round((blocks - zero[..., None]) / scale[..., None] + 8).clamp(0, 15).to(torch.int32).reshape(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
    scales_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(_ACT)  # [k // group, n, 2]
    return packed, scales_zeros


def int4_fits(linear: torch.nn.Linear, group: int = INT4_GROUP) -> bool:
    return linear.out_features % 16 == 0 and linear.in_features % group == 0


class WeightOnlyLinear(Module):
    """An ``nn.Linear`` with int8 or int4 weights and bfloat16 activations (CPU weight-only kernels)."""

    def __init__(self, linear: torch.nn.Linear, bits: int):
        super().__init__()
        if bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {bits}")
        self.in_features, self.out_features, self.bits = linear.in_features, linear.out_features, bits
        if bits == 4:
            packed, scales = _int4(linear.weight)
        else:
            packed, scales = _int8(linear.weight)
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)

    @property
    def weight(self) -> Tensor:
        """The de-quantized weight ``[out, in]`` (computed on demand, for code that reads it)."""
        eye = torch.eye(self.in_features, dtype=_ACT, device=self.packed.device)
        return self._matmul(eye).t().float()

    def _matmul(self, x: Tensor) -> Tensor:
        if self.bits == 4:
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, INT4_GROUP, self.scales)
        return torch.ops.aten._weight_int8pack_mm(x, self.packed, self.scales)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        y = self._matmul(x.reshape(-1, shape[-1]).to(_ACT).contiguous()).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int{self.bits}"


def cpu_kernels_available() -> bool:
    """Whether this torch has the CPU weight-only kernels."""
    try:
        return bool(torch.ops.aten._weight_int8pack_mm and torch.ops.aten._weight_int4pack_mm_for_cpu
                    and torch.ops.aten._convert_weight_to_int4pack_for_cpu)
    except (AttributeError, RuntimeError):
        return False


def quantize_cpu(model: Module, quantize: str) -> Dict[str, int]:
    """Replace, in place, every floating-point CPU ``nn.Linear`` of ``model`` with a ``WeightOnlyLinear``
    (``quantize`` "int8" or "int4"; with int4 the output head is int8); returns how many layers got each width, e.g. ``{"int4": 210, "int8": 1}``."""
    if quantize not in CPU_QUANTIZATIONS:
        raise ValueError(f"quantize must be one of {CPU_QUANTIZATIONS}, got {quantize!r}")
    if not cpu_kernels_available():
        raise ValueError("this torch build has no CPU weight-only int8/int4 kernels (torch >= 2.6 has them)")
    counts: Dict[str, int] = {}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if type(child) is not torch.nn.Linear or child.weight.device.type != "cpu" or not child.weight.is_floating_point():
                continue
            bits = 4 if quantize == "int4" and child is not head and int4_fits(child) else 8
            with torch.no_grad():
                parent._modules[name] = WeightOnlyLinear(child, bits)
            counts[f"int{bits}"] = counts.get(f"int{bits}", 0) + 1
    return counts


def model_quantization(model: Module) -> Optional[str]:
    """How ``model``'s weights are quantized, read from its layers and config: "int4" or "int8"
    (``WeightOnlyLinear`` layers: "int4" when any is 4-bit), the loader's ``quant_method``
    (bitsandbytes, quanto), or None."""
    bits = {module.bits for module in model.modules() if isinstance(module, WeightOnlyLinear)}
    if bits:
        return "int4" if 4 in bits else "int8"
    config = getattr(getattr(model, "config", None), "quantization_config", None)
    method = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    return str(getattr(method, "value", method)) if method else None
