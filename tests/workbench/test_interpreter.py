"""labkit.workbench.interpreter.fast_device_calls: within a launch under the Triton interpreter, a
device function's call skips Triton's re-patch of the language modules; the results, and the
modules after the launch, are Triton's own."""

import pytest
import torch
import triton
import triton.language as tl

import labkit.kernels  # noqa: F401  (installs it, as every labkit kernel's import does)
from labkit.workbench import interpreter, tier

pytestmark = pytest.mark.skipif(not tier.interpreted(), reason="interpreter tier only: compiled kernels call no Python")


@triton.jit
def _double(x):
    return x * 2


@triton.jit
def _doubled_kernel(
    x_ptr,  # *fp32 [n]: doubled CALLS times, in place
    n,
    BLOCK: tl.constexpr,
    CALLS: tl.constexpr,  # calls of the device function _double
):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    for _ in tl.static_range(CALLS):
        x = _double(x)
    tl.store(x_ptr + offs, x, mask=mask)


def test_a_launch_patches_the_language_once_however_many_device_calls(monkeypatch):
    from triton.runtime import interpreter as ti

    assert interpreter.fast_device_calls()
    scopes = []  # one per patch of the language modules that Triton makes

    class Counted(ti._LangPatchScope):
        def __init__(self):
            super().__init__()
            scopes.append(self)

    monkeypatch.setattr(ti, "_LangPatchScope", Counted)
    builtins = {name: getattr(tl, name) for name in ("load", "store", "arange", "zeros", "where")}
    for calls in (1, 5):
        scopes.clear()
        x = torch.arange(10, dtype=torch.float32)
        _doubled_kernel[(1,)](x, 10, BLOCK=16, CALLS=calls)
        assert torch.equal(x, torch.arange(10, dtype=torch.float32) * 2**calls)
        assert len(scopes) == 1, len(scopes)  # the launch's own; none for the device calls
        assert {name: getattr(tl, name) for name in builtins} == builtins  # put back after the launch
    assert interpreter.fast_device_calls()  # once per process: the same answer, nothing installed twice
