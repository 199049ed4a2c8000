"""labkit.labs.collectives.links: the link-copy kernel moves the right bytes across ranks (emulated on the
CPU tier, over NVLink on GPUs), refuses bad input, and its tables pick the fastest correct run.
The bandwidth itself is measured by ``labkit bench collectives_links``, not asserted here."""

import secrets

import pytest
import torch

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm.ranks import run_ranks
from labkit.labs.collectives import links
from labkit.workbench import tier


def _worlds():
    if tier.interpreted() or not torch.cuda.is_available():
        return [2, 3]
    return [w for w in (2, 4) if w <= torch.cuda.device_count()] or [2]


@pytest.mark.parametrize("w", _worlds())
def test_link_copy_reads_and_writes_peers(w):
    if not tier.interpreted() and torch.cuda.device_count() < w:
        pytest.skip(f"needs {w} GPUs, this machine has {torch.cuda.device_count()}")
    import rank_fns

    seed = secrets.randbelow(2**20)
    n = 4096 * 3 + 5 if tier.interpreted() else (1 << 20) + 5  # full blocks and a tail
    per_rank = run_ranks(rank_fns.link_copy_roundtrip, w, n, seed, timeout=300).unwrap()
    assert per_rank == [{"read": True, "write": True}] * w, f"seed {seed}: {per_rank}"


@pytest.mark.parametrize(
    "src,dst,kwargs,match",
    [
        (torch.zeros(8), torch.zeros(8, dtype=torch.float64), {}, "dst: 8 x torch.float64 does not match"),
        (torch.zeros(8), torch.zeros(9), {}, "does not match src"),
        (torch.zeros(8, 2).t(), torch.zeros(16), {}, "src: must be contiguous"),
        (torch.zeros(9)[1:], torch.zeros(8), {}, "src: must be 16-byte aligned"),
        (torch.zeros(8), torch.zeros(8), {"vectors": 3}, "launch: vectors 3"),
        (torch.zeros(8), [0.0] * 8, {}, "dst: expected a torch.Tensor"),
    ],
)
def test_link_copy_refuses_bad_input(src, dst, kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        links.link_copy(src, dst, **kwargs)


def test_best_links_keeps_the_fastest_correct_launch():
    base = {
        "kind": "link",
        "impl": "sm_read",
        "direction": "both",
        "bytes": 1 << 28,
        "world_size": 2,
        "num_warps": 16,
        "programs": 132,
        "us": 1.0,
    }
    recs = [
        dict(base, vectors=1, GBps=300.0, correct=True),
        dict(base, vectors=4, GBps=500.0, correct=False),
        dict(base, vectors=2, GBps=330.0, correct=True),
        dict(base, impl="memcpy_write", vectors=None, GBps=390.0, correct=True),
    ]
    rows = links.best_links(recs)
    assert [(r["impl"], r["GBps"]) for r in rows] == [("memcpy_write", 390.0), ("sm_read", 330.0)]
    table = links.links_markdown(recs)
    assert "| sm_read | 330 |" in table and "cudaMemcpyAsync" in table and "500" not in table


def test_the_probe_says_it_needs_gpus():
    import types

    with pytest.raises(ValueError, match="needs GPUs"):
        links.probe(types.SimpleNamespace(device=torch.device("cpu"), world_size=2, rank=0))
