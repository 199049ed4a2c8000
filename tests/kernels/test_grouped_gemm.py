"""labkit.kernels.grouped_gemm and grouped_linear: every result against a float64 loop over the
experts, on fresh random splits with zero-token experts and sizes that are not tile multiples;
backward against torch autograd of the loop; the accumulate mask; bad input; and on a GPU, the
proof that a CUDA m_splits never syncs with the host, and graph capture with counts changed on
the device between replays."""

import dataclasses
import random

import pytest
import torch

import labkit  # noqa: F401  (picks the tier before the kernels are imported)
from labkit.kernels import grouped_gemm as gg
from labkit.kernels.grouped_linear import GroupedLinear, bias_grad
from labkit.workbench.tier import kernel_device

DEV = kernel_device()
_zeros, _ones, _empty = torch.zeros, torch.ones, torch.empty
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def random_splits(rng: random.Random, experts: int, tokens: int) -> list[int]:
    """Fresh splits summing to ``tokens``, with about a third of the experts at 0."""
    live = [e for e in range(experts) if rng.random() > 0.33] or [0]
    cuts = sorted(rng.randint(0, tokens) for _ in range(len(live) - 1))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [tokens])]
    splits = [0] * experts
    for e, s in zip(live, sizes):
        splits[e] = s
    return splits


def loop_reference(x, w, splits, bias=None):
    """float64 x_e @ w_e (+ bias_e), expert by expert."""
    out, row = [], 0
    for e, m in enumerate(splits):
        y = x[row : row + m].double() @ w[e].double()
        out.append(y + bias[e].double() if bias is not None else y)
        row += m
    return torch.cat(out) if out else x.new_zeros((0, w.shape[2]), dtype=torch.float64)


def rel_err(got, ref):
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("form", ["list", "cpu_tensor", "device_tensor"])
def test_forward_matches_float64_loop(dtype, form):
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    E, K, N = rng.randint(2, 6), rng.choice([16, 40, 67]), rng.choice([16, 33, 50])
    splits = random_splits(rng, E, rng.randint(1, 90))
    M = sum(splits)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEV)
    w = torch.randn(E, K, N, generator=g).to(dtype).to(DEV)
    bias = torch.randn(E, N, generator=g).to(dtype).to(DEV)
    m_splits = {"list": splits, "cpu_tensor": torch.tensor(splits), "device_tensor": torch.tensor(splits, device=DEV)}[
        form
    ]
    out = gg.grouped_mm(x, w, m_splits, bias=bias)
    assert rel_err(out, loop_reference(x, w, splits, bias)) < TOL[dtype], (seed, splits)


def test_dgrad_through_transposed_weights_and_int64_counts():
    g = torch.Generator().manual_seed(1)
    splits = [0, 33, 1, 0, 30]
    dy = torch.randn(sum(splits), 24, generator=g).to(DEV)
    w = torch.randn(len(splits), 40, 24, generator=g).to(DEV)  # [E, K, N]: dgrad multiplies by w[e]^T
    dx = gg.grouped_mm(dy, w.transpose(1, 2), torch.tensor(splits, dtype=torch.int64, device=DEV))
    assert rel_err(dx, loop_reference(dy, w.transpose(1, 2), splits)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wgrad_sums_over_each_experts_tokens(dtype):
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    splits = random_splits(rng, 5, 70)
    M, K, N = sum(splits), 37, 45
    x = torch.randn(M, K, generator=g).to(dtype).to(DEV)
    dy = torch.randn(M, N, generator=g).to(dtype).to(DEV)
    dw = gg.grouped_mm_wgrad(x, dy, torch.tensor(splits, device=DEV))
    assert dw.dtype == torch.float32 and dw.shape == (5, K, N)
    row = 0
    for e, m in enumerate(splits):
        ref = x[row : row + m].double().T @ dy[row : row + m].double()
        row += m
        if m == 0:
            assert dw[e].abs().max().item() == 0, "a zero-token expert's gradient is 0"
        else:
            assert rel_err(dw[e], ref) < 1e-5, (seed, splits, e)


def test_wgrad_accumulate_mask_adds_or_overwrites_per_expert():
    g = torch.Generator().manual_seed(2)
    splits = [4, 0, 9, 3]
    x = torch.randn(16, 8, generator=g).to(DEV)
    dy = torch.randn(16, 12, generator=g).to(DEV)
    fresh = gg.grouped_mm_wgrad(x, dy, splits)
    main_grad = torch.full((4, 8, 12), 5.0, device=DEV)
    mask = torch.tensor([True, True, False, False], device=DEV)
    gg.grouped_mm_wgrad(x, dy, splits, out=main_grad, accumulate=mask)
    torch.testing.assert_close(main_grad[0], fresh[0] + 5.0)
    torch.testing.assert_close(main_grad[1], torch.full((8, 12), 5.0, device=DEV))  # 0 tokens, added: unchanged
    torch.testing.assert_close(main_grad[2], fresh[2])  # overwritten
    torch.testing.assert_close(main_grad[3], fresh[3])
    everything = torch.ones(4, 8, 12, device=DEV)
    gg.grouped_mm_wgrad(x, dy, splits, out=everything, accumulate=True)
    torch.testing.assert_close(everything, fresh + 1.0)


def test_grouped_linear_backward_matches_autograd_of_the_loop():
    torch.manual_seed(random.randrange(1 << 30))
    splits = random_splits(random.Random(), 4, 50)
    layer = GroupedLinear(4, 24, 20, dtype=torch.float32, device=DEV)
    x = torch.randn(sum(splits), 24, device=DEV, requires_grad=True)
    gy = torch.randn(sum(splits), 20, device=DEV)
    (layer(x, torch.tensor(splits, device=DEV)) * gy).sum().backward()

    W = layer.weight.detach().double().requires_grad_()
    B = layer.bias.detach().double().requires_grad_()
    xr = x.detach().double().requires_grad_()
    (loop_reference(xr, W, splits, B) * gy.double()).sum().backward()
    for got, ref in ((x.grad, xr.grad), (layer.weight.grad, W.grad), (layer.bias.grad, B.grad)):
        assert rel_err(got, ref) < 1e-5


def test_fused_wgrad_accumulation_follows_the_mask():
    splits = [6, 0, 5]
    layer = GroupedLinear(3, 8, 4, bias=False, fuse_wgrad_accumulation=True, dtype=torch.float32, device=DEV)
    x = torch.randn(11, 8, device=DEV)
    gy = torch.randn(11, 4, device=DEV)
    expected = gg.grouped_mm_wgrad(x, gy, splits)
    layer.weight.main_grad.fill_(2.0)
    mask = torch.tensor([True, False, False], device=DEV)
    (layer(x, splits, wgrad_accumulation_mask=mask) * gy).sum().backward()
    assert layer.weight.grad is None, "fused: dW goes to main_grad, not to .grad"
    torch.testing.assert_close(layer.weight.main_grad[0], expected[0] + 2.0)
    torch.testing.assert_close(layer.weight.main_grad[1], torch.zeros(8, 4, device=DEV))
    torch.testing.assert_close(layer.weight.main_grad[2], expected[2])


def test_bias_grad_sums_rows_per_expert():
    dy = torch.arange(12.0, device=DEV).view(6, 2)
    db = bias_grad(dy, torch.tensor([2, 0, 4], device=DEV))
    torch.testing.assert_close(db, torch.tensor([[2.0, 4.0], [0.0, 0.0], [28.0, 32.0]], device=DEV))


def test_a_wrong_device_count_never_reads_out_of_bounds(monkeypatch):
    """Counts summing past M are clamped on the device: the rows that exist are computed, the
    excess is ignored. (With check_splits=True the same call is an error.) On the CPU tier counts
    on x's device are CPU counts, which are always checked: the unchecked path of a CUDA tensor
    is taken there by letting ``device_counts`` skip its check unless ``check``."""
    if DEV.type == "cpu":
        checked = gg.device_counts

        def unchecked(name, m_splits, E, M, device, *, check=False):
            return checked(name, m_splits, E, M, device, check=True) if check else m_splits

        monkeypatch.setattr(gg, "device_counts", unchecked)
    x = torch.randn(10, 8, device=DEV)
    w = torch.randn(2, 8, 4, device=DEV)
    too_many = torch.tensor([6, 1000], device=DEV)
    out = gg.grouped_mm(x, w, too_many)
    torch.testing.assert_close(out, loop_reference(x, w, [6, 4]).float(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="m_splits: counts sum to 1006, but x has M = 10"):
        gg.grouped_mm(x, w, too_many, check_splits=True)
    negative = torch.tensor([-3, 10], device=DEV)
    out = gg.grouped_mm(x, w, negative)  # -3 reads as 0: expert 1 gets all 10 rows
    torch.testing.assert_close(out, loop_reference(x, w, [0, 10]).float(), rtol=1e-5, atol=1e-5)


def test_empty_and_zero_everything():
    w = torch.randn(3, 8, 4, device=DEV)
    assert gg.grouped_mm(torch.empty(0, 8, device=DEV), w, [0, 0, 0]).shape == (0, 4)
    dw = gg.grouped_mm_wgrad(torch.empty(0, 8, device=DEV), torch.empty(0, 4, device=DEV), [0, 0, 0])
    assert dw.shape == (3, 8, 4) and dw.abs().max().item() == 0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, w: gg.grouped_mm(x, w, [3, 3]), "m_splits: counts sum to 6, but x has M = 7"),
        (lambda x, w: gg.grouped_mm(x, w, [8, -1]), "m_splits: count of expert 1 is negative"),
        (lambda x, w: gg.grouped_mm(x, w, [7]), "m_splits: expected 2 counts"),
        (lambda x, w: gg.grouped_mm(x, w, [3.0, 4.0]), "m_splits: expected integer counts, got float"),
        (lambda x, w: gg.grouped_mm(x, w, torch.tensor([3.0, 4.0])), "m_splits: dtype float32 is not an integer"),
        (lambda x, w: gg.grouped_mm(x, w, "3,4"), "m_splits: expected a list of ints"),
        (lambda x, w: gg.grouped_mm(x, w[:, :5], [3, 4]), "w: shape .* is not \\[E, K, N\\] with K = 8"),
        (lambda x, w: gg.grouped_mm(x, w.half(), [3, 4]), "w: dtype float16 differs from x's dtype float32"),
        (lambda x, w: gg.grouped_mm(x.int(), w, [3, 4]), "x: dtype int32 is not supported"),
        (lambda x, w: gg.grouped_mm(x[0], w, [3, 4]), "x: expected a 2-D tensor"),
        (lambda x, w: gg.grouped_mm(x, w, [3, 4], bias=torch.zeros(2, 5)), "bias: expected \\[E, N\\]"),
        (lambda x, w: gg.grouped_mm(x, w, [3, 4], out=torch.empty(7, 5)), "out: shape"),
        (lambda x, w: gg.grouped_mm(x, w, [3, 4], out=torch.empty(6, 7).t()), "out: needs column stride 1"),
        (lambda x, w: gg.grouped_mm_wgrad(x, torch.zeros(6, 6), [3, 4]), "dy: has 6 rows, x has 7"),
        (lambda x, w: gg.grouped_mm_wgrad(x, torch.zeros(7, 6), [3, 4], accumulate=True), "out: accumulating needs"),
        (
            lambda x, w: gg.grouped_mm_wgrad(
                x, torch.zeros(7, 6), [3, 4], out=torch.zeros(2, 8, 6), accumulate=torch.ones(3, dtype=torch.bool)
            ),
            "accumulate: has 3 flags for 2",
        ),
        # an out of neither fp32 nor x's dtype (this path once raised NameError instead)
        (
            lambda x, w: gg.grouped_mm_wgrad(
                x, torch.zeros(7, 6), [3, 4], out=torch.zeros(2, 8, 6, dtype=torch.float16)
            ),
            "out: dtype float16; expected one of float32$",
        ),
    ],
)
def test_bad_input_names_the_argument(call, match, monkeypatch):
    # every tensor the cases make is put on the kernel device (CPU tensors on the GPU tier would
    # be refused first, for their device)
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: _zeros(*a, **{"device": DEV, **k}))
    monkeypatch.setattr(torch, "ones", lambda *a, **k: _ones(*a, **{"device": DEV, **k}))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: _empty(*a, **{"device": DEV, **k}))
    x = torch.randn(7, 8, device=DEV)
    w = torch.randn(2, 8, 6, device=DEV)
    with pytest.raises((TypeError, ValueError), match=match):
        call(x, w)


@pytest.mark.parametrize(
    "splits, match", [([3, 3, 3], "counts sum to 9, but x has M = 10"), ([12, -2, 0], "count of expert 1 is negative")]
)
@pytest.mark.parametrize("api", ["grouped_mm", "grouped_mm_wgrad", "GroupedLinear"])
def test_a_cpu_tensor_of_counts_is_checked_on_every_tier(api, splits, match):
    """A CPU m_splits costs no sync to read, so it is checked in full on every tier, also where x
    is on the CPU (the CPU tier), where it once counted as a device tensor and went unchecked."""
    x = torch.randn(10, 8, device=DEV)
    m_splits = torch.tensor(splits)  # on the CPU
    calls = {
        "grouped_mm": lambda: gg.grouped_mm(x, torch.randn(3, 8, 4, device=DEV), m_splits),
        "grouped_mm_wgrad": lambda: gg.grouped_mm_wgrad(x, torch.randn(10, 4, device=DEV), m_splits),
        "GroupedLinear": lambda: GroupedLinear(3, 8, 4, device=DEV)(x, m_splits),
    }
    with pytest.raises(ValueError, match=f"m_splits: {match}"):
        calls[api]()


@pytest.mark.gpu
def test_mixed_devices_are_refused():
    x = torch.randn(7, 8, device="cuda")
    with pytest.raises(ValueError, match="tensors must share one device: x on cuda:0, w on cpu"):
        gg.grouped_mm(x, torch.randn(2, 8, 6), [3, 4])


@pytest.mark.multigpu
def test_counts_on_another_gpu_are_refused():
    x = torch.randn(7, 8, device="cuda:0")
    w = torch.randn(2, 8, 6, device="cuda:0")
    with pytest.raises(ValueError, match="m_splits: is on cuda:1, x is on cuda:0"):
        gg.grouped_mm(x, w, torch.tensor([3, 4], device="cuda:1"))


@pytest.mark.parametrize("K, N", [(64, 32), (40, 48), (64, 40)])
def test_wgrad_tma_store_clips_at_each_experts_edge_and_adds_where_asked(K, N, monkeypatch):
    """A 2-byte out goes back through a 3-D TMA descriptor (the tile staged in shared memory):
    tiles that cross K's or N's edge (K=40, N=48 and 40 with 32-wide tiles) are clipped at their
    own expert, partial reduction steps (counts not multiples of BLOCK_K) and empty experts
    included; overwrite, add, and the per-expert mask, each against float64 on fresh splits.
    Both tiers (on a GPU, TMA needs sm_90)."""
    cfg = dataclasses.replace(gg.wgrad_config(40, 4, DEV, torch.float16), tma=True)
    monkeypatch.setattr(gg, "wgrad_config", lambda M, E, device, dtype=None: cfg)
    seed = random.randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    splits = random_splits(random.Random(seed), 4, 90)
    x = torch.randn(sum(splits), K, generator=g).to(DEV, torch.float16)
    dy = torch.randn(sum(splits), N, generator=g).to(DEV, torch.float16)
    before = torch.randn(4, K, N, generator=g).to(DEV, torch.float16)
    mask = torch.tensor([True, False, True, False], device=DEV)
    has_tma = DEV.type != "cuda" or torch.cuda.get_device_capability()[0] >= 9
    assert gg.tma_ok_wgrad(x, dy, before) == has_tma
    for accumulate in (False, True, mask):
        dw = gg.grouped_mm_wgrad(x, dy, splits, out=before.clone(), accumulate=accumulate)
        row = 0
        for e, m in enumerate(splits):
            ref = x[row : row + m].double().T @ dy[row : row + m].double()
            adds = accumulate is True or (isinstance(accumulate, torch.Tensor) and bool(mask[e]))
            if adds:
                ref = ref + before[e].double()
            scale = max(float(ref.abs().max()), 1.0)
            assert float((dw[e].double() - ref).abs().max()) / scale < 2e-3, (seed, splits, e, accumulate)
            row += m


@pytest.mark.parametrize("K, N", [(64, 32), (64, 33), (67, 32)])
@pytest.mark.parametrize("op", ["forward", "dgrad", "wgrad"])
def test_tma_and_pointer_loads_give_the_same_product(op, K, N, monkeypatch):
    """With a configuration that asks for TMA, aligned layouts load through TMA descriptors and
    others through pointers: forward (w N-contiguous), dgrad (w K-contiguous, the transposed
    view backward passes) and wgrad (rows past an expert's end zeroed in registers), each against
    float64 on fresh splits with empty experts; both tiers (on a GPU, TMA needs sm_90)."""
    cfg = dataclasses.replace(gg.forward_config(40, 4, DEV, torch.float32), tma=True)
    monkeypatch.setattr(gg, "forward_config", lambda M, E, device, dtype=None, op="forward": cfg)
    monkeypatch.setattr(gg, "wgrad_config", lambda M, E, device, dtype=None: cfg)
    seed = random.randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    splits = random_splits(random.Random(seed), 4, 40)
    x = torch.randn(sum(splits), K, generator=g).to(DEV)
    has_tma = DEV.type != "cuda" or torch.cuda.get_device_capability()[0] >= 9
    # 16-byte strides: x's rows (K fp32 values) always; N's only where a stride runs along N
    # (dgrad's stored w is [E, N, K]: its strides are multiples of K)
    tma = K % 4 == 0 and (op == "dgrad" or N % 4 == 0)
    if op == "wgrad":
        dy = torch.randn(sum(splits), N, generator=g).to(DEV)
        dw = torch.empty(4, K, N, device=DEV)
        assert gg.tma_ok_wgrad(x, dy, dw) == (tma and has_tma)
        dw, row = gg.grouped_mm_wgrad(x, dy, splits, out=dw), 0
        for e, m in enumerate(splits):
            ref = x[row : row + m].double().T @ dy[row : row + m].double()
            assert (dw[e].abs().max() == 0) if m == 0 else rel_err(dw[e], ref) < 1e-5, (seed, splits, e)
            row += m
        return
    w = torch.randn(4, K, N, generator=g).to(DEV)
    if op == "dgrad":  # x plays dy [M, K]; w [E, N, K] stored, multiplied as its transpose
        w = torch.randn(4, N, K, generator=g).to(DEV).transpose(1, 2)  # [E, K, N], unit stride along K
        assert w.stride(1) == 1
    assert gg.tma_ok(x, w) == (tma and has_tma), (op, w.stride())
    assert rel_err(gg.grouped_mm(x, w, splits), loop_reference(x, w, splits)) < 1e-5, (seed, splits)


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("warp_specialize", [False, True])
def test_the_flat_tile_loop_gives_the_per_expert_loops_product(warp_specialize, tma, monkeypatch):
    """A configuration with ``flat`` (one loop over every expert's tiles, each tile's expert found
    from the counts as vectors) against float64: forward and dgrad on fresh splits with empty
    experts and a number of experts that is not a power of two, then counts that sum past M and
    a negative count, clamped as the per-expert loops clamp them."""
    cfg = dataclasses.replace(gg.forward_config(40, 4, DEV, torch.float32), flat=True, tma=tma)
    cfg = dataclasses.replace(cfg, warp_specialize=warp_specialize)
    with pytest.raises(ValueError, match="warp_specialize: only the flat tile loop"):
        dataclasses.replace(cfg, flat=False, warp_specialize=True)
    monkeypatch.setattr(gg, "forward_config", lambda M, E, device, dtype=None, op="forward": cfg)
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    E = rng.choice([3, 5, 6])
    splits = random_splits(rng, E, rng.randint(30, 90))
    M = sum(splits)
    x = torch.randn(M, 32, generator=g).to(DEV)
    w = torch.randn(E, 32, 24, generator=g).to(DEV)
    bias = torch.randn(E, 24, generator=g).to(DEV)
    ref = loop_reference(x, w, splits, bias)
    assert rel_err(gg.grouped_mm(x, w, torch.tensor(splits, device=DEV), bias=bias), ref) < 1e-5, (seed, splits)
    w_t = w.transpose(1, 2).contiguous().transpose(1, 2)  # dgrad's layout: unit stride along K
    assert rel_err(gg.grouped_mm(x, w_t, splits), loop_reference(x, w, splits)) < 1e-5, (seed, splits)
    if DEV.type == "cpu":  # the unchecked path of device counts, as in the out-of-bounds test above
        monkeypatch.setattr(gg, "device_counts", lambda name, m, E, M, device, *, check=False: m)
    x, w = torch.randn(10, 32, device=DEV), torch.randn(3, 32, 8, device=DEV)
    for bad, clamped in (([6, 1000, 5], [6, 4, 0]), ([-3, 10, 0], [0, 10, 0]), ([2, 3, 1], [2, 3, 1])):
        out = gg.grouped_mm(x, w, torch.tensor(bad, device=DEV))
        if sum(clamped) == 10:
            torch.testing.assert_close(out, loop_reference(x, w, clamped).float(), rtol=1e-5, atol=1e-5)
        else:  # rows past the counts are not written: only the counted ones are compared
            got = out[: sum(clamped)]
            torch.testing.assert_close(got, loop_reference(x[: sum(clamped)], w, clamped).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("int64", [False, True])
@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("K, N", [(64, 64), (37, 45)])
def test_wgrad_pointer_loads_step_through_long_reductions(K, N, flat, int64, monkeypatch):
    """wgrad's pointer loads over reductions of several whole steps (the tile pointers move down
    one step per iteration) plus a partial one, per-expert and flat loops, 32- and 64-bit
    offsets, tile-multiple and ragged K and N, against float64 on fresh counts."""
    cfg = dataclasses.replace(
        gg.wgrad_config(40, 4, DEV, torch.float32), tma=False, flat=flat, warp_specialize=False, programs_per_sm=1
    )
    monkeypatch.setattr(gg, "wgrad_config", lambda M, E, device, dtype=None: cfg)
    monkeypatch.setattr(gg, "needs_int64", lambda *tensors, pad=0: int64)
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    step = cfg.block_k
    long, whole = rng.randint(3, 5) * step + rng.randint(0, step - 1), rng.randint(2, 4) * step
    splits = [long, 0, whole, rng.randint(1, 2 * step)]
    rng.shuffle(splits)
    x = torch.randn(sum(splits), K, generator=g).to(DEV)
    dy = torch.randn(sum(splits), N, generator=g).to(DEV)
    dw, row = gg.grouped_mm_wgrad(x, dy, torch.tensor(splits, device=DEV)), 0
    for e, m in enumerate(splits):
        ref = x[row : row + m].double().T @ dy[row : row + m].double()
        assert (dw[e].abs().max() == 0) if m == 0 else rel_err(dw[e], ref) < 1e-5, (seed, splits, e)
        row += m


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("warp_specialize", [False, True])
def test_the_flat_wgrad_loop_gives_the_per_expert_loops_gradients(warp_specialize, tma, monkeypatch):
    """wgrad with ``flat`` (one loop over every expert's tiles, each expert's rows found from the
    counts as vectors) against float64 on fresh splits with empty experts, partial reduction steps
    and a number of experts that is not a power of two, overwriting, adding and by mask; then
    counts that sum past M and a negative count give exactly what the per-expert loops give."""
    base = dataclasses.replace(gg.wgrad_config(40, 4, DEV, torch.float16), tma=tma)
    flat = dataclasses.replace(base, flat=True, warp_specialize=warp_specialize)
    use = {"cfg": flat}
    monkeypatch.setattr(gg, "wgrad_config", lambda M, E, device, dtype=None: use["cfg"])
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    E = rng.choice([3, 5, 6])
    splits = random_splits(rng, E, rng.randint(40, 110))
    M, K, N = sum(splits), 64, 48
    x = torch.randn(M, K, generator=g).to(DEV, torch.float16)
    dy = torch.randn(M, N, generator=g).to(DEV, torch.float16)
    before = torch.randn(E, K, N, generator=g).to(DEV, torch.float16)
    mask = torch.tensor([e % 2 == 0 for e in range(E)], device=DEV)
    for accumulate in (False, True, mask):
        dw = gg.grouped_mm_wgrad(x, dy, torch.tensor(splits, device=DEV), out=before.clone(), accumulate=accumulate)
        row = 0
        for e, m in enumerate(splits):
            ref = x[row : row + m].double().T @ dy[row : row + m].double()
            if accumulate is True or (isinstance(accumulate, torch.Tensor) and bool(mask[e])):
                ref = ref + before[e].double()
            scale = max(float(ref.abs().max()), 1.0)
            assert float((dw[e].double() - ref).abs().max()) / scale < 2e-3, (seed, splits, e, accumulate)
            row += m
    if DEV.type == "cpu":  # the unchecked path of device counts, as in the out-of-bounds test above
        monkeypatch.setattr(gg, "device_counts", lambda name, m, E, M, device, *, check=False: m)
    x, dy = torch.randn(10, 32, device=DEV, dtype=torch.float16), torch.randn(10, 16, device=DEV, dtype=torch.float16)
    for bad in ([6, 1000, 5], [-3, 10, 0], [2, 3, 1]):
        got = {}
        for name, cfg in (
            ("flat", dataclasses.replace(flat, tma=False)),
            ("per expert", dataclasses.replace(base, tma=False)),
        ):
            use["cfg"] = cfg
            got[name] = gg.grouped_mm_wgrad(x, dy, torch.tensor(bad, device=DEV))
        assert torch.equal(got["flat"], got["per expert"]), bad


def test_grouped_mm_looks_up_the_dgrad_table_for_a_k_contiguous_w(monkeypatch):
    """grouped_mm asks forward_config for op "dgrad" when w's unit stride is along K (backward's
    ``w.transpose(1, 2)``) and "forward" otherwise; the product is right either way."""
    asked = []
    original = gg.forward_config

    def spy(M, E, device, dtype=torch.bfloat16, op="forward"):
        asked.append(op)
        return original(M, E, device, dtype, op)

    monkeypatch.setattr(gg, "forward_config", spy)
    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    x, w = torch.randn(12, 16, generator=g).to(DEV), torch.randn(3, 16, 8, generator=g).to(DEV)
    splits = [5, 0, 7]
    for weight in (w, torch.randn(3, 8, 16, generator=g).to(DEV).transpose(1, 2)):
        assert rel_err(gg.grouped_mm(x, weight, splits), loop_reference(x, weight, splits)) < 1e-5
    assert asked == ["forward", "dgrad"]
    with pytest.raises(ValueError, match="config_table: op 'fwd' is not one of"):
        gg.config_table(DEV, "fwd")
    if DEV.type != "cuda":
        assert gg.config_table(DEV, "dgrad") is None and gg.config_source(DEV) == "interpreter config"


def test_config_tables_are_well_formed():
    """Every table: its key's device and op, thresholds falling to 0 (every shape reaches a row),
    and a source that names a recorded file (or None, a default said so)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for (device, op), table in gg.TABLES.items():
        assert (table.device, table.op) == (device, op) and op in gg.OPS
        thresholds = [t for t, _ in table.rows]
        assert thresholds == sorted(thresholds, reverse=True) and thresholds[-1] == 0, table
        assert table.source is None or (root / table.source).is_file(), table.source
    assert set(gg.HOPPER_DEFAULTS) == set(gg.OPS)
    assert gg.HOPPER_FORWARD == gg.HOPPER_DEFAULTS["forward"].rows


@pytest.mark.gpu
def test_device_counts_never_sync_with_the_host():
    """The claim of the lab, checked by torch itself: with sync debug mode "error" any
    device-to-host synchronisation raises. Forward, dgrad, wgrad and the layer's backward run."""
    layer = GroupedLinear(8, 256, 128, dtype=torch.bfloat16, device="cuda")
    counts = torch.tensor([100, 0, 37, 300, 1, 0, 62, 12], device="cuda")
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(512, 128, device="cuda", dtype=torch.bfloat16)
    (layer(x, counts) * gy).sum().backward()  # compile and load every kernel first
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        x.grad = None
        (layer(x, counts) * gy).sum().backward()
        with pytest.raises(RuntimeError, match="called a synchronizing CUDA operation"):
            counts.tolist()  # the check is live: a host read raises
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()


@pytest.mark.gpu
def test_one_graph_serves_every_token_distribution():
    """Capture once; write new counts into the captured tensor on the device; each replay equals
    an eager call with those counts."""
    g = torch.Generator(device="cuda").manual_seed(3)
    E, M, K, N = 16, 1024, 512, 384
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(E, K, N, device="cuda", dtype=torch.bfloat16, generator=g) / K**0.5
    counts = torch.tensor(random_splits(random.Random(0), E, M), device="cuda")
    out = gg.grouped_mm(x, w, counts)  # warm-up: compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gg.grouped_mm(x, w, counts, out=out)
    for seed in range(1, 4):
        splits = random_splits(random.Random(seed), E, M)
        counts.copy_(torch.tensor(splits))  # new distribution, written into the captured tensor
        graph.replay()
        torch.testing.assert_close(out, gg.grouped_mm(x, w, splits), rtol=0, atol=0)
        assert rel_err(out, loop_reference(x, w, splits)) < TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("op", gg.OPS)
@pytest.mark.parametrize(
    "E, M, K, N", [(4, 8192, 1024, 1024), (8, 4096, 1024, 1024), (64, 4096, 512, 704), (128, 2048, 512, 384)]
)
def test_device_tables_at_lab_shapes(op, E, M, K, N):
    """Each configuration this GPU's table for ``op`` picks (by tokens per expert), skewed splits,
    against float64: between them the shapes reach every row of the table (checked first)."""
    table = gg.config_table(torch.device("cuda"), op)
    if table is None:
        pytest.skip(f"no table for {op} on {torch.cuda.get_device_name()}: the generic config")
    if E == 4:
        picks = {table.pick(m // e) for m, e in ((8192, 4), (4096, 8), (4096, 64), (2048, 128))}
        assert picks == {c for _, c in table.rows}
    g = torch.Generator(device="cuda").manual_seed(E)
    splits = random_splits(random.Random(E), E, M)
    counts = torch.tensor(splits, device="cuda")
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(E, K, N, device="cuda", dtype=torch.bfloat16, generator=g)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=g)
    if op == "forward":
        assert rel_err(gg.grouped_mm(x, w, counts), loop_reference(x, w, splits)) < TOL[torch.bfloat16]
    elif op == "dgrad":
        wt = w.transpose(1, 2)
        assert rel_err(gg.grouped_mm(dy, wt, counts), loop_reference(dy, wt, splits)) < TOL[torch.bfloat16]
    else:
        dw, row = gg.grouped_mm_wgrad(x, dy, counts), 0
        for e, m in enumerate(splits):
            ref = x[row : row + m].double().T @ dy[row : row + m].double()
            assert (dw[e].abs().max() == 0) if m == 0 else rel_err(dw[e], ref) < 1e-3, (E, e)
            row += m


def test_grouped_linear_names_in_features_for_a_wrong_width():
    """The caller passed only x: the error names x and in_features, not w."""
    layer = GroupedLinear(3, 16, 8, device=DEV)
    with pytest.raises(ValueError, match=r"x: expected \[M, in_features\] = \[M, 16\], got shape \(10, 12\)"):
        layer(torch.randn(10, 12, device=DEV), [3, 3, 4])


def test_fused_accumulation_without_its_buffer_names_main_grad():
    layer = GroupedLinear(3, 16, 8, fuse_wgrad_accumulation=True, device=DEV)
    x = torch.randn(10, 16, device=DEV)
    del layer.weight.main_grad
    with pytest.raises(ValueError, match=r"weight.main_grad: fuse_wgrad_accumulation=True needs .* got none"):
        layer(x, [3, 3, 4])
    layer.weight.main_grad = torch.zeros(3, 16, 8, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match=r"weight.main_grad: .*got bfloat16 \(3, 16, 8\)"):
        layer(x, [3, 3, 4])
