"""The two baselines labkit's ``grouped_mm(x, w, counts)`` is measured against, with its call shape.

* ``host_sync_loop``: the story's MoE loop. ``counts.tolist()`` copies the token counts to the
  host, which waits for every kernel queued before it (the router, in a real layer): the CPU
  stalls until the GPU drains, then launches one ``torch.matmul`` (cuBLAS) per expert. It cannot
  be captured in a CUDA graph (the copy-and-wait is not allowed while a stream is capturing).
* ``torch_grouped_mm``: PyTorch's own grouped GEMM with the offsets on the device,
  ``torch.nn.functional.grouped_mm`` where this torch has it (2.13 does), else ``torch._grouped_mm``
  (torch 2.8 on); the public function only forwards to the private op.
* backward (dgrad and wgrad), what PyTorch gives a model that calls the op: autograd of it
  (``torch_autograd_backward``; derivatives.yaml maps ``_grouped_mm``'s inputs to
  ``_grouped_mm_mat1_backward`` / ``_grouped_mm_mat2_backward``, each one more call of the op),
  and the same products called directly (``torch_grouped_mm_dgrad`` with w in either layout,
  ``torch_grouped_mm_wgrad``), without autograd's bookkeeping. The benchmark times all of them
  and compares labkit with the fastest.

What torch's op asks of its inputs (read from the sources: ``_grouped_mm_validate_inputs`` and
``check_valid_strides_and_return_transposed`` in aten/src/ATen/native/GroupedMMUtils.h,
``_grouped_mm_cuda`` in aten/src/ATen/native/cuda/GroupedBlas.cpp (Blas.cpp in 2.8),
``bf16bf16_grouped_mm`` in aten/src/ATen/native/cuda/GroupMM.cu, and the meta function in
torch/_meta_registrations.py of torch 2.13):

* x [M, K] (2-D, sliced by ``offs``) and w [E, K, N] (3-D); the product is x_e @ w[e], as here.
* ``offs``: 1-D **int32** END offsets (``offs[e]`` = first row after expert e), on the device:
  ``torch.cumsum(counts, 0, dtype=torch.int32)``. Computed inside the timed call here (one tiny
  kernel), since labkit's kernel takes the counts themselves.
* each operand needs one of its last two strides to be 1 and the other a multiple of 16 bytes
  (8 bf16 elements), and a 16-byte-aligned data pointer. Both layouts of w pass: N-contiguous
  (``w`` as labkit takes it) and K-contiguous ("column-major",
  ``w.transpose(-2, -1).contiguous().transpose(-2, -1)``, the layout of an ``nn.Linear``-style
  [E, N, K] weight transposed); the CUTLASS kernel is instantiated for all four row/column
  combinations of x and w. There is no column-major requirement for bf16 (that one is for
  ``_scaled_grouped_mm``, FP8). Which layout is faster is measured, not assumed: the benchmark
  times both, with the K-contiguous copy made once outside the timed call.
* no bias, output dtype = input dtype; fewer than 1024 groups (CUTLASS path).
* the fast path (no host sync) is CUTLASS and runs on bf16 on sm_90 (torch 2.8: sm_90 only,
  anything else refused) and sm_90/sm_100 (torch >= 2.9). Elsewhere torch >= 2.9 falls back to
  ``_grouped_mm_fallback``: ``offs.cpu()`` and one ``mm`` per group, a host sync like the story's
  loop. ``torch_grouped_mm_available`` says which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Counts = Sequence[int] | torch.Tensor


def host_sync_loop(x: torch.Tensor, w: torch.Tensor, counts: Counts, out: torch.Tensor | None = None) -> torch.Tensor:
    """out[rows of e] = x[rows of e] @ w[e] by a Python loop over experts, as the story's MoE
    layer does it: ``counts.tolist()`` (a device-to-host copy that synchronises), then one
    ``torch.matmul`` per expert with tokens, into ``out`` ([M, N], x's dtype; pass it
    preallocated so that allocation is not part of what is timed). Returns ``out``."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [M, K], got {_what(x)}")
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.shape[1] != x.shape[1]:
        raise ValueError(f"w: expected a 3-D tensor [E, K, N] with K = {x.shape[1]}, got {_what(w)}")
    M, N = x.shape[0], w.shape[2]
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != (M, N) or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(f"out: expected [M, N] = {[M, N]} of {x.dtype} on {x.device}, got {_what(out)}")
    values = counts.tolist() if isinstance(counts, torch.Tensor) else list(counts)  # the sync
    if len(values) != w.shape[0]:
        raise ValueError(f"counts: expected {w.shape[0]} counts (one per expert of w), got {len(values)}")
    if sum(values) != M or min(values, default=0) < 0:
        raise ValueError(f"counts: expected non-negative counts summing to M = {M}, got sum {sum(values)}")
    row = 0
    for e, m in enumerate(values):
        if m:
            torch.matmul(x[row : row + m], w[e], out=out[row : row + m])
        row += m
    return out


def _op() -> Callable | None:
    """torch's grouped GEMM: the public name where this torch has it, else the private one."""
    fn = getattr(torch.nn.functional, "grouped_mm", None)
    return fn if fn is not None else getattr(torch, "_grouped_mm", None)


def op_name() -> str | None:
    """The name of the op ``torch_grouped_mm`` calls on this torch, or None."""
    if getattr(torch.nn.functional, "grouped_mm", None) is not None:
        return "torch.nn.functional.grouped_mm"
    return "torch._grouped_mm" if getattr(torch, "_grouped_mm", None) is not None else None


def end_offsets(counts: Counts, device: torch.device) -> torch.Tensor:
    """int32 END offsets of the experts' rows on ``device``: what torch's op takes as ``offs``.
    A device tensor of counts stays on the device (``torch.cumsum``: no sync)."""
    if isinstance(counts, torch.Tensor):
        if counts.dim() != 1 or counts.dtype.is_floating_point or counts.dtype == torch.bool:
            raise ValueError(f"counts: expected a 1-D integer tensor, got {_what(counts)}")
        if counts.device != device and counts.device.type != "cpu":
            raise ValueError(f"counts: is on {counts.device}, x is on {device}")
        return torch.cumsum(counts.to(device, non_blocking=True), 0, dtype=torch.int32)
    ends, total = [], 0
    for c in counts:
        total += int(c)
        ends.append(total)
    return torch.tensor(ends, dtype=torch.int32, device=device)


def torch_grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: Counts) -> torch.Tensor:
    """x_e @ w[e] for every expert by PyTorch's grouped GEMM; ``counts`` as for labkit's
    ``grouped_mm`` (a CUDA tensor is turned into offsets on the device). w: [E, K, N] with either
    last stride 1 (see the module docstring). Returns a new [M, N] tensor (torch's op has no
    ``out=``). Raises RuntimeError where this torch has no such op."""
    op = _op()
    if op is None:
        raise RuntimeError(f"torch {torch.__version__} has no grouped GEMM op (torch._grouped_mm appeared in 2.8)")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [M, K], got {_what(x)}")
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        raise ValueError(f"w: expected a 3-D tensor [E, K, N], got {_what(w)}")
    return op(x, w, offs=end_offsets(counts, x.device))


def torch_grouped_mm_dgrad(dy: torch.Tensor, w: torch.Tensor, counts: Counts) -> torch.Tensor:
    """dx_e = dy_e @ w[e]^T by torch's grouped GEMM: the call autograd of ``torch._grouped_mm``
    makes for its first input (``_grouped_mm_mat1_backward``: the op on ``w.transpose(-2, -1)``).
    dy: [M, N]; w: [E, K, N] in either layout. Returns a new [M, K] tensor."""
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        raise ValueError(f"w: expected a 3-D tensor [E, K, N], got {_what(w)}")
    return torch_grouped_mm(dy, w.transpose(-2, -1), counts)


def torch_grouped_mm_wgrad(x: torch.Tensor, dy: torch.Tensor, counts: Counts) -> torch.Tensor:
    """dW_e = x_e^T @ dy_e by torch's grouped GEMM, the ragged dimension being the reduction: the
    call autograd makes for the weight (``_grouped_mm_mat2_backward``: the op on ``x.t()`` and dy,
    2-D by 2-D with ``offs``). Returns a new [E, K, N] tensor in x's dtype."""
    op = _op()
    if op is None:
        raise RuntimeError(f"torch {torch.__version__} has no grouped GEMM op (torch._grouped_mm appeared in 2.8)")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [M, K], got {_what(x)}")
    if not isinstance(dy, torch.Tensor) or dy.dim() != 2 or dy.shape[0] != x.shape[0]:
        raise ValueError(f"dy: expected a 2-D tensor [M, N] with M = {x.shape[0]}, got {_what(dy)}")
    return op(x.t(), dy, offs=end_offsets(counts, x.device))


def torch_autograd_backward(x: torch.Tensor, w: torch.Tensor, counts: Counts, dy: torch.Tensor, wrt: str):
    """A call that runs autograd's backward of ``torch_grouped_mm(x, w, counts)`` for one input:
    ``wrt`` "x" (dgrad) or "w" (wgrad). The forward runs once, here, and its graph is kept
    (``retain_graph``); each call of the returned function runs ``torch.autograd.grad`` on it
    and returns the gradient (a new tensor): what a PyTorch model's backward pays for the op."""
    if wrt not in ("x", "w"):
        raise ValueError(f"wrt: {wrt!r} is not 'x' or 'w'")
    xr = x.detach().requires_grad_(wrt == "x")
    wr = w.detach().requires_grad_(wrt == "w")
    y = torch_grouped_mm(xr, wr, counts)
    target = xr if wrt == "x" else wr
    return lambda: torch.autograd.grad(y, target, dy, retain_graph=True)[0]


def k_major(w: torch.Tensor) -> torch.Tensor:
    """The same [E, K, N] values with K contiguous (stride 1 along K): the "column-major" layout,
    a copy made once, outside any timed call."""
    return w.transpose(-2, -1).contiguous().transpose(-2, -1)


def torch_grouped_mm_available(device) -> tuple[bool, str]:
    """Whether ``torch_grouped_mm`` runs torch's device-side fast path on ``device``, and why or
    why not in one line. False on the CPU, on GPUs other than sm_90 (and sm_100 from torch 2.9),
    and on a torch without the op (the op may still run there: on the CPU or through the
    fallback that copies the offsets to the host, which is not the baseline this lab wants)."""
    name = op_name()
    if name is None:
        return False, f"torch {torch.__version__} has no torch._grouped_mm (it appeared in torch 2.8)"
    device = torch.device(device)
    if device.type != "cuda":
        return False, (f"{name}'s fast path is a CUTLASS kernel for CUDA sm_90/sm_100; this is {device.type}")
    if not torch.cuda.is_available():
        return False, "no CUDA device is visible"
    major, minor = torch.cuda.get_device_capability(device)
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if major == 9:
        return True, f"{name} on sm_{major}{minor}: CUTLASS grouped GEMM, offsets read on the device"
    if major == 10 and version >= (2, 9):
        return True, f"{name} on sm_{major}{minor}: CUTLASS grouped GEMM, offsets read on the device"
    return False, (
        f"{name} runs its device-side kernel on sm_90 (and sm_100 from torch 2.9) only; on "
        f"sm_{major}{minor} torch {torch.__version__} refuses it or falls back to a loop that "
        f"copies the offsets to the host"
    )


def _what(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return type(t).__name__


__all__ = [
    "end_offsets",
    "host_sync_loop",
    "k_major",
    "op_name",
    "torch_autograd_backward",
    "torch_grouped_mm",
    "torch_grouped_mm_available",
    "torch_grouped_mm_dgrad",
    "torch_grouped_mm_wgrad",
]
