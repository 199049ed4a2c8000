"""labkit's kernels: exact against torch on fresh random inputs, guarded, inputs checked.

The multi-GPU test applies the wrong-current-device regression to EVERY launcher in
labkit.kernels.LAUNCHERS: data on cuda:1 while the current device is cuda:0."""

import pytest
import torch

import labkit
from labkit.kernels import LAUNCHERS, copy
from labkit.workbench.guard import common_device, on_device_of

DEV = labkit.workbench.tier.kernel_device()


def _random(n, dtype, device=DEV):
    if dtype.is_floating_point:
        return torch.randn(n, device=device).to(dtype)
    hi = 255 if dtype == torch.uint8 else 2**30
    return torch.randint(0, hi, (n,), device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.uint8])
@pytest.mark.parametrize("n", [1, 1000, 65_537, 200_003])
def test_copy_is_exact(dtype, n):
    x = _random(n, dtype)
    out = torch.full_like(x, 7) if not dtype.is_floating_point else torch.full_like(x, float("nan"))
    assert copy(x, out) is out
    assert torch.equal(out, x)


def test_copy_keeps_shape_and_allocates_on_the_input_device():
    x = torch.randn(3, 5, 7, device=DEV)
    y = copy(x)
    assert y.shape == x.shape and y.device == x.device and torch.equal(x, y)
    assert copy(torch.empty(0, device=DEV)).numel() == 0


@pytest.mark.parametrize(
    "make,exc,match",
    [
        (lambda: copy([1, 2, 3]), TypeError, "src: expected a torch.Tensor, got list"),
        (
            lambda: copy(torch.randn(4, dtype=torch.float64, device=DEV)),
            TypeError,
            "src: dtype float64 is not supported",
        ),
        (lambda: copy(torch.randn(4, 4, device=DEV).t()), ValueError, "src: expected a contiguous tensor"),
        (
            lambda: copy(torch.randn(4, device=DEV), torch.empty(5, device=DEV)),
            ValueError,
            r"out: shape \(5,\) differs",
        ),
        (
            lambda: copy(torch.randn(4, device=DEV), torch.empty(4, dtype=torch.float16, device=DEV)),
            TypeError,
            "out: dtype torch.float16 differs",
        ),
    ],
)
def test_copy_refuses_bad_input(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


@pytest.mark.parametrize("shift", [1, -1, 1000])
def test_copy_refuses_an_out_that_partly_overlaps_src(shift):
    """torch's copy_ refuses a partial overlap; the kernel would read elements it already wrote."""
    n = 100_000
    buf = torch.randn(n + abs(shift), device=DEV)
    src = buf[max(0, -shift) : max(0, -shift) + n]
    out = buf[max(0, shift) : max(0, shift) + n]
    before = buf.clone()
    with pytest.raises(ValueError, match="out: overlaps src in memory"):
        copy(src, out)
    assert torch.equal(buf, before)  # refused before anything was written


def test_copy_into_itself_is_the_identity():
    """out the very memory of src (same start, same layout): every element is read before it is
    written, so the copy is exact, as torch's ``x.copy_(x)``."""
    x = torch.randn(70_000, device=DEV)
    want = x.clone()
    assert copy(x, x) is x and torch.equal(x, want)


def test_mixed_devices_are_named():
    cpu, meta = torch.empty(2), torch.empty(2, device="meta")
    with pytest.raises(ValueError, match="tensors must share one device: src on cpu, out on meta"):
        common_device(src=cpu, out=meta)
    assert common_device(a=cpu, b=None) == torch.device("cpu")
    with pytest.raises(ValueError, match="no tensors"):
        common_device(a=None)


@pytest.mark.parametrize("value", [[1, 2], 3.0, "cuda:0", torch.device("cpu")])
def test_the_guard_names_an_argument_that_is_not_a_tensor(value):
    with pytest.raises(
        TypeError, match=f"common_device: y: expected a torch.Tensor or None, got {type(value).__name__}"
    ):
        on_device_of(x=torch.empty(2), y=value)
    with pytest.raises(TypeError, match="common_device: x: expected a torch.Tensor or None"):
        common_device(x=value)


def test_guard_on_cpu_is_a_no_op():
    with on_device_of(x=torch.empty(1)) as dev:
        assert dev == torch.device("cpu")


@pytest.mark.gpu
def test_cpu_tensor_to_gpu_kernel_is_refused():
    with pytest.raises(ValueError, match="src: is on cpu; labkit's Triton kernels take CUDA tensors"):
        copy(torch.randn(4))


def _guarded_add_one():
    """Lab 01's experiment kernel, guarded (its default): held to the same regression."""
    from labkit.labs.wrong_device.experiments import add_one

    return add_one, lambda g: (torch.randn(1 << 20, generator=g),)


@pytest.mark.multigpu
@pytest.mark.parametrize("name", sorted(LAUNCHERS) + ["add_one (lab 01)"])
def test_every_launcher_runs_on_its_inputs_device(name):
    """The story's regression for every kernel: data on cuda:1, current device cuda:0."""
    launch, make_inputs = LAUNCHERS[name] if name in LAUNCHERS else _guarded_add_one()
    inputs = make_inputs(torch.Generator().manual_seed(torch.seed() % 2**31))
    torch.cuda.set_device(0)
    ref = launch(*[t.to("cuda:0") for t in inputs])
    out = launch(*[t.to("cuda:1") for t in inputs])
    torch.cuda.synchronize(1)
    assert out.device == torch.device("cuda:1")
    assert torch.cuda.current_device() == 0
    assert torch.equal(out.cpu(), ref.cpu())


@pytest.mark.multigpu
def test_copy_refuses_tensors_on_two_gpus():
    with pytest.raises(ValueError, match="src on cuda:0, out on cuda:1"):
        copy(torch.randn(4, device="cuda:0"), torch.empty(4, device="cuda:1"))
