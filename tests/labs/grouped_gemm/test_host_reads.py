"""The counting stand-in behind lab 04's exercises: host reads of the counts are counted, device
work on them is not, and labkit's own kernel's CPU-tier check is excused unless check_splits."""

import pytest
import torch

from labkit.kernels import grouped_gemm as gg
from labkit.labs.grouped_gemm.host_reads import CountedSplits
from labkit.workbench import tier


def test_host_reads_are_counted_and_device_work_is_not():
    m = CountedSplits.wrap(torch.tensor([3, 0, 2]))
    starts = torch.cumsum(m, 0) - m  # device work: no read
    assert CountedSplits.reads == []
    starts.tolist()  # a tensor computed from the counts: still counted
    int(m[0])
    m.to("cpu")
    assert [r.split(" at ")[0] for r in CountedSplits.reads] == ["tolist", "__int__", "to"]


def test_labkits_kernel_is_excused_unless_it_checks_the_splits():
    dev = tier.kernel_device()  # the CPU under the interpreter; a GPU's kernels take CUDA tensors
    x, w = torch.randn(5, 8, device=dev), torch.randn(3, 8, 4, device=dev)
    m = CountedSplits.wrap(torch.tensor([3, 0, 2], device=dev))
    out = gg.grouped_mm(x, w, m)
    assert CountedSplits.reads == [] and torch.allclose(out[:3], x[:3] @ w[0], atol=1e-4)
    gg.grouped_mm(x, w, m, check_splits=True)
    assert len(CountedSplits.reads) == 1 and CountedSplits.reads[0].startswith("tolist")


def test_wrap_refuses_what_is_not_an_integer_tensor():
    with pytest.raises(TypeError, match="CountedSplits.wrap: counts"):
        CountedSplits.wrap([3, 0, 2])
    with pytest.raises(TypeError, match="CountedSplits.wrap: counts"):
        CountedSplits.wrap(torch.ones(3))
