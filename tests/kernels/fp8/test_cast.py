"""labkit.kernels.fp8.cast: the one-pass quantise against ``quantize_reference`` (two torch passes)
on fresh random inputs: the FP8 bits, the amax (of the UNSCALED input), scale_inv, saturation of
both formats, the delayed-scale semantics (this step casts with the scale of the last update and
only records its amax), and bad input. On GPUs: the in-kernel FP8 conversion bit for bit against
torch's, and the launch on the input's device whatever the current device."""

import pytest
import torch

import labkit  # noqa: F401  (picks the tier before the kernels are imported)
from labkit.kernels.fp8.cast import quantize, quantize_reference
from labkit.kernels.fp8.recipe import DelayedScaling, FP8Meta
from labkit.workbench.tier import kernel_device

DEV = kernel_device()
FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]


def _bits(t):
    return t.view(torch.uint8)


def _slots(scale: float, device=DEV):
    meta = FP8Meta.create(1, 4, device)
    meta.scale.fill_(scale)
    return meta, meta.scale[0:1], meta.amax_history[0, 0:1]


@pytest.mark.parametrize("fp8_dtype", FORMATS)
@pytest.mark.parametrize(
    "dtype, shape", [(torch.bfloat16, (37, 300)), (torch.float32, (5000,)), (torch.float16, (3, 7, 129))]
)
def test_quantize_matches_reference(fp8_dtype, dtype, shape):
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    x = (torch.randn(shape, generator=g) * 3).to(dtype).to(DEV)
    scale = float(torch.empty(()).uniform_(0.5, 40.0, generator=g))  # large enough to saturate E4M3
    _, s, amax = _slots(scale)
    q = quantize(x, s, amax, fp8_dtype)
    data, ref_amax, ref_inv = quantize_reference(x, s, fp8_dtype)
    assert q.data.dtype == fp8_dtype and q.data.shape == x.shape and q.data.device == x.device
    assert torch.equal(_bits(q.data), _bits(data))
    assert amax.item() == ref_amax.item() == x.float().abs().max().item()  # unscaled
    assert q.scale_inv.item() == ref_inv.item()


@pytest.mark.parametrize(
    "fp8_dtype, fp8_max, half",
    [
        (torch.float8_e4m3fn, 448.0, 448.0),  # 500 saturates
        (torch.float8_e5m2, 57344.0, 512.0),
    ],
)  # 500 rounds to 512
def test_values_past_the_format_saturate(fp8_dtype, fp8_max, half):
    x = torch.tensor([1e3, -1e3, 1e5, -1e5, 0.5, 0.0], device=DEV)
    _, s, amax = _slots(1000.0)
    q = quantize(x, s, amax, fp8_dtype)
    out = q.data.float().cpu()
    assert not out.isnan().any()
    assert out[:4].abs().eq(fp8_max).all() and torch.equal(out[:4].sign(), x[:4].cpu().sign())
    assert out[4].item() == half and out[5].item() == 0.0
    assert amax.item() == 1e5


def test_delayed_scaling_casts_with_the_last_scale_and_records_this_amax():
    """Step 1 casts with the initial scale 1 and records amax 10; the update turns that into
    448 / 10; step 2 casts with it (and records its own amax, 2)."""
    recipe = DelayedScaling(amax_history_len=4)
    meta = FP8Meta.create(1, 4, DEV)
    x1 = torch.tensor([10.0, -3.0, 1.0], device=DEV)
    q1 = quantize(x1, meta.scale[0:1], meta.amax_history[0, 0:1])
    assert q1.data.float().cpu().tolist() == [10.0, -3.0, 1.0] and q1.scale_inv.item() == 1.0
    assert meta.amax_history[0, 0].item() == 10.0
    meta.update_(448.0, recipe)
    assert meta.scale.item() == pytest.approx(44.8, rel=1e-6) and meta.amax_history[-1, 0].item() == 10.0
    x2 = torch.tensor([2.0, -1.0, 0.5], device=DEV)
    q2 = quantize(x2, meta.scale[0:1], meta.amax_history[0, 0:1])
    ref, _, _ = quantize_reference(x2, meta.scale[0:1])
    assert torch.equal(_bits(q2.data), _bits(ref))
    assert meta.amax_history[0, 0].item() == 2.0
    assert q2.dequantize().cpu().tolist() == pytest.approx([2.0, -1.0, 0.5], rel=2**-4)


def test_amax_slot_accumulates_the_max_over_casts():
    """Two casts before an update (two forwards in one context) leave the larger amax in the slot."""
    _, s, amax = _slots(1.0)
    quantize(torch.full((100,), 3.0, device=DEV), s, amax)
    quantize(torch.full((100,), -2.0, device=DEV), s, amax)
    assert amax.item() == 3.0


def test_bad_input_is_refused():
    _, s, amax = _slots(1.0)
    x = torch.randn(8, device=DEV)
    with pytest.raises(TypeError, match="x: dtype int32 is not supported"):
        quantize(torch.ones(8, dtype=torch.int32, device=DEV), s, amax)
    with pytest.raises(ValueError, match="x: expected a non-empty tensor"):
        quantize(torch.empty(0, device=DEV), s, amax)
    with pytest.raises(ValueError, match="x: expected a contiguous tensor"):
        quantize(torch.randn(8, 8, device=DEV).t(), s, amax)
    with pytest.raises(ValueError, match="scale: expected one fp32 element"):
        quantize(x, torch.ones(2, device=DEV), amax)
    with pytest.raises(TypeError, match="amax: dtype float64 is not supported"):
        quantize(x, s, torch.zeros(1, dtype=torch.float64, device=DEV))
    with pytest.raises(TypeError, match="fp8_dtype: expected one of"):
        quantize(x, s, amax, torch.bfloat16)
    with pytest.raises(TypeError, match="scale: expected a torch.Tensor, got float"):
        quantize(x, 1.0, amax)
    where = x.device  # "cpu", or "cuda:0" (with its index) on a GPU
    with pytest.raises(ValueError, match=f"x on {where}, scale on {where}, amax on meta"):
        quantize(x, s, torch.zeros(1, device="meta"))


@pytest.mark.gpu
@pytest.mark.parametrize("fp8_dtype", FORMATS)
def test_in_kernel_fp8_conversion_matches_torch_bit_for_bit(fp8_dtype):
    """Compiled, the kernel converts to FP8 itself: every rounding (ties included) as torch's."""
    g = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)
    x = (torch.randn(12000, 1024, generator=g, device="cuda") * 50).to(torch.bfloat16)
    # every bf16 bit pattern between -2**9 and 2**9, too: all the ties of both formats are there
    every = torch.arange(0, 2**16, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.bfloat16)
    every = every[every.float().abs() < 512]
    for t, scale in ((x, 1.7), (every.contiguous(), 1.0), (every.contiguous(), 1.7)):  # scale 1: exact ties
        _, s, amax = _slots(scale, "cuda")
        q = quantize(t, s, amax, fp8_dtype)
        data, ref_amax, ref_inv = quantize_reference(t, s, fp8_dtype)
        assert torch.equal(_bits(q.data), _bits(data))
        assert amax.item() == ref_amax.item() and q.scale_inv.item() == ref_inv.item()


@pytest.mark.multigpu
def test_quantize_runs_on_its_inputs_device():
    """The story's regression: input and state on cuda:1, current device cuda:0."""
    torch.cuda.set_device(0)
    x = (torch.randn(4096, 512) * 3).to(torch.bfloat16)
    results = []
    for dev in ("cuda:0", "cuda:1"):
        _, s, amax = _slots(20.0, dev)
        q = quantize(x.to(dev), s, amax)
        torch.cuda.synchronize(dev)
        results.append((q.data.view(torch.uint8).cpu(), amax.item(), q.data.device))
    assert torch.cuda.current_device() == 0
    assert results[1][2] == torch.device("cuda:1")
    assert torch.equal(results[0][0], results[1][0]) and results[0][1] == results[1][1]


def _with_nonfinite(shape, dtype, g, kinds=("nan", "inf", "-inf")):
    """Fresh random x with NaN / +inf / -inf at random distinct positions; returns x (on DEV)."""
    x = torch.randn(shape, generator=g) * 3
    flat = x.view(-1)
    where = torch.randperm(flat.numel(), generator=g)[: len(kinds)]
    for i, kind in zip(where.tolist(), kinds):
        flat[i] = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}[kind]
    return x.to(dtype).to(DEV)


@pytest.mark.parametrize("fp8_dtype", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kinds", [("nan",), ("inf", "-inf"), ("nan", "inf", "-inf")])
def test_nan_and_inf_propagate_as_the_reference(fp8_dtype, dtype, kinds):
    """NaN stays NaN (data and amax), +-inf saturates to +-fp8_max with amax inf: exactly as
    ``quantize_reference`` (torch's clamp keeps NaN, and its fp8 cast keeps NaN)."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    x = _with_nonfinite((3, 20000), dtype, g, kinds)  # several blocks and programs
    scale = float(torch.empty(()).uniform_(0.5, 40.0, generator=g))
    _, s, amax = _slots(scale)
    q = quantize(x, s, amax, fp8_dtype)
    data, ref_amax, _ = quantize_reference(x, s, fp8_dtype)
    got, want = q.data.float().cpu(), data.float().cpu()
    assert torch.equal(got.isnan(), want.isnan()) and want.isnan().sum() == kinds.count("nan")
    keep = ~want.isnan()
    assert torch.equal(_bits(q.data).cpu()[keep], _bits(data).cpu()[keep])
    if "nan" in kinds:
        assert ref_amax.isnan() and amax.isnan().item()
    else:
        assert ref_amax.item() == amax.item() == float("inf")


def test_nan_from_inf_times_a_zero_scale_is_kept():
    """scale 0: finite values cast to 0, inf * 0 = NaN (as the reference); amax still sees inf."""
    x = torch.tensor([1.0, float("inf"), -2.0], device=DEV)
    _, s, amax = _slots(0.0)
    q = quantize(x, s, amax)
    data, _, _ = quantize_reference(x, s)
    assert torch.equal(q.data.float().cpu().isnan(), data.float().cpu().isnan())
    assert q.data.float().cpu().isnan().tolist() == [False, True, False]
    assert amax.item() == float("inf")


def test_a_nan_amax_in_the_history_keeps_the_scale():
    """The recipe's non-finite rule: a NaN amax recorded by a cast keeps the previous scale."""
    recipe = DelayedScaling(amax_history_len=4)
    meta = FP8Meta.create(1, 4, DEV)
    meta.scale.fill_(2.0)
    quantize(torch.tensor([1.0, float("nan")], device=DEV), meta.scale[0:1], meta.amax_history[0, 0:1])
    assert meta.amax_history[0, 0].isnan().item()
    meta.update_(448.0, recipe)
    assert meta.scale.item() == 2.0 and meta.amax_history[-1, 0].isnan().item()
