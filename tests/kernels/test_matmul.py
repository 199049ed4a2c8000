"""labkit.kernels.matmul: the alignment lab's Triton GEMM against a float64 reference.

Tolerance. The inputs are exactly representable in their dtype and the float64 reference uses
those same values, so the kernel differs from the reference only by
  (1) rounding C to the output dtype: at most one unit in the last place, i.e. a relative error
      below 2**-7 for bfloat16 (the interpreter truncates instead of rounding, a full unit),
      2**-10 for float16 and ~1e-7 for float32; this is the ``rtol`` term;
  (2) the fp32 accumulation over K terms of standard-normal products: each C element is of
      scale sqrt(K), and the summation error measured here is ~1e-6 * sqrt(K); this is the
      ``atol * sqrt(K)`` term. 1e-3 * sqrt(K) for the 16-bit types leaves room for the GPU's
      tensor-core accumulation order; 1e-5 * sqrt(K) for float32 ("ieee" dots).
So |out - ref| <= rtol * |ref| + atol * sqrt(K). A wrong tile, mask or stride shows up as an error
of order sqrt(K), hundreds of times the budget (``test_the_tolerance_catches_one_wrong_element``).
"""

import math

import pytest
import torch

import labkit
from labkit.kernels import matmul as mm
from labkit.kernels.matmul import flops, matmul, misaligned

DEV = labkit.workbench.tier.kernel_device()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {  # dtype -> (rtol, atol per sqrt(K)); see the module docstring
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2**-10, 1e-3),
    torch.bfloat16: (2**-7, 1e-3),
}
# Odd sizes exercise the M, N and K masks; 64-multiples the unmasked edges; 1 the degenerate tiles.
SHAPES = [(65, 77, 129), (129, 65, 77), (64, 128, 64), (1, 200, 33), (200, 1, 200), (3, 5, 1), (200, 193, 200)]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, dtype, seed):
    """Standard-normal values from a seeded CPU generator, moved to the kernel device."""
    return torch.randn(*shape, generator=_gen(seed)).to(dtype).to(DEV)


def _excess(out, a, b):
    """max over elements of |out - ref| / (rtol |ref| + atol sqrt(K)): <= 1 passes."""
    rtol, atol = TOL[a.dtype]
    ref = a.double() @ b.double()
    assert out.shape == ref.shape and out.dtype == a.dtype and out.device == a.device
    assert torch.isfinite(out).all()
    if ref.numel() == 0:
        return 0.0
    bound = rtol * ref.abs() + atol * math.sqrt(a.shape[1])
    return ((out.double() - ref).abs() / bound).max().item()


def _assert_close(out, a, b):
    excess = _excess(out, a, b)
    assert excess <= 1.0, f"error is {excess:.3g}x the tolerance for {a.dtype}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_reference(dtype, shape):
    M, N, K = shape
    for seed in (shape[0] * 7 + shape[2], torch.seed() % 2**31):  # one fixed, one fresh each run
        a, b = _randn(M, K, dtype=dtype, seed=seed), _randn(K, N, dtype=dtype, seed=seed + 1)
        _assert_close(matmul(a, b), a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_is_filled_and_returned(dtype):
    a, b = _randn(70, 90, dtype=dtype, seed=1), _randn(90, 40, dtype=dtype, seed=2)
    out = torch.full((70, 40), float("nan"), dtype=dtype, device=DEV)
    assert matmul(a, b, out) is out
    _assert_close(out, a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["a_t", "b_t", "both_t", "strided"])
def test_non_contiguous_inputs(dtype, layout):
    M, N, K = 77, 65, 129
    a = _randn(M, K, dtype=dtype, seed=3)
    b = _randn(K, N, dtype=dtype, seed=4)
    if layout in ("a_t", "both_t"):
        a = _randn(K, M, dtype=dtype, seed=5).t()  # column-major A: stride (1, M)
    if layout in ("b_t", "both_t"):
        b = _randn(N, K, dtype=dtype, seed=6).t()  # column-major B: stride (1, K)
    if layout == "strided":  # every other column / row of a bigger matrix
        a = _randn(M, 2 * K, dtype=dtype, seed=7)[:, ::2]
        b = _randn(2 * K, N + 3, dtype=dtype, seed=8)[::2, 1 : N + 1]
    assert not (a.is_contiguous() and b.is_contiguous())
    _assert_close(matmul(a, b), a, b)


@pytest.mark.parametrize(
    "dtype,offsets",
    [
        (torch.bfloat16, (2, 16, 128)),
        (torch.float16, (2, 16, 128)),
        (torch.float32, (4, 16, 128)),
    ],
)
def test_misaligned_operands(dtype, offsets):
    """Operands and output 2..128 bytes past a 256-byte boundary give the aligned results."""
    M, N, K = 65, 77, 129
    for i, off in enumerate(offsets):
        a = misaligned((M, K), dtype, DEV, off, generator=_gen(10 + i))
        b = misaligned((K, N), dtype, DEV, off, generator=_gen(20 + i))
        out = misaligned((M, N), dtype, DEV, off)
        assert [t.data_ptr() % 256 for t in (a, b, out)] == [off] * 3
        assert matmul(a, b, out) is out
        _assert_close(out, a, b)
        aligned = matmul(a.clone(), b.clone())  # fresh allocations: 256-aligned
        assert aligned.data_ptr() % 16 == 0
        # Same kernel, same order of sums: only the pointers differ.
        assert torch.equal(out, aligned)


def test_mixed_alignments_and_transposes():
    """A misaligned A with a transposed, misaligned B (bf16, 2 bytes off)."""
    a = misaligned((65, 100), torch.bfloat16, DEV, 2, generator=_gen(30))
    b = misaligned((77, 100), torch.bfloat16, DEV, 130, generator=_gen(31)).t()
    _assert_close(matmul(a, b), a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_writes_nothing_outside_out(dtype):
    """out is the middle of a larger buffer: the masked edge tiles must not touch its neighbours."""
    M, N, K = 65, 77, 33
    a, b = _randn(M, K, dtype=dtype, seed=70), _randn(K, N, dtype=dtype, seed=71)
    flat = torch.full((M * N + 2 * 4096,), -7.0, dtype=dtype, device=DEV)
    out = flat[4096 : 4096 + M * N].view(M, N)
    matmul(a, b, out)
    _assert_close(out, a, b)
    assert (flat[:4096] == -7).all() and (flat[4096 + M * N :] == -7).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_k_zero_gives_zeros(dtype):
    a, b = torch.empty(5, 0, dtype=dtype, device=DEV), torch.empty(0, 7, dtype=dtype, device=DEV)
    out = torch.full((5, 7), float("nan"), dtype=dtype, device=DEV)
    assert matmul(a, b, out) is out
    assert torch.equal(out, torch.zeros(5, 7, dtype=dtype, device=DEV))
    fresh = matmul(a, b)
    assert fresh.shape == (5, 7) and fresh.dtype == dtype and not fresh.any()


@pytest.mark.parametrize("M,N", [(0, 7), (5, 0), (0, 0)])
def test_empty_m_or_n(M, N):
    a, b = _randn(M, 9, dtype=torch.bfloat16, seed=0), _randn(9, N, dtype=torch.bfloat16, seed=1)
    c = matmul(a, b)
    assert c.shape == (M, N) and c.dtype == torch.bfloat16 and c.device == a.device
    out = torch.empty(M, N, dtype=torch.bfloat16, device=DEV)
    assert matmul(a, b, out) is out


def test_int64_offsets_path_is_correct_and_chosen_for_large_spans():
    a, b = _randn(65, 129, dtype=torch.float16, seed=40), _randn(129, 77, dtype=torch.float16, seed=41)
    out = torch.empty(65, 77, dtype=torch.float16, device=DEV)
    _assert_close(mm._launch(a, b, out, int64_offsets=True), a, b)
    # Meta tensors have shapes and strides but no memory: a 2**31-element span costs nothing.
    small = torch.empty(1024, 1024, device="meta")
    huge = torch.empty_strided((2, 2**30 + 1), (2**30 + 1, 1), device="meta")
    assert not mm.needs_int64(small, small, small, pad=128)
    assert mm.needs_int64(small, huge, small, pad=128)
    assert mm.needs_int64(torch.empty(2**31 - 64, 1, device="meta"), pad=128)


def test_fp32_dot_precision_follows_torch():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert mm.fp32_input_precision() == "ieee"
        torch.set_float32_matmul_precision("high")
        assert mm.fp32_input_precision() == "tf32"
        a, b = _randn(65, 129, dtype=torch.float32, seed=50), _randn(129, 77, dtype=torch.float32, seed=51)
        ref = a.double() @ b.double()
        # TF32 keeps 10 mantissa bits of each input: products off by ~2**-10, summed over K.
        err = (matmul(a, b).double() - ref).abs().max().item()
        assert err <= 2**-9 * math.sqrt(129) * 3
    finally:
        torch.set_float32_matmul_precision(before)


def test_the_tolerance_catches_one_wrong_element():
    """The budget is far below what a mask or stride bug produces."""
    for dtype in DTYPES:
        a, b = _randn(65, 129, dtype=dtype, seed=60), _randn(129, 77, dtype=dtype, seed=61)
        out = matmul(a, b)
        assert _excess(out, a, b) <= 1.0
        wrong = out.clone()
        wrong[64, 76] += 0.1 * math.sqrt(129)  # a tenth of the output scale, in the masked corner
        assert _excess(wrong, a, b) > 2
        # Dropping the last (partial) K step is caught too.
        assert _excess(matmul(a[:, :128], b[:128]), a, b) > 2


def test_flops_and_config():
    assert flops(2, 3, 4) == 48 and flops(4096, 4096, 4096) == 2 * 4096**3
    assert mm.GPU_CONFIG == mm.MatmulConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
    cfg = mm.launch_config()
    assert cfg == (mm.INTERPRETER_CONFIG if labkit.workbench.tier.interpreted() else mm.GPU_CONFIG)
    assert min(cfg.block_m, cfg.block_n, cfg.block_k) >= 64  # big tiles under the interpreter too


# ---- misaligned() ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,offsets", [(torch.bfloat16, (0, 2, 16, 128)), (torch.float32, (0, 4, 16, 128))])
def test_misaligned_lands_exactly_on_the_offset(dtype, offsets):
    for off in offsets:
        for shape in [(3, 5), (1000,), 17, (2, 3, 4)]:
            t = misaligned(shape, dtype, "cpu", off, generator=_gen(off))
            want = torch.Size((shape,) if isinstance(shape, int) else shape)
            assert t.shape == want and t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu"
            assert t.data_ptr() % 256 == off
        # An empty tensor has shape but no address: torch reports data_ptr() == 0 for it.
        assert misaligned((0, 4), dtype, "cpu", off).shape == (0, 4)


def test_misaligned_values_are_standard_normal_and_seeded():
    t = misaligned((200, 100), torch.float32, "cpu", 4, generator=_gen(7))
    assert abs(t.mean().item()) < 0.02 and abs(t.std().item() - 1) < 0.02
    same = misaligned((200, 100), torch.float32, "cpu", 128, generator=_gen(7))
    assert torch.equal(t, same)  # values depend on the generator, not the offset
    assert torch.equal(t, torch.randn(200, 100, generator=_gen(7)))
    other = misaligned((200, 100), torch.float32, "cpu", 4, generator=_gen(8))
    assert not torch.equal(t, other)
    if DEV.type == "cuda":  # a CPU generator gives the same values on the GPU
        assert torch.equal(misaligned((200, 100), torch.float32, DEV, 4, generator=_gen(7)).cpu(), t)


@pytest.mark.parametrize(
    "dtype,offset,exc,match",
    [
        (torch.bfloat16, -2, ValueError, r"offset_bytes: expected 0 <= offset_bytes < 256, got -2"),
        (torch.bfloat16, 256, ValueError, "offset_bytes: .*got 256"),
        (torch.bfloat16, 3, ValueError, r"offset_bytes: 3 is not a multiple of the bfloat16 item size \(2"),
        (torch.float32, 2, ValueError, r"offset_bytes: 2 is not a multiple of the float32 item size \(4"),
        (torch.float32, 4.0, TypeError, "offset_bytes: expected an int, got float"),
        (torch.int32, 0, TypeError, "dtype: expected a floating-point torch.dtype"),
    ],
)
def test_misaligned_refuses_bad_arguments(dtype, offset, exc, match):
    with pytest.raises(exc, match=match):
        misaligned((4, 4), dtype, "cpu", offset)


# ---- bad input ------------------------------------------------------------------------------


def _t(*shape, dtype=torch.float16):
    return torch.zeros(*shape, dtype=dtype, device=DEV)


@pytest.mark.parametrize(
    "make,exc,match",
    [
        (lambda: matmul([[1.0]], _t(1, 1)), TypeError, "a: expected a torch.Tensor, got list"),
        (lambda: matmul(_t(1, 1), None), TypeError, "b: expected a torch.Tensor, got NoneType"),
        (lambda: matmul(_t(2, 3), _t(3, 2), out=[0]), TypeError, "out: expected a torch.Tensor, got list"),
        (lambda: matmul(_t(4), _t(4, 2)), ValueError, r"a: expected a 2-D tensor, got shape \(4,\)"),
        (lambda: matmul(_t(2, 4), _t(1, 4, 2)), ValueError, r"b: expected a 2-D tensor, got shape \(1, 4, 2\)"),
        (
            lambda: matmul(_t(2, 3), _t(4, 5)),
            ValueError,
            r"a, b: inner dimensions differ: a has shape \(2, 3\), b has shape \(4, 5\)",
        ),
        (
            lambda: matmul(_t(2, 3), _t(3, 5, dtype=torch.bfloat16)),
            TypeError,
            "b: dtype bfloat16 differs from a's dtype float16",
        ),
        (
            lambda: matmul(_t(2, 3, dtype=torch.float64), _t(3, 5, dtype=torch.float64)),
            TypeError,
            "a: dtype float64 is not supported",
        ),
        (lambda: matmul(_t(2, 3, dtype=torch.int32), _t(3, 5)), TypeError, "a: dtype int32 is not supported"),
        (
            lambda: matmul(_t(2, 3), _t(3, 5), out=_t(5, 2)),
            ValueError,
            r"out: shape \(5, 2\) is not \(M, N\) = \(2, 5\)",
        ),
        (
            lambda: matmul(_t(2, 3), _t(3, 5), out=_t(2, 5, dtype=torch.float32)),
            TypeError,
            "out: dtype float32 differs from a's dtype float16",
        ),
        (lambda: matmul(_t(2, 3), _t(3, 5), out=_t(10)), ValueError, r"out: expected a 2-D tensor, got shape \(10,\)"),
        (lambda: matmul(_t(2, 3), _t(3, 5), out=_t(5, 2).t()), ValueError, "out: expected a contiguous tensor"),
        (
            lambda: matmul(_t(2, 3), _t(3, 5), out=torch.empty(2, 5, dtype=torch.float16, device="meta")),
            ValueError,
            "tensors must share one device: a on .*, b on .*, out on meta",
        ),
        (
            lambda: matmul(_t(2, 3), torch.empty(3, 5, dtype=torch.float16, device="meta")),
            ValueError,
            "tensors must share one device: a on .*, b on meta",
        ),
    ],
)
def test_refuses_bad_input(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_refuses_out_overlapping_an_input():
    x = _randn(8, 8, dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match="out: overlaps a in memory"):
        matmul(x, _randn(8, 8, dtype=torch.float32, seed=1), out=x)
    buf = _randn(8, 16, dtype=torch.float32, seed=2)
    with pytest.raises(ValueError, match="out: overlaps b in memory"):
        matmul(_randn(8, 8, dtype=torch.float32, seed=3), buf[:, :8], out=buf[:4].view(8, 8))
    # Separate pieces of one buffer are fine.
    flat = torch.zeros(3 * 64, device=DEV)
    a, b, out = flat[:64].view(8, 8), flat[64:128].view(8, 8), flat[128:].view(8, 8)
    a.normal_()
    b.normal_()
    _assert_close(matmul(a, b, out), a, b)


@pytest.mark.gpu
def test_cpu_tensors_are_refused_on_the_gpu_tier():
    with pytest.raises(ValueError, match="a: is on cpu; labkit's Triton kernels take CUDA tensors"):
        matmul(torch.zeros(2, 2), torch.zeros(2, 2))
