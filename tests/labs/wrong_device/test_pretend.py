"""The pretend GPUs behind lab 01's exercises: devices reported, the current device moved by
torch.cuda.device and labkit's guard, factories placed, launches recorded, all restored after."""

import pytest
import torch
import triton

from labkit.labs.wrong_device import pretend
from labkit.labs.wrong_device.experiments import _add_one_kernel
from labkit.workbench import guard


def _compute(x, out, n):
    out.copy_(x + 1)


def test_launches_record_the_current_device_and_the_guard_moves_it():
    saved = torch.cuda.current_device
    with pretend.pretend_gpus(_add_one_kernel, _compute, current=0) as world:
        x = pretend.on(torch.arange(4.0), 1)
        out = torch.empty_like(x)
        assert out.device == torch.device("cuda", 1)
        assert torch.empty(2, device="cuda").device == torch.device("cuda", 0)
        _add_one_kernel[(1,)](x, out, 4, BLOCK=4)
        with guard.on_device_of(x=x, out=out):
            _add_one_kernel[(triton.cdiv(4, 4),)](x, out, 4, BLOCK=4)
        with torch.cuda.device(x.device):
            assert torch.cuda.current_device() == 1
        assert torch.cuda.current_device() == 0
    assert [launch.current for launch in world.launches] == [0, 1]
    assert world.launches[0].devices == ["cuda:1", "cuda:1"]
    assert torch.equal(pretend.plain(out), torch.arange(4.0) + 1)
    assert torch.cuda.current_device is saved
    assert "run" not in vars(_add_one_kernel)


def test_on_refuses_what_it_cannot_pretend():
    with pytest.raises(TypeError, match="pretend.on: t"):
        pretend.on([1.0], 1)
    with pytest.raises(ValueError, match="pretend.on: index"):
        pretend.on(torch.zeros(1), -1)
