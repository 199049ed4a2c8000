"""The ranks' agreement on a plan: every rank checks that every other is making the same call, by
exchanging a ``fingerprint`` of what it will launch; ranks that differ all raise the same
UsageError, naming what differs and each rank's value.

* On GPUs (``agree``): once per buffer and fingerprint, when a plan is made, over the process
  group (``symm.agree``); ``plan.CollectivePlan``'s calls never exchange anything.
* In the emulated world (``agree`` when a plan is made, ``call_made`` when an eager call reuses
  a kept one): every call counts (``_calls``, the same number on every rank making the same calls)
  and posts its fingerprint in the process group's store; a call whose fingerprint differs from
  this rank's last call's also reads every peer's post of the same number and compares
  (``_exchange``). So a rank asking something new while its peers repeat their last call fails at
  once, naming what differs, instead of waiting in an exchange its peers never enter (and they,
  in the kernel, are killed by ``run_ranks`` as "aborted", naming its error). A peer that left
  (returned or failed) without making the call is a UsageError saying so. Calls through a held
  plan are not counted (making it is). Still waiting until the world's timeout: ranks that all
  repeat their last call while one rank skips it (their timeout lines name the call,
  ``ranks.note_call``). The posts stay in the store: some 60 bytes per call and rank.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from labkit.kernels.comm import symm
from labkit.kernels.comm.ranks import note_call
from labkit.workbench.errors import UsageError

if TYPE_CHECKING:  # plan imports this module
    from labkit.kernels.comm.plan import CollectivePlan

#: what ``agree``'s error tells the caller
CONTRACT = (
    "every rank must make the same call, with the same buffer, out (in place or not), algorithm, "
    "blocks, variant, config and order; make the calls agree"
)


def fingerprint(p: CollectivePlan, arguments: dict) -> dict:
    """What ``p`` launches, as the ranks must agree on it: the buffer (allocation, shape, dtype),
    in place or not, the call's ``arguments`` as given (name -> value), and, derived (keys with a
    leading "="), the algorithm chosen and every kernel's grid and launch options. Addresses and
    the rank's own arguments (its rank, its pointers) are left out: they differ by design."""
    buf = p._buf()
    fields = {
        "buf": f"allocation #{buf.serial}, {tuple(p._x_shape)} {str(p.dtype).replace('torch.', '')}",
        "out": "buf.tensor (in place)" if p.in_place else "a separate tensor",
    }
    fields.update((k, repr(v)) for k, v in arguments.items())
    fields["=algorithm chosen"] = p.algorithm
    fields["=launch"] = "; ".join(
        f"{getattr(s.kernel, 'fn', s.kernel).__name__} grid {s.grid} {sorted(s.kwargs.items())}"
        if hasattr(s, "kernel")  # a plan.KernelLaunch (a plan.CopySteps has none)
        else "copies"  # how many: by rank (a peer's shard may be empty)
        for s in p.steps
    )
    return fields


def agree(p: CollectivePlan, arguments: dict) -> None:
    """Check, when a plan is made, that every rank is making the same one.

    On GPUs: the first time a buffer sees a ``fingerprint`` (its arguments as given and what they
    resolve to), the ranks exchange theirs (``symm.agree``: one small ``all_gather_object``,
    collective) and every rank raises the same UsageError naming what differs, with each rank's
    value. Remembered on the buffer once agreed, so a buffer's later plans of the same arguments
    (an eager call into another out, a held plan) exchange nothing, and calls through a plan never
    do: the per-call path is untouched. Why per fingerprint, not per plan: a plan cache misses on
    one rank and not another (an out at an address one rank has seen and the other has not), and
    only the ranks that miss would enter the exchange; the fingerprint leaves addresses out, so
    ranks making the same calls in the same order reach each new fingerprint together. Skipped
    during CUDA-graph capture (no collective may run there; every rank skips alike).

    In the emulated world: a call of the ranks' count (``_call``: the exchange when the fingerprint
    differs from this rank's last call's, else only the post).

    Not caught (each still waits until the world's timeout: ``run_ranks``' timeout, the process
    group's under torchrun): a rank that never calls (its peers repeating their last call wait in
    the kernel); on GPUs also a rank whose arguments are new to the buffer while its peers reuse
    arguments already agreed on it (only that rank enters the exchange)."""
    buf = p._buf()
    fields = fingerprint(p, arguments)
    key = (p.op, *fields.items())
    p._agreement = (key, fields)
    if buf.emulated:
        _call(p.op, key, fields)
        return
    if key in buf._agreed:
        return
    if p.device.type == "cuda":
        # under the plan's device: the capture check reads that device's current stream, and
        # NCCL's object collective runs on the current device (another may be current here)
        with torch.cuda.device(p.device):
            if torch.cuda.is_current_stream_capturing():
                return
            # once per plan here (a file write per call would cost a GPU call's time): honest, not current
            note_call(f"fn, after making a plan of {_doing(p.op, fields)}")
            symm.agree(p.op, fields, CONTRACT)
    else:
        symm.agree(p.op, fields, CONTRACT)
    buf._agreed.add(key)


def call_made(p: CollectivePlan) -> None:
    """An eager call launching ``p``, a plan kept on an emulated buffer (``plans.cached_call``):
    one call of the ranks' count, as ``agree``'s when the plan was made."""
    key, fields = p._agreement
    _call(p.op, key, fields)


#: this process's collective calls in the emulated world, and the fingerprint key of the last
_calls = 0
_last_key: tuple | None = None
#: exchanges made (``_exchange``), for tests
exchanges = 0
_PREFIX = "labkit/call"


def _doing(op: str, fields: dict) -> str:
    """What a rank is doing, for ``run_ranks``' timeout line: the op and its algorithm."""
    return f"{op} ({fields.get('=algorithm chosen', '?')})"


def _call(op: str, key: tuple, fields: dict) -> None:
    """One call in the emulated world: post its fingerprint's digest under its number (the
    fingerprint itself once per digest); exchange when it differs from this rank's last call's
    (module docstring). Posts stay in the store (a peer may read one long after: a held plan's
    making launches nothing that would hold this rank back): some 60 bytes a call."""
    global _calls, _last_key
    _calls += 1
    n = _calls
    note_call(f"{_doing(op, fields)}, call {n}")
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    posted = {"op": op, **fields}
    digest = hashlib.blake2b(repr(sorted(posted.items())).encode(), digest_size=16).hexdigest()
    if digest not in _posted:
        store.set(f"{_PREFIX}/fingerprint/{digest}", pickle.dumps(posted))
        _posted.add(digest)
    store.set(f"{_PREFIX}/{n}/{rank}", digest)
    if key == _last_key:
        return
    _last_key = None  # until the exchange has passed: a failed call is no call to repeat
    _exchange(op, posted, digest, store, n, world)
    _last_key = key


#: the digests this process has posted the fingerprint of
_posted: set = set()


def _exchange(op: str, mine: dict, digest: str, store, n: int, world: int) -> None:
    """Read every rank's post of call ``n`` (waiting for it, up to the store's timeout: the
    process group's) and raise the same UsageError as ``symm.agree`` when they differ."""
    global exchanges
    exchanges += 1
    keys = [f"{_PREFIX}/{n}/{r}" for r in range(world)]
    try:
        store.wait(keys)
        digests = [store.get(k).decode() for k in keys]
        if all(d == digest for d in digests):
            return
        everyone = [pickle.loads(store.get(f"{_PREFIX}/fingerprint/{d}")) for d in digests]
    except RuntimeError as e:  # rank 0, which holds the store, left: it never made this call
        first = (str(e).strip().splitlines() or [""])[0]
        raise UsageError(
            f"{op}: call {n} of this rank: a peer left (returned or failed) without making it, while this "
            f"rank waited for its peers' call {n} ({type(e).__name__}: {first}); every rank must make the "
            "same calls in the same order"
        ) from None
    differ = [k for k in mine if any(o.get(k) != mine[k] for o in everyone)]
    differ += [k for o in everyone for k in o if k not in mine and k not in differ]
    given = [k for k in differ if not k.startswith("=")]
    listing = "; ".join(
        f"{k.lstrip('=')} ({', '.join(f'rank {r}: {o.get(k)}' for r, o in enumerate(everyone))})"
        for k in (given or differ)
    )
    raise UsageError(f"{op}: the ranks disagree on {listing}; {CONTRACT}")
