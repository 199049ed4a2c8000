"""A small search for the seed's crash: the unguarded kernel on the wrong device, under settings
where its read of another GPU's memory could fault instead of running.

The device-confusion matrix found a refusal (peer access off) or a silent run (peer access on),
never the seed's ``illegal memory access``. Each configuration below launches the unguarded
add-one kernel on cuda:0 (the current device) with its tensors on cuda:1, in its own child
process with a timeout, and records what happened: ``illegal memory access``, ``wrong result``,
``correct``, ``other error`` (or ``hang``; ``skipped`` where the machine cannot run it). The
input is written and synchronised *before* the launch, so unlike the matrix there is no race on
the write: a wrong result here comes from the memory the kernel read, not from ordering.

Configurations (``CONFIGS``):

* peer access in one direction only, enabled with CuPy (PyTorch enables it only inside its own
  copies): cuda:0 may map cuda:1's memory but not the reverse, and the reverse;
* a block freed while the kernel, queued on cuda:0 behind a sleep, has not read it yet: reused
  by a new tensor on cuda:1 (the caching allocator knows only cuda:1's stream used the block), or
  released to CUDA with ``torch.cuda.empty_cache()``;
* ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: memory mapped with CUDA's virtual memory
  calls, where peer access is granted per mapping; with peer access from PyTorch's copies, and
  with peer access enabled outside PyTorch (CuPy).
"""

from __future__ import annotations

import dataclasses
import importlib.util

import torch

from labkit.labs.wrong_device import demos
from labkit.workbench import gates, sandbox

KIND = "crash search"
OUTCOMES = ("illegal memory access", "wrong result", "correct", "other error", "hang", "skipped")
_EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
_REVERSE_LINE = "labkit: peer access cuda:1 -> cuda:0 enabled: "
_RELEASED_LINE = "labkit: bytes of cuda:1 returned to CUDA by empty_cache: "
REUSED_VALUE = 7.0  # what the tensor that takes a freed block holds: the kernel would then write 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    peer: str  # "torch": copies both ways (as accelerate's hooks); "0->1" / "1->0": CuPy, one way
    free: str | None  # None, "reuse" or "release": what happens to x's block before the kernel reads it
    env: tuple = ()  # extra environment of the child, as (name, value) pairs
    what: str = ""

    @property
    def needs_cupy(self) -> bool:
        return self.peer != "torch"


CONFIGS = {
    "peer 0->1 only": Config(
        peer="0->1", free=None, what="cuda:0 may access cuda:1's memory; cuda:1 may not access cuda:0's"
    ),
    "peer 1->0 only": Config(
        peer="1->0", free=None, what="cuda:1 may access cuda:0's memory; the kernel's cuda:0 may not access cuda:1's"
    ),
    "freed and reused": Config(
        peer="torch",
        free="reuse",
        what="x freed while the queued kernel has not read it; a new tensor on cuda:1 takes its block",
    ),
    "freed and released": Config(
        peer="torch",
        free="release",
        what="x freed and returned to CUDA (empty_cache) before the queued kernel reads it",
    ),
    "expandable segments": Config(
        peer="torch",
        free=None,
        env=tuple(_EXPANDABLE.items()),
        what="expandable segments, peer access from PyTorch's copies",
    ),
    "expandable segments, peer via CuPy": Config(
        peer="0->1",
        free=None,
        env=tuple(_EXPANDABLE.items()),
        what="expandable segments, peer access 0->1 enabled outside PyTorch",
    ),
}


def _enable_peer(dev: int, peer: int) -> None:
    import cupy

    with cupy.cuda.Device(dev):
        cupy.cuda.runtime.deviceEnablePeerAccess(peer)


def run_config(name: str, nbytes: int = 64 << 20, delay_cycles: int = 200_000_000) -> dict:
    """One configuration; meant for a child process (``crash_search``). Needs 2 GPUs."""
    from labkit.labs.wrong_device.experiments import _PEER_LINE, add_one, copy_across_like_accelerate, peer_enabled

    if name not in CONFIGS:
        raise ValueError(f"name: {name!r} is not one of {tuple(CONFIGS)}")
    if torch.cuda.device_count() < 2:
        raise RuntimeError("run_config needs 2 CUDA GPUs")
    cfg = CONFIGS[name]
    torch.cuda.set_device(0)
    if cfg.peer == "torch":
        copy_across_like_accelerate()
    else:
        _enable_peer(*(int(d) for d in cfg.peer.split("->")))
    print(f"{_PEER_LINE}{peer_enabled(0, 1)}", flush=True)
    print(f"{_REVERSE_LINE}{peer_enabled(1, 0)}", flush=True)
    n = nbytes // 4
    x = torch.full((n,), 1.0, device="cuda:1")
    out = torch.empty_like(x)
    add_one(torch.zeros(n, device="cuda:0"))  # compile and load on cuda:0 outside the experiment
    for d in (0, 1):
        torch.cuda.synchronize(d)
    torch.cuda._sleep(delay_cycles)  # cuda:0's stream busy: the kernel below waits behind it
    add_one(x, out, guarded=False)  # queued on cuda:0's stream, reading and writing cuda:1
    keep, released = None, None
    if cfg.free is not None:
        del x  # back to cuda:1's cache at once: only cuda:1's stream used it
        if cfg.free == "reuse":
            keep = torch.full((n,), REUSED_VALUE, device="cuda:1")  # takes the block, written now
        else:
            before = torch.cuda.memory_reserved(1)
            torch.cuda.empty_cache()  # the block goes back to CUDA
            released = before - torch.cuda.memory_reserved(1)  # checked: did it really go back?
            print(f"{_RELEASED_LINE}{released}", flush=True)  # reaches the parent even if the read then faults
    for d in (0, 1):
        torch.cuda.synchronize(d)
    del keep
    return {
        "correct": bool(torch.all(out == 2.0).item()),
        "read_reused": float((out == REUSED_VALUE + 1).float().mean().item()),
        "released_bytes": released,
    }


def config_record(name: str, res: sandbox.SandboxResult) -> dict:
    """One record from a configuration's child result (pure: unit-tested with made-up results)."""
    from labkit.labs.wrong_device.experiments import _parse_line, _parse_peer_line, first_error

    cfg = CONFIGS[name]
    if res.status == "timeout":
        outcome = "hang"
    elif res.status == "illegal_memory_access":
        outcome = "illegal memory access"
    elif not res.ok:
        outcome = "other error"
    else:
        outcome = "correct" if res.value["correct"] else "wrong result"
    if res.ok:
        share = res.value.get("read_reused", 0.0)
        detail = (
            "x + 1, as it should be"
            if res.value["correct"]
            else (f"not x + 1; {share:.0%} of the output is the reused block's value + 1" if share else "not x + 1")
        )
    else:
        detail = res.summary()
    released = _parse_line(res.stdout, _RELEASED_LINE)
    released = int(released) if released and released.lstrip("-").isdigit() else None
    if released is not None:
        detail += f" (empty_cache returned {released / 2**20:.0f} MiB of cuda:1's memory to CUDA first)"
    first = first_error(res.traceback) if not res.ok else None
    reverse = {"True": True, "False": False}.get(_parse_line(res.stdout, _REVERSE_LINE))
    return demos.base_record(
        KIND,
        outcome,
        detail,
        config=name,
        guarded=False,
        what=cfg.what,
        peer_setup=cfg.peer,
        free=cfg.free,
        env=dict(cfg.env) or None,
        peer_enabled=_parse_peer_line(res.stdout),
        peer_1_to_0=reverse,
        first_error=first[0] if first else None,
        first_error_at=first[1] if first else None,
        released_bytes=released,
        seconds=res.seconds,
    )


def crash_search(configs=tuple(CONFIGS), nbytes: int = 64 << 20, timeout_s: float = 60.0) -> list[dict]:
    """Every configuration in its own child process; one record each (``skipped`` without 2 GPUs,
    or without CuPy for the configurations that enable peer access through it)."""
    for name in configs:
        if name not in CONFIGS:
            raise ValueError(f"configs: {name!r} is not one of {tuple(CONFIGS)}")
    gate = gates.requires(gpus=2, compiled=True)
    have_cupy = importlib.util.find_spec("cupy") is not None
    records = []
    for name in configs:
        cfg = CONFIGS[name]
        reason = (
            gate.reason
            if not gate.ok
            else ("needs CuPy to enable peer access in one direction" if cfg.needs_cupy and not have_cupy else None)
        )
        if reason:
            records.append(demos.skipped_record(KIND, reason, config=name, guarded=False, what=cfg.what))
            continue
        res = sandbox.run_isolated(run_config, name, nbytes, timeout=timeout_s, env=dict(cfg.env))
        records.append(config_record(name, res))
    return records


def seed_crash_verdict(records: list[dict]) -> str:
    """Whether any recorded run reproduced the seed's crash: an illegal memory access from the
    unguarded kernel (the search's configurations and the matrix's unguarded cells)."""
    from labkit.labs.wrong_device.experiments import PATTERNS

    search = [r for r in records if r.get("pattern") == KIND and r.get("outcome") != "skipped"]
    cells = [r for r in records if r.get("pattern") in PATTERNS and r.get("guarded") is False]
    if not search and not cells:
        return "none recorded yet"
    crashed = [
        r.get("config") or f"matrix cell {r['pattern']}, peer {'on' if r.get('peer_access') else 'off'}"
        for r in search + cells
        if r.get("outcome") == "illegal memory access"
    ]
    if crashed:
        return "reproduced: an illegal memory access in " + "; ".join(crashed)
    searched = (
        f"in {len(search)} search configuration(s) ({', '.join(sorted({r['outcome'] for r in search}))})"
        if search
        else ""
    )
    where = " nor ".join(w for w in (searched, f"in {len(cells)} unguarded matrix cell(s)" if cells else "") if w)
    return f"not reproduced: no illegal memory access {where}" + ("" if search else "; crash search: none recorded yet")


def describe(records: list[dict]) -> list[str]:
    recs = [r for r in records if r.get("pattern") == KIND]
    if not recs:
        return ["none recorded yet"]
    out = []
    for r in recs:
        peers = (
            f" [peer 0->1 {r.get('peer_enabled')}, 1->0 {r.get('peer_1_to_0')}]"
            if r.get("outcome") != "skipped"
            else ""
        )
        out.append(f"{r['config']:<36} {r['outcome']:<22} {r['detail']}{peers}")
        if r.get("first_error") and r["first_error"] not in r["detail"]:
            out.append(f"{'':<36} first error: {r['first_error']}")
    return out
