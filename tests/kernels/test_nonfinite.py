"""NaN and +-inf through every kernel of the public API (collectives aside), against torch.

"No silent wrong answer": an output that torch's reference op makes NaN or +-inf must not come
back finite from labkit, and a finite one must not turn non-finite. Each case builds fresh random
inputs with NaN / +inf / -inf planted at random positions, runs labkit's op and torch's reference
op (float64 where there is arithmetic) on the same inputs, and compares WHERE the output is NaN,
+inf and -inf (and that the finite outputs agree within the op's rounding).

Where labkit documents a different, never-finite-wrong answer, the case says so and compares
what is documented:

* ``sc_matmul``: out[i, j] is NaN wherever row i of a or column j of b holds a NaN or an inf
  (torch gives +-inf or NaN there; the SC product cannot work out the sign without a second
  product): the NON-FINITE positions must equal torch's, and are NaN;
* FP8 (``quantize``, ``fp8_gemm``, ``FP8Linear``): the reference is the package's own
  ``quantize_reference`` (torch's clamp and fp8 cast), where +-inf SATURATES to +-fp8_max, as
  TransformerEngine's casts do; NaN stays NaN. So an FP8Linear output row is NaN exactly where
  nn.Linear's is NaN from a NaN input, and finite where the input held only +-inf.

The collectives (``labkit.kernels.comm``) are not covered here (being refactored elsewhere).
CPU tier: everything runs under the Triton interpreter at small sizes; on a GPU machine the same
cases run compiled on cuda:0, and ``fp8_gemm``'s ``scaled_mm`` backend (marked gpu) too."""

import pytest
import torch

import labkit  # noqa: F401  (picks the tier before the kernels are imported)
from labkit.kernels import copy, grouped_mm, grouped_mm_wgrad, sc_matmul, triton_matmul
from labkit.kernels.fp8 import DelayedScaling, FP8Linear, fp8_autocast, fp8_gemm, quantize
from labkit.kernels.fp8.cast import Quantized, quantize_reference
from labkit.kernels.fp8.recipe import FP8Meta
from labkit.kernels.grouped_linear import GroupedLinear
from labkit.workbench.tier import kernel_device

DEV = kernel_device()
SPECIAL = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _plant(t: torch.Tensor, g: torch.Generator, kinds=("nan", "inf", "-inf")) -> torch.Tensor:
    """t (a CPU tensor) with each of ``kinds`` written at a random position, distinct ones."""
    flat = t.view(-1)
    where = torch.randperm(flat.numel(), generator=g)[: len(kinds)]
    for i, kind in zip(where.tolist(), kinds):
        flat[i] = SPECIAL[kind]
    return t


def _randn(*shape, g, dtype=torch.float32, kinds=()):
    return _plant(torch.randn(*shape, generator=g), g, kinds).to(dtype).to(DEV)


def _pattern(t: torch.Tensor) -> dict:
    t = t.detach().double().cpu()
    return {"nan": t.isnan(), "+inf": t.isposinf(), "-inf": t.isneginf()}


def assert_same_nonfinite(got: torch.Tensor, want: torch.Tensor, rtol: float, what: str = "") -> None:
    """NaN, +inf and -inf at the same positions; finite outputs within rtol of max |want|."""
    assert got.shape == want.shape, (got.shape, want.shape)
    pg, pw = _pattern(got), _pattern(want)
    for k in pg:
        bad = (pg[k] != pw[k]).nonzero().tolist()
        assert not bad, f"{what}{k}: labkit and torch differ at {bad[:5]} ({len(bad)} positions)"
    finite = want.detach().double().cpu().isfinite()
    assert finite.any(), "the case left no finite output to compare"
    g, w = got.detach().double().cpu()[finite], want.detach().double().cpu()[finite]
    assert (g - w).abs().max() <= rtol * w.abs().max().clamp_min(1e-30), f"{what}finite outputs differ"


def assert_nan_where_torch_nonfinite(got: torch.Tensor, want: torch.Tensor) -> None:
    """labkit's documented answer: NaN exactly where torch's is non-finite (NaN or +-inf)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert torch.equal(~got.isfinite(), ~want.isfinite())
    assert got[~got.isfinite()].isnan().all()


TOL = {torch.float32: 1e-2, torch.float16: 5e-3, torch.bfloat16: 3e-2}  # fp32: tf32 dots on a GPU
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def g():
    seed = torch.seed() % 2**31
    print(f"seed {seed}")  # shown when the test fails
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------
# copy, matmul, sc_matmul


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_keeps_every_bit(g, dtype):
    src = _randn(3, 5000, g=g, dtype=dtype, kinds=("nan", "inf", "-inf"))
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(copy(src).view(bits), src.view(bits))  # torch's clone: the same bits


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["a", "b", "both"])
def test_triton_matmul(g, dtype, where):
    a = _randn(37, 40, g=g, dtype=dtype, kinds=("nan", "inf", "-inf") if where != "b" else ())
    b = _randn(40, 29, g=g, dtype=dtype, kinds=("nan", "inf", "-inf") if where != "a" else ())
    want = (a.double() @ b.double()).to(dtype)
    assert_same_nonfinite(triton_matmul(a, b), want, TOL[dtype])


@pytest.mark.parametrize("granularity, chunk_d", [("per_row", 0), ("per_tensor", 0), ("per_row", 16)])
def test_sc_matmul_is_nan_where_torch_is_not_finite(g, granularity, chunk_d):
    a = _randn(12, 40, g=g, kinds=("nan", "inf"))
    b = _randn(40, 20, g=g, kinds=("-inf",))
    got = sc_matmul(a, b, granularity=granularity, chunk_d=chunk_d, stoc_len=64)
    assert_nan_where_torch_nonfinite(got, a.double() @ b.double())


# ----------------------------------------------------------------------------------------------
# grouped GEMMs


def _splits(g, E, M):
    cuts = sorted(torch.randint(0, M + 1, (E - 1,), generator=g).tolist())
    return [b - a for a, b in zip([0] + cuts, cuts + [M])]


def _loop(x, w, splits):
    rows, out = 0, []
    for e, m in enumerate(splits):
        out.append(x[rows : rows + m].double() @ w[e].double())
        rows += m
    return torch.cat(out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["x", "w"])
def test_grouped_mm(g, dtype, where):
    M, K, N, E = 40, 24, 20, 3
    splits = _splits(g, E, M)
    x = _randn(M, K, g=g, dtype=dtype, kinds=("nan", "inf", "-inf") if where == "x" else ())
    w = _randn(E, K, N, g=g, dtype=dtype, kinds=("nan", "inf", "-inf") if where == "w" else ())
    counts = torch.tensor(splits, device=DEV)
    assert_same_nonfinite(grouped_mm(x, w, counts), _loop(x, w, splits).to(dtype), TOL[dtype])
    # dgrad: the transposed weights of an [E, N, K] tensor, without a copy
    dy = _randn(M, K, g=g, dtype=dtype)
    w_nk = _randn(E, N, K, g=g, dtype=dtype, kinds=("nan", "inf") if where == "w" else ())
    assert_same_nonfinite(
        grouped_mm(dy, w_nk.transpose(1, 2), counts), _loop(dy, w_nk.transpose(1, 2), splits).to(dtype), TOL[dtype]
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["x", "dy"])
def test_grouped_mm_wgrad(g, dtype, where):
    M, K, N, E = 40, 24, 20, 3
    splits = _splits(g, E, M)
    x = _randn(M, K, g=g, dtype=dtype, kinds=("nan", "inf", "-inf") if where == "x" else ())
    dy = _randn(M, N, g=g, dtype=dtype, kinds=("nan", "inf", "-inf") if where == "dy" else ())
    rows, want = 0, []
    for m in splits:
        want.append(x[rows : rows + m].double().T @ dy[rows : rows + m].double())
        rows += m
    got = grouped_mm_wgrad(x, dy, torch.tensor(splits, device=DEV))  # fp32 out
    assert_same_nonfinite(got, torch.stack(want).float(), TOL[dtype])


def test_grouped_linear_forward_and_backward(g):
    """The module against autograd of a float64 loop: outputs, dx and dW."""
    M, K, N, E = 30, 16, 12, 3
    splits = _splits(g, E, M)
    lin = GroupedLinear(E, K, N, bias=False, device=DEV)
    x = _randn(M, K, g=g, kinds=("nan", "inf")).requires_grad_()
    xr = x.detach().double().requires_grad_()
    wr = lin.weight.detach().double().requires_grad_()
    y = lin(x, torch.tensor(splits, device=DEV))
    yr = _loop(xr, wr, splits)
    assert_same_nonfinite(y, yr, 1e-2, "y ")
    dy = _randn(M, N, g=g)
    y.backward(dy)
    yr.backward(dy.double())
    assert_same_nonfinite(x.grad, xr.grad, 1e-2, "dx ")
    assert_same_nonfinite(lin.weight.grad, wr.grad, 1e-2, "dW ")


# ----------------------------------------------------------------------------------------------
# FP8: the package's quantize_reference (torch's clamp and fp8 cast) is the reference


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize(g, fp8_dtype, dtype):
    x = _randn(5, 3000, g=g, dtype=dtype, kinds=("nan", "inf", "-inf"))
    meta = FP8Meta.create(1, 2, DEV)
    meta.scale.fill_(float(torch.empty(()).uniform_(0.5, 40.0, generator=g)))
    q = quantize(x, meta.scale[0:1], meta.amax_history[0, 0:1], fp8_dtype)
    data, amax, _ = quantize_reference(x, meta.scale[0:1], fp8_dtype)
    assert_same_nonfinite(q.data.float(), data.float(), 0.0)
    assert meta.amax_history[0, 0].isnan().item() and amax.isnan().item()


def _quantized(t, fp8_dtype=torch.float8_e4m3fn):
    scale = torch.full((1,), 448.0 / 8, device=DEV)
    data, _, inv = quantize_reference(t, scale, fp8_dtype)
    return Quantized(data, inv)


@pytest.mark.parametrize("backend", ["emulated", pytest.param("scaled_mm", marks=pytest.mark.gpu)])
def test_fp8_gemm(g, backend):
    """a @ b.T of FP8 operands holding NaN (and inf saturated by the cast) against float64."""
    a = _quantized(_randn(32, 48, g=g, kinds=("nan", "inf")))
    b = _quantized(_randn(16, 48, g=g, kinds=("nan", "-inf")))
    want = a.dequantize().double() @ b.dequantize().double().T
    got = fp8_gemm(a, b, out_dtype=torch.float32, backend=backend)
    assert_same_nonfinite(got, want, 1e-3)


def test_fp8_linear_in_autocast(g):
    """NaN in x gives the NaN rows nn.Linear gives; an inf saturates (the reference's cast), so
    its row is finite here where nn.Linear's is +-inf: the recipe keeps the scale either way."""
    K, N = 32, 16
    lin = FP8Linear(K, N, recipe=DelayedScaling(amax_history_len=2), device=DEV)
    x = _randn(16, K, g=g, kinds=("nan", "inf", "-inf"))  # 16: scaled_mm on a GPU
    with fp8_autocast(recipe=DelayedScaling(amax_history_len=2)):
        y = lin(x)
    plain = torch.nn.functional.linear(x.double(), lin.weight.double())
    ref_x, _, inv_x = quantize_reference(x, torch.ones(1, device=DEV))
    ref_w, _, inv_w = quantize_reference(lin.weight.detach(), torch.ones(1, device=DEV))
    want = (ref_x.double() * inv_x.double()) @ (ref_w.double() * inv_w.double()).T
    assert_same_nonfinite(y, want, 1e-3)
    assert torch.equal(y.isnan().any(1).cpu(), x.isnan().any(1).cpu())
    assert torch.equal(y.isnan().cpu(), plain.isnan().cpu() & x.isnan().any(1, keepdim=True).cpu())
    assert lin.fp8_forward_amax_history.isnan().any().item()
