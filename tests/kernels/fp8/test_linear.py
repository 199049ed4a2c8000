"""labkit.kernels.fp8 linear layer, GEMM and autocast: forward and backward against float64 within
stated bounds, the cached FP8 weight, the GEMM backends (scaled_mm on the CPU where torch has it,
shapes that are not multiples of 16), where the scaling state lives, and bad input. On GPUs: the
scaled_mm path against the emulation, and the device-aware layer on cuda:1 (current device cuda:0)
against the same layer on cuda:0, bit for bit.

The bounds. E4M3 keeps 3 mantissa bits: a normal value is rounded with relative error at most
u = 2**-4; below the smallest normal (2**-6 after scaling) the error is at most half the subnormal
spacing, 2**-10 / scale. E5M2 (gradients): u = 2**-3, 2**-17 / scale. Each product of two rounded
operands is then off by at most |ea| |b~| + |a| |eb|, summed over K: the HARD bound checked per
element (plus bf16 output rounding, 2**-8 of the result, and fp32 accumulation). The TYPICAL error
is far below it: rounding errors are independent, about u / sqrt(3) rms each, so the norm-wise
error of E4M3 x E4M3 is about sqrt(2) x 0.036 / 1.4 = 0.037 (measured 0.037 at K = 32 .. 2048):
bound 0.06; E5M2 x E4M3 about 0.06: bound 0.1."""

import warnings

import pytest
import torch

import labkit  # noqa: F401  (picks the tier before the kernels are imported)
from labkit.kernels.fp8 import DelayedScaling, DeviceAware, FP8Linear, fp8_autocast, fp8_gemm, quantize
from labkit.kernels.fp8 import gemm as gemm_mod
from labkit.kernels.fp8.recipe import FP8Meta
from labkit.workbench.tier import kernel_device

DEV = kernel_device()
E4M3 = (2.0**-4, 2.0**-10)  # (relative rounding bound, subnormal absolute bound before scaling)
E5M2 = (2.0**-3, 2.0**-17)


def _err(a, scale, fmt):
    """The largest rounding error of each element of ``a`` cast with ``scale``."""
    u, sub = fmt
    return u * a.abs() + sub / scale


def _hard_bound(a, sa, fa, b, sb, fb, ref):
    """|a~ b~^T - a b^T| per element, plus output rounding (bf16) and fp32 accumulation."""
    ea, eb = _err(a, sa, fa), _err(b, sb, fb)
    return ea @ (b.abs() + eb).T + a.abs() @ eb.T + 2.0**-8 * ref.abs() + 1e-5 * (a.abs() @ b.abs().T)


def _layer(K=256, N=64, seed=0, device=DEV, **kw):
    torch.manual_seed(seed)
    lin = FP8Linear(K, N, dtype=torch.bfloat16, device=device, **kw)
    with torch.no_grad():
        lin.weight.normal_(0, K**-0.5)
    return lin


def _norm_err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def test_forward_and_backward_within_bounds():
    _check_bounds(DEV)


def _check_bounds(device):
    lin = _layer(device=device)
    x = torch.randn(96, 256, device=device).to(torch.bfloat16).requires_grad_()
    with fp8_autocast():  # step 1: calibrates every scale (casts with scale 1)
        lin(x)
    fwd, bwd = lin.fp8_meta("forward"), lin.fp8_meta("backward")
    sx, sw = fwd.scale[0].item(), fwd.scale[1].item()
    with fp8_autocast():
        y = lin(x)
    dy = torch.randn(96, 64, device=device).to(torch.bfloat16)
    sdy = bwd.scale[0].item()  # scale 1 (no backward ran yet): E5M2 spans it
    y.backward(dy)
    xd, wd, dyd = x.detach().double(), lin.weight.detach().double(), dy.double()
    ref = xd @ wd.T
    assert ((y.double() - ref).abs() <= _hard_bound(xd, sx, E4M3, wd, sw, E4M3, ref)).all()
    assert _norm_err(y, ref) < 0.06
    dx_ref = dyd @ wd
    assert ((x.grad.double() - dx_ref).abs() <= _hard_bound(dyd, sdy, E5M2, wd.T.contiguous(), sw, E4M3, dx_ref)).all()
    assert _norm_err(x.grad, dx_ref) < 0.1
    dw_ref = dyd.T @ xd
    assert ((lin.weight.grad.double() - dw_ref).abs() <= _hard_bound(dyd.T, sdy, E5M2, xd.T, sx, E4M3, dw_ref)).all()
    assert _norm_err(lin.weight.grad, dw_ref) < 0.1


def test_outside_the_context_it_is_nn_linear():
    lin = _layer(K=32, N=16)
    x = torch.randn(4, 32, device=DEV).to(torch.bfloat16)
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))
    with fp8_autocast(enabled=False):
        assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))
    assert lin.weight_casts == 0 and lin.fp8_forward_amax_history.eq(0).all()


def test_weight_is_cast_once_per_optimizer_step():
    lin = _layer(K=32, N=16)
    x = torch.randn(16, 32, device=DEV).to(torch.bfloat16)
    casts = []
    for _ in range(4):
        with fp8_autocast():
            lin(x)
        casts.append(lin.weight_casts)
    # cast at step 1 (scale 1), once more after the first update, then cached
    assert casts == [1, 2, 2, 2]
    with torch.no_grad():
        lin.weight.mul_(1.01)  # what an optimizer step does: an in-place update
    with fp8_autocast():
        lin(x)
    assert lin.weight_casts == 3
    lin.refresh_weight_cache()
    with fp8_autocast():
        lin(x)
    assert lin.weight_casts == 4


def test_state_is_made_on_the_weights_device_and_moves_with_it():
    lin = FP8Linear(32, 16, device="meta")
    for direction in ("forward", "backward"):
        assert lin.fp8_meta(direction).device == torch.device("meta")
    lin = FP8Linear(32, 16).to("meta")
    assert {b.device for b in lin.buffers()} == {torch.device("meta")}
    assert "fp8_forward_amax_history" in lin.state_dict()


def test_history_length_follows_the_recipe():
    lin = FP8Linear(32, 16, recipe=DelayedScaling(amax_history_len=5), device=DEV)
    assert lin.fp8_meta("forward").amax_history.shape == (5, 2) and lin.fp8_meta("backward").scale.shape == (1,)
    with pytest.raises(ValueError, match="recipe: amax_history_len=16 but .* was built with 5"):
        with fp8_autocast():
            lin(torch.randn(16, 32, device=DEV).to(torch.bfloat16))


def test_input_on_another_device_than_the_weight_is_refused():
    lin = FP8Linear(32, 16, device=DEV, dtype=torch.bfloat16)
    lin.fp8_name = "mlp.up_proj"
    x = torch.empty(16, 32, device="meta", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"x: is on meta but the weight of mlp.up_proj is on {DEV}"):
        with fp8_autocast():
            lin(x)


def test_bad_input_is_refused():
    lin = FP8Linear(32, 16, device=DEV, dtype=torch.bfloat16)
    with fp8_autocast():
        with pytest.raises(ValueError, match=r"x: expected a non-empty tensor of shape \[..., 32\], got \(4, 31\)"):
            lin(torch.randn(4, 31, device=DEV).to(torch.bfloat16))
        with pytest.raises(TypeError, match="x: dtype torch.int64 is not supported"):
            lin(torch.ones(4, 32, dtype=torch.int64, device=DEV))
    with pytest.raises(ValueError, match="mode: expected one of 'device_aware'"):
        fp8_autocast(mode="naive")
    with pytest.raises(TypeError, match="recipe: expected a labkit.kernels.fp8.DelayedScaling, got dict"):
        fp8_autocast(recipe={"margin": 0})
    with pytest.raises(ValueError, match="in_features: expected a positive int"):
        FP8Linear(0, 16)
    with pytest.raises(ValueError, match="backend: 'cublas' is not one of"):
        FP8Linear(16, 16, backend="cublas")


def _operands(M, N, K, device=DEV):
    metas = FP8Meta.create(2, 1, device)
    a = quantize(torch.randn(M, K, device=device).to(torch.bfloat16), metas.scale[0:1], metas.amax_history[0, 0:1])
    b = quantize(torch.randn(N, K, device=device).to(torch.bfloat16), metas.scale[1:2], metas.amax_history[0, 1:2])
    return a, b


def test_scaled_mm_shapes_must_be_multiples_of_16():
    a, b = _operands(24, 32, 48)
    with pytest.raises(
        ValueError,
        match=r"x: the FP8 GEMM \(torch._scaled_mm\) needs every dimension a multiple "
        r"of 16; x has shape \(24, 48\)",
    ):
        fp8_gemm(a, b, backend="scaled_mm", a_name="x", b_name="weight")
    a, b = _operands(32, 24, 48)
    with pytest.raises(ValueError, match=r"weight: .* has shape \(24, 48\)"):
        fp8_gemm(a, b, backend="scaled_mm", a_name="x", b_name="weight")
    assert fp8_gemm(a, b, backend="emulated").shape == (32, 24)  # the emulation takes any shape


@pytest.mark.parametrize("api", ["F.scaled_mm", "torch._scaled_mm"])
def test_both_scaled_mm_calls_match_the_emulation(api, monkeypatch):
    """Both calls' arguments, checked on the kernels' device: torch's CPU build runs _scaled_mm too
    (2.13 does), a GPU with FP8 runs both for real."""
    if api == "F.scaled_mm" and gemm_mod.scaled_mm_api() != "F.scaled_mm":
        pytest.skip(f"torch {torch.__version__} has no F.scaled_mm")
    monkeypatch.setattr(gemm_mod, "scaled_mm_api", lambda: api)
    a, b = _operands(32, 48, 64, DEV)
    try:
        got = fp8_gemm(a, b, out_dtype=torch.float32, backend="scaled_mm")
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"{api} does not run on this torch's CPU: {str(e).splitlines()[0]}")
    want = fp8_gemm(a, b, out_dtype=torch.float32, backend="emulated")
    # the CPU's _scaled_mm accumulates in fp32 as the emulation does; Hopper's FP8 tensor cores
    # accumulate with fewer bits (seen on one H200: about 1e-4 of the largest output at K = 48)
    bound = 1e-5 if got.device.type == "cpu" else 1e-3
    assert ((got - want).abs().max() / want.abs().max()).item() <= bound


def test_a_gpu_without_fp8_warns_and_emulates(monkeypatch):
    monkeypatch.setattr(
        gemm_mod,
        "fp8_gemm_support",
        lambda d: (False, "cuda:0 (Fake A100, sm_80) has no FP8 tensor cores; they need sm_89"),
    )
    with pytest.warns(UserWarning, match="Fake A100, sm_80.*using the emulated GEMM"):
        assert gemm_mod.choose_backend(torch.device("cuda", 0)) == "emulated"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gemm_mod.choose_backend(torch.device("cpu")) == "emulated"  # the CPU tier: no warning
    with pytest.raises(ValueError, match="backend: 'fast' is not one of"):
        gemm_mod.choose_backend(torch.device("cpu"), "fast")


@pytest.mark.gpu
def test_scaled_mm_matches_the_emulation_on_the_gpu():
    ok, reason = gemm_mod.fp8_gemm_support(torch.device("cuda"))
    if not ok:
        pytest.skip(reason)
    a, b = _operands(256, 512, 1024, "cuda")
    got = fp8_gemm(a, b, out_dtype=torch.float32, backend="scaled_mm")
    ref = fp8_gemm(a, b, out_dtype=torch.float32, backend="emulated")
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-3 * ref.abs().max().item())


@pytest.mark.gpu
def test_forward_and_backward_within_bounds_on_the_gpu():
    """The same bounds through torch._scaled_mm (where the GPU has FP8) and the compiled cast."""
    _check_bounds(torch.device("cuda"))


def _train_steps(device):
    recipe = DelayedScaling(amax_history_len=4)
    lin = _layer(K=512, N=256, seed=3, device=device, recipe=recipe)
    x = (torch.randn(1024, 512, generator=torch.Generator().manual_seed(5))).to(torch.bfloat16).to(device)
    x.requires_grad_()
    outs = []
    for _ in range(3):
        with fp8_autocast(recipe=recipe):
            y = lin(x)
        y.float().square().mean().backward()
        outs += [t.detach().cpu() for t in (y, x.grad, lin.weight.grad, *lin.buffers())]  # this step's values
    return outs, lin


@pytest.mark.multigpu
def test_device_aware_on_cuda1_equals_cuda0_bit_for_bit():
    torch.cuda.set_device(0)
    ref, _ = _train_steps("cuda:0")
    got, lin = _train_steps("cuda:1")
    assert torch.cuda.current_device() == 0
    assert {b.device for b in lin.buffers()} == {torch.device("cuda:1")}
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


class _Spy(DeviceAware):
    """The product's policy, recording the FP8 dtype of every cast."""

    name = "spy"

    def __init__(self):
        self.casts = []

    def quantize(self, x, meta, index, fp8_dtype):
        self.casts.append((tuple(x.shape), fp8_dtype))
        return super().quantize(x, meta, index, fp8_dtype)


@pytest.mark.parametrize("fmt, grad_dtype", [("HYBRID", torch.float8_e5m2), ("E4M3", torch.float8_e4m3fn)])
def test_gradients_are_cast_to_the_recipes_backward_format(fmt, grad_dtype):
    lin = _layer(K=32, N=16)
    x = torch.randn(16, 32, device=DEV).to(torch.bfloat16).requires_grad_()
    spy = _Spy()
    with fp8_autocast(recipe=DelayedScaling(fp8_format=fmt), mode=spy):
        y = lin(x)
    y.sum().backward()
    assert spy.casts == [
        ((16, 32), torch.float8_e4m3fn),  # the input
        ((16, 32), torch.float8_e4m3fn),  # the weight [out=16, in=32]
        ((16, 16), grad_dtype),
    ]  # the output gradient


def test_the_functional_form_needs_an_entered_context():
    from labkit.kernels.fp8 import fp8_linear

    lin = _layer(K=32, N=16)
    x = torch.randn(16, 32, device=DEV).to(torch.bfloat16)
    with pytest.raises(ValueError, match="ctx: expected an entered fp8_autocast, got None"):
        fp8_linear(x, lin)
    with fp8_autocast() as ctx:
        y = fp8_linear(x, lin)
    assert y.shape == (16, 16) and [e.direction for e in ctx.entries] == ["forward", "backward"]


def test_a_nan_row_gives_a_nan_row_and_the_history_keeps_the_scale():
    """A NaN in x: the output row is NaN as nn.Linear's, the other rows finite; the amax history
    records NaN, so the update keeps the previous scale; the next clean step, inside the range
    that scale was calibrated on, is finite and within the usual bound of the fp64 reference. (An
    input beyond that range is clipped to E4M3's largest value, by design of delayed scaling: a
    random one past the first step's amax once gave 0.063 here.)"""
    # every dimension a multiple of 16: on a GPU the layer runs torch._scaled_mm
    lin = _layer(K=32, N=16, recipe=DelayedScaling(amax_history_len=4))
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    x1 = torch.randn(16, 32, generator=g).to(torch.bfloat16)
    with fp8_autocast(recipe=DelayedScaling(amax_history_len=4)):  # a first clean step sets the scales
        lin(x1.to(DEV))
    scales = lin.fp8_forward_scale.clone()
    x = torch.randn(16, 32, generator=g).to(torch.bfloat16)
    row = int(torch.randint(0, 16, (1,), generator=g))
    x[row, int(torch.randint(0, 32, (1,), generator=g))] = float("nan")
    x = x.to(DEV)
    with fp8_autocast(recipe=DelayedScaling(amax_history_len=4)):
        y = lin(x)
    want = torch.nn.functional.linear(x, lin.weight)
    assert torch.equal(y.isnan().any(1).cpu(), want.isnan().any(1).cpu())
    assert y[row].isnan().all() and y.isnan().sum() == y.shape[1]
    assert lin.fp8_forward_amax_history[-1, 0].isnan().item()  # the input's amax: NaN
    assert torch.equal(lin.fp8_forward_scale, scales)  # non-finite amax: scale kept
    x2 = torch.randn(16, 32, generator=g)
    x2 = x2 * min(1.0, x1.float().abs().max().item() / x2.abs().max().item())  # inside the kept scale's range
    x2 = x2.to(torch.bfloat16).to(DEV)
    with fp8_autocast(recipe=DelayedScaling(amax_history_len=4)):
        y2 = lin(x2)
    ref = x2.double() @ lin.weight.double().T
    assert y2.isfinite().all() and _norm_err(y2, ref) < 0.06
