"""The SC matmul: the kernel's integer counts equal the literal bitstream emulation exactly, on
fresh random inputs, for every option; bad input is refused; the story's multi-GPU regression."""

import pytest
import torch
import triton
import triton.language as tl

import labkit
from labkit.kernels.sc import encoding, sc_counts, sc_matmul, sc_matmul_reference
from labkit.kernels.sc import kernel as sc_kernel_module

DEV = labkit.workbench.tier.kernel_device()

# (shape of a, shape of b, options): the story's five configurations first, then the others.
CASES = [
    ((6, 96), (96, 10), dict(granularity="per_tensor")),
    ((6, 96), (96, 10), dict(granularity="per_row")),
    ((6, 300), (300, 10), dict(granularity="per_row", chunk_d=128)),  # chunked, ragged last chunk
    ((3, 5, 64), (3, 64, 7), dict(granularity="per_row")),
    ((3, 5, 64), (3, 64, 7), dict(granularity="per_head")),
    ((1, 40), (40, 3), dict(halve=True)),
    ((4, 33), (33, 5), dict(a_seq="counter", b_seq="bitrev", sc_prec=4, stoc_len=64)),
    ((3, 41), (41, 6), dict(b_seq="counter")),
    ((3, 41), (41, 6), dict(a_seq="counter_alt", b_seq="bitrev", chunk_d=7)),  # odd chunks: parity is global k
    ((2, 3, 70), (2, 70, 4), dict(granularity="per_tensor", chunk_d=16, halve=True, stoc_len=32, sc_prec=6)),
]


def _fresh(shape_a, shape_b, dtype=torch.float32):
    seed = torch.seed() % 2**31  # a new draw every run; printed on failure
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(shape_a, generator=g) * 3).to(dtype).to(DEV)
    b = torch.randn(shape_b, generator=g).to(dtype).to(DEV)
    return a, b, seed


@pytest.mark.parametrize("shape_a,shape_b,opts", CASES)
def test_kernel_counts_equal_literal_bitstreams(shape_a, shape_b, opts):
    a, b, seed = _fresh(shape_a, shape_b)
    kernel = sc_counts(a, b, **opts)
    literal = sc_counts(a, b, impl="reference", **opts)
    assert kernel.dtype == literal.dtype == torch.int64
    assert torch.equal(kernel.cpu(), literal.cpu()), f"seed {seed}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape_a,shape_b,opts", CASES[:5])
def test_output_matches_reference(shape_a, shape_b, opts, dtype):
    a, b, seed = _fresh(shape_a, shape_b, dtype)
    out = sc_matmul(a, b, **opts)
    ref = sc_matmul_reference(a, b, **opts)
    assert out.dtype == dtype and out.shape == ref.shape and out.device == a.device
    # Same integer counts and the same fp32 steps in the same order (no fused multiply-add):
    # the same bits.
    assert torch.equal(out.cpu(), ref.cpu()), f"seed {seed}: max diff {(out.float() - ref.float()).abs().max()}"


def test_same_inputs_same_bits():
    a, b, _ = _fresh((7, 128), (128, 9))
    assert torch.equal(sc_matmul(a, b), sc_matmul(a, b))


def test_count_table_against_streams():
    L, Q = 64, encoding.qmax(5)
    T = encoding.count_table(5, L, "bitrev", "counter", False)[0]
    assert encoding.count_table(5, L, "bitrev", "counter", False).shape == (1, 2 * Q + 1, 2 * Q + 1)
    assert encoding.count_table(5, L, "bitrev", "counter_alt", False).shape == (2, 2 * Q + 1, 2 * Q + 1)
    assert T[2 * Q, 2 * Q] == L and T[0, 0] == L and T[0, 2 * Q] == -L  # +1*+1, -1*-1, -1*+1
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    for qa, qb in torch.randint(-Q, Q + 1, (20, 2), generator=g).tolist():
        sa = encoding.bitstreams(torch.tensor(qa), 5, L, "bitrev", False)
        sb = encoding.bitstreams(torch.tensor(qb), 5, L, "counter", False)
        assert T[qa + Q, qb + Q] == 2 * int((sa == sb).sum()) - L


def test_sequences():
    assert encoding.threshold_sequence("bitrev", 8).tolist() == [0, 4, 2, 6, 1, 5, 3, 7]
    assert encoding.threshold_sequence("counter_alt", 4, k_parity=1).tolist() == [3, 2, 1, 0]
    assert sorted(encoding.threshold_sequence("bitrev", 256).tolist()) == list(range(256))
    assert encoding.threshold_sequence("counter", 4).tolist() == [0, 1, 2, 3]


def test_sc_approximates_the_product_for_extreme_values():
    """All entries at +-amax: every stream is all ones or all zeros, so SC is exact up to scales."""
    a = torch.tensor([[1.0, -1.0, 1.0]], device=DEV)
    b = torch.tensor([[2.0], [-2.0], [-2.0]], device=DEV)
    assert torch.allclose(sc_matmul(a, b, granularity="per_tensor"), a @ b, rtol=1e-6)


def test_default_sequences_keep_long_dot_products_accurate():
    """Measured property behind the default b_seq: error stays small over a long K (and the plain
    counter's does not). Relative to the exact fp32 product, over fresh random data."""
    a, b, seed = _fresh((4, 1024), (1024, 8))
    exact = a.float() @ b.float()
    rel = lambda out: ((out.float() - exact).norm() / exact.norm()).item()  # noqa: E731
    assert rel(sc_matmul(a, b)) < 0.3, f"seed {seed}"
    assert rel(sc_matmul(a, b, b_seq="counter")) > 1.0, f"seed {seed}"


def test_empty_dimensions():
    assert sc_matmul(torch.empty(0, 5, device=DEV), torch.randn(5, 3, device=DEV)).shape == (0, 3)
    assert torch.equal(
        sc_matmul(torch.empty(2, 0, device=DEV), torch.empty(0, 3, device=DEV)), torch.zeros(2, 3, device=DEV)
    )


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda a, b: sc_matmul(a.double(), b.double()), TypeError, "a: dtype float64 is not supported"),
        (lambda a, b: sc_matmul(a, b.half()), TypeError, "dtypes differ"),
        (lambda a, b: sc_matmul(a, b[:-1]), ValueError, "K mismatch: a has K=16"),
        (lambda a, b: sc_matmul(a, b, granularity="per_head"), ValueError, "per_head' needs 3-D inputs"),
        (lambda a, b: sc_matmul(a, b, granularity="per_col"), ValueError, "granularity: 'per_col'"),
        (lambda a, b: sc_matmul(a, b, stoc_len=100), ValueError, "stoc_len: expected a power of two"),
        (lambda a, b: sc_matmul(a, b, stoc_len=8192), ValueError, "stoc_len"),
        (lambda a, b: sc_matmul(a, b, sc_prec=9), ValueError, "sc_prec: expected an int from 2 to 8"),
        (lambda a, b: sc_matmul(a, b, sc_prec=1), ValueError, "sc_prec"),
        (lambda a, b: sc_matmul(a, b, chunk_d=-1), ValueError, "chunk_d"),
        (lambda a, b: sc_matmul(a, b, a_seq="random"), ValueError, "a_seq: 'random'"),
        (lambda a, b: sc_matmul(a[None], b), ValueError, "both 2-D"),
        (lambda a, b: sc_matmul(a[None].expand(2, 4, 16), b[None]), ValueError, "head counts differ"),
        (lambda a, b: sc_matmul(a, b.to("meta")), ValueError, "a on .*, b on meta"),
        (lambda a, b: sc_counts(a, b, impl="fast"), ValueError, "impl: 'fast'"),
    ],
)
def test_bad_input_is_refused(call, exc, match):
    a, b = torch.randn(4, 16, device=DEV), torch.randn(16, 3, device=DEV)
    with pytest.raises(exc, match=match):
        call(a, b)


@pytest.mark.multigpu
@pytest.mark.parametrize(
    "shape_a,shape_b,opts",
    CASES[:5],
    ids=["per_tensor-2d", "per_row-2d", "per_row-chunk128-2d", "per_row-3d", "per_head-3d"],
)
def test_story_regression_on_cuda1_with_current_device_cuda0(shape_a, shape_b, opts):
    """The seed PR's test: no fault, output on the input GPU, device restored, bit-identical."""
    a, b, seed = _fresh(shape_a, shape_b, torch.bfloat16)
    a, b = a.cpu(), b.cpu()
    torch.cuda.set_device(0)
    ref = sc_matmul(a.to("cuda:0"), b.to("cuda:0"), **opts)
    out = sc_matmul(a.to("cuda:1"), b.to("cuda:1"), **opts)
    torch.cuda.synchronize(1)
    assert out.device == torch.device("cuda:1")
    assert torch.cuda.current_device() == 0
    assert torch.equal(out.cpu(), ref.cpu()), f"seed {seed}"


def test_prepared_b_gives_the_same_bits_and_checks_its_input():
    from labkit.kernels.sc import prepare_b, sc_matmul_prepared

    a, b, seed = _fresh((5, 96), (96, 12))
    w = prepare_b(b, chunk_d=32)
    assert torch.equal(sc_matmul_prepared(a, w), sc_matmul(a, b, chunk_d=32)), f"seed {seed}"
    assert w.shape == (96, 12)
    with pytest.raises(ValueError, match=r"does not fit the prepared b of shape \(96, 12\)"):
        sc_matmul_prepared(a[:, :90], w)
    with pytest.raises(TypeError, match="PreparedB"):
        sc_matmul_prepared(a, b)


def test_kernel_benchmark_records(tmp_path):
    from labkit.app import benchmarks
    from labkit.workbench import results

    path = benchmarks.run("wrong_device_sc_kernel", "cpu", out_dir=tmp_path)
    rs = results.load_results(path)
    assert rs.generator == "labkit.labs.wrong_device.sc_bench.benchmark"
    assert {r["impl"] for r in rs.records} == {"bf16 matmul", "sc_matmul"}
    methods = {r["method"] for r in rs.records}
    assert methods == ({"cuda_graph", "cuda_events"} if labkit.workbench.tier.TIER == "gpu" else {"cpu_clock"})
    assert len(rs.records) == 2 * 2 * 2 * len(methods)  # impls x layers x M x timing methods
    for r in rs.records:
        assert r["us"] > 0 and 0 <= r["rel_err_vs_fp32"] < 1.0


@pytest.mark.parametrize("shape,chunk_d", [((1, 1, 96), 0), ((2, 3, 300), 128), ((1, 5, 33), 7)])
def test_fused_quantisation_is_bit_identical_to_the_torch_definition(shape, chunk_d):
    from labkit.kernels.sc.matmul import SCConfig, quantize_a, quantize_a_torch

    seed = torch.seed() % 2**31
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 5
    x[0, 0, : chunk_d or shape[2]] = 0  # an all-zero group: scale 1, q 0
    if shape[1] > 1:  # exact ties: amax 127 gives s = 1
        x[0, 1, :4] = torch.tensor([127.0, 2.5, 3.5, -2.5])
    x = x.to(DEV)
    cfg = SCConfig(granularity="per_row", chunk_d=chunk_d)
    for a3 in (x, x.transpose(1, 2).contiguous().transpose(1, 2)):  # contiguous and strided
        qa, sa = quantize_a(a3, cfg)
        qt, st = quantize_a_torch(a3, cfg)
        assert torch.equal(qa.cpu(), qt.cpu()) and torch.equal(sa.cpu(), st.cpu()), f"seed {seed}"
    if shape[1] > 1:
        assert qa[0, 1, 1:4].tolist() == [2, 4, -2]  # round half to even


@pytest.mark.parametrize("opts", [dict(), dict(chunk_d=24), dict(b_seq="counter", sc_prec=5, stoc_len=64)])
def test_every_launch_path_gives_the_same_counts_and_bits(opts):
    """Global lookups or gathered rows, split K (atomic counts + finalize) or not: same integers,
    and the same output bits (the finalize kernel repeats the fused path's fp32 steps)."""
    from labkit.kernels.sc.matmul import LaunchConfig, prepare_b, sc_matmul_prepared

    a, b, seed = _fresh((3, 100), (100, 20))
    configs = [
        LaunchConfig(gather=g, block_m=bm, block_n=16, block_k=8, splits=s)
        for g in (0, 1)
        for bm in (1, 4)
        for s in (1, 3)
    ]
    literal = sc_counts(a, b, impl="reference", **opts)
    w = prepare_b(b, **opts)
    outs = []
    for lc in configs:
        assert torch.equal(sc_counts(a, b, config=lc, **opts).cpu(), literal.cpu()), f"{lc} seed {seed}"
        outs.append(sc_matmul_prepared(a, w, config=lc))
    for lc, out in zip(configs, outs):
        assert torch.equal(out, outs[0]), f"{lc} differs from {configs[0]}, seed {seed}"


def test_sc_report_and_plots():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkit.labs.wrong_device import sc_plots as plots
    from labkit.labs.wrong_device import widgets

    for gran in ("per_tensor", "per_row", "per_head"):
        text = widgets.sc_report(gran, 64, 16, False)
        assert "kernel counts == literal bitstream counts: True" in text
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3)
    shown = plots.plot_streams(ax1, 3, -5, sc_prec=4, stoc_len=32)
    assert (
        shown["count"] == int(encoding.count_table(4, 32, "bitrev", "counter_alt", False)[0, 3 + 7, -5 + 7] + 32) // 2
    )
    with pytest.raises(ValueError, match="q_a: expected a value in"):
        plots.plot_streams(ax1, 9, 0, sc_prec=4)
    plots.plot_table_error(ax2, sc_prec=4, stoc_len=32)
    recs = [{"layer": "down", "M": 1, "impl": "sc_matmul", "ratio_vs_bf16": 7.0, "method": "cuda_graph"}]
    plots.plot_speed(ax3, {"a": recs, "b": recs})
    assert len(ax3.patches) == 2
    plt.close(fig)


# Non-finite inputs. A quantisation that turned a NaN into some finite level would give a silent
# wrong answer. So out[i, j] is NaN iff row i of a or column j of b holds a NaN or +-inf, and every
# other output is, bit for bit, the product with those entries set to 0 (for per_row, with the
# whole row / column replaced by anything finite: it has scales of its own).


def _nan_rows(out: torch.Tensor) -> list[int]:
    return [i for i in range(out.shape[-2]) if bool(out[..., i, :].isnan().all())]


def _spoil(x: torch.Tensor, lines: torch.Tensor, dim: int, value: float, seed: int) -> torch.Tensor:
    """x with one entry per chosen line (row of a: dim=-2; column of b: dim=-1) set to value, at a
    random position along K, in every head."""
    g = torch.Generator().manual_seed(seed + 1)
    x = x.clone()
    K = x.shape[-1] if dim == -2 else x.shape[-2]
    for line in lines.tolist():
        k = int(torch.randint(K, (1,), generator=g))
        if dim == -2:
            x[..., line, k] = value
        else:
            x[..., k, line] = value
    return x


def _pick(n: int, count: int, seed: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + 2))[:count].sort().values


def _assert_flagged(out, rows, cols, clean, seed):
    """NaN exactly in the given rows / columns; elsewhere the same bits as ``clean``."""
    M, N = out.shape[-2], out.shape[-1]
    expect = torch.zeros(M, N, dtype=torch.bool)
    expect[rows.tolist(), :] = True
    expect[:, cols.tolist()] = True
    expect = expect.expand(out.shape)
    got = out.isnan().cpu()
    assert torch.equal(got, expect), (
        f"seed {seed}: NaN at {got.nonzero().tolist()}, expected rows {rows.tolist()} and columns {cols.tolist()}"
    )
    assert torch.equal(out.cpu()[~expect], clean.cpu()[~expect]), f"seed {seed}"
    assert torch.isfinite(out.cpu()[~expect]).all(), f"seed {seed}"


NONFINITE_CASES = [
    ((6, 40), (40, 10), dict(granularity="per_row")),
    ((6, 40), (40, 10), dict(granularity="per_tensor")),
    ((5, 50), (50, 9), dict(granularity="per_row", chunk_d=16)),  # the flag sits in one chunk
    ((2, 4, 24), (2, 24, 6), dict(granularity="per_head")),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape_a,shape_b,opts", NONFINITE_CASES)
def test_nan_in_rows_of_a_makes_exactly_those_output_rows_nan(shape_a, shape_b, opts, dtype):
    a, b, seed = _fresh(shape_a, shape_b, dtype)
    rows = _pick(shape_a[-2], 2, seed)
    bad = _spoil(a, rows, -2, float("nan"), seed)
    out = sc_matmul(bad, b, **opts)
    assert out.dtype == dtype
    # the NaN pattern is torch.matmul's
    assert torch.equal(out.isnan().cpu(), torch.matmul(bad.float(), b.float()).isnan().cpu()), f"seed {seed}"
    zeroed = torch.where(bad.isnan(), torch.zeros_like(bad), bad)
    _assert_flagged(out, rows, torch.tensor([], dtype=torch.long), sc_matmul(zeroed, b, **opts), seed)
    if opts["granularity"] == "per_row":  # rows are independent: any finite replacement will do
        other = bad.clone()
        other[..., rows, :] = torch.randn(other[..., rows, :].shape).to(dtype).to(DEV)
        clean = sc_matmul(other, b, **opts)
        _assert_flagged(out, rows, torch.tensor([], dtype=torch.long), clean, seed)
    ref = sc_matmul_reference(bad, b, **opts)  # the literal reference flags the same outputs
    assert torch.equal(ref.isnan(), out.isnan()) and torch.equal(ref[~ref.isnan()], out[~out.isnan()])


@pytest.mark.parametrize("shape_a,shape_b,opts", NONFINITE_CASES)
def test_nan_in_columns_of_b_makes_exactly_those_output_columns_nan(shape_a, shape_b, opts):
    a, b, seed = _fresh(shape_a, shape_b)
    cols = _pick(shape_b[-1], 3, seed)
    bad = _spoil(b, cols, -1, float("nan"), seed)
    out = sc_matmul(a, bad, **opts)
    assert torch.equal(out.isnan().cpu(), torch.matmul(a, bad).isnan().cpu()), f"seed {seed}"
    zeroed = torch.where(bad.isnan(), torch.zeros_like(bad), bad)
    _assert_flagged(out, torch.tensor([], dtype=torch.long), cols, sc_matmul(a, zeroed, **opts), seed)
    if opts["granularity"] == "per_row":  # columns are independent
        other = bad.clone()
        other[..., :, cols] = torch.randn(other[..., :, cols].shape).to(DEV)
        _assert_flagged(out, torch.tensor([], dtype=torch.long), cols, sc_matmul(a, other, **opts), seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_inf_gives_nan_in_the_affected_outputs_never_a_finite_answer(dtype):
    """+-inf has no bitstream, and torch's sign of the result depends on the other operand along
    K; sc_matmul gives NaN for every output the inf reaches (documented in labkit.kernels.sc.matmul)."""
    a, b, seed = _fresh((6, 40), (40, 10), dtype)
    rows, cols = _pick(6, 2, seed), _pick(10, 2, seed + 7)
    bad_a = _spoil(_spoil(a, rows[:1], -2, float("inf"), seed), rows[1:], -2, float("-inf"), seed + 3)
    bad_b = _spoil(b, cols, -1, float("inf"), seed + 5)
    for granularity in ("per_row", "per_tensor"):
        out = sc_matmul(bad_a, bad_b, granularity=granularity)
        zero = lambda x: torch.where(torch.isfinite(x), x, torch.zeros_like(x))  # noqa: E731
        _assert_flagged(out, rows, cols, sc_matmul(zero(bad_a), zero(bad_b), granularity=granularity), seed)
        # every output that torch gives as inf or NaN is NaN here: none is finite
        assert out.cpu()[~torch.isfinite(torch.matmul(bad_a.float(), bad_b.float())).cpu()].isnan().all()


def test_prepared_b_carries_its_own_flag_through_every_launch_path():
    from labkit.kernels.sc.matmul import LaunchConfig, prepare_b, sc_matmul_prepared

    a, b, seed = _fresh((3, 36), (36, 20))
    cols, rows = _pick(20, 2, seed), _pick(3, 1, seed)
    bad_b = _spoil(b, cols, -1, float("nan"), seed)
    w = prepare_b(bad_b, chunk_d=16)
    w_clean = prepare_b(torch.where(bad_b.isnan(), 0, bad_b), chunk_d=16)
    # the flag lives in the prepared scales: NaN exactly in the columns' chunk that held the NaN
    flagged = w.sb.isnan().any(dim=1)[0].cpu()
    assert flagged.nonzero().flatten().tolist() == cols.tolist(), f"seed {seed}"
    assert int(w.sb.isnan().sum()) == len(cols), f"seed {seed}"
    bad_a = _spoil(a, rows, -2, float("nan"), seed)
    clean_a = torch.where(bad_a.isnan(), 0, bad_a)
    none = torch.tensor([], dtype=torch.long)
    for g in (0, 1):
        for s in (1, 3):  # fused scaling, and atomic counts + finalize kernel
            lc = LaunchConfig(gather=g, block_m=2, block_n=16, block_k=8, splits=s)
            _assert_flagged(
                sc_matmul_prepared(a, w, config=lc), none, cols, sc_matmul_prepared(a, w_clean, config=lc), seed
            )
            _assert_flagged(
                sc_matmul_prepared(bad_a, w, config=lc),
                rows,
                cols,
                sc_matmul_prepared(clean_a, w_clean, config=lc),
                seed,
            )


@pytest.mark.parametrize("granularity,chunk_d", [("per_row", 0), ("per_row", 8), ("per_tensor", 0)])
def test_quantisation_flags_nonfinite_rows_identically_fused_and_in_torch(granularity, chunk_d):
    from labkit.kernels.sc.matmul import SCConfig, quantize_a, quantize_a_torch

    seed = torch.seed() % 2**31
    x = torch.randn(2, 4, 20, generator=torch.Generator().manual_seed(seed)) * 5
    x[0, 1, 3], x[1, 2, 19], x[1, 0, 0] = float("nan"), float("inf"), float("-inf")
    x = x.to(DEV)
    cfg = SCConfig(granularity=granularity, chunk_d=chunk_d)
    qa, sa = quantize_a(x, cfg)
    qt, st = quantize_a_torch(x, cfg)
    assert torch.equal(qa, qt), f"seed {seed}"
    assert torch.equal(sa.isnan(), st.isnan()) and torch.equal(sa[~sa.isnan()], st[~st.isnan()]), f"seed {seed}"
    assert torch.equal(qa[~torch.isfinite(x)], torch.zeros(3, dtype=torch.int8, device=DEV))
    C = sa.shape[1]
    chunk_of = lambda k: k // chunk_d if chunk_d else 0  # noqa: E731
    expect = torch.zeros(2, C, 4, dtype=torch.bool)
    for h, m, k in ((0, 1, 3), (1, 2, 19), (1, 0, 0)):
        expect[h, chunk_of(k), m] = True
    assert torch.equal(sa.isnan().cpu(), expect)


@triton.jit
def _to_bf16(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    sc_kernel_module._store_output(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), offs < n, True)


def test_bf16_store_keeps_every_nan_a_nan():
    """The kernels round fp32 to bf16 by integer arithmetic. A GPU's canonical NaN 0x7FFFFFFF
    plus the rounding increment would wrap to 0x8000 (-0.0): every NaN must stay a NaN."""
    from labkit.workbench.guard import on_device_of

    bits = torch.tensor(
        [
            0x7FFFFFFF,
            0xFFFFFFFF,
            0x7FC00000,
            0x7F800001,
            0x7F800000,
            0xFF800000,
            0x3F800000,
            0x3F808000,
            0x3F818000,
            0x00000000,
        ],
        dtype=torch.int64,
    )
    x = bits.to(torch.int32).view(torch.float32)  # int64 -> int32 wraps: the same 32 bits
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    x = torch.cat([x, torch.randn(6, generator=g)]).to(DEV)
    out = torch.empty(x.shape, dtype=torch.bfloat16, device=DEV)
    with on_device_of(x=x):
        _to_bf16[(1,)](x, out.view(torch.int16), x.numel(), BLOCK=16)
    want = x.to(torch.bfloat16)
    assert torch.equal(out.isnan(), want.isnan()) and out[:4].isnan().all()
    assert torch.equal(out[~out.isnan()], want[~want.isnan()])
