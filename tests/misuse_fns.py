"""Rank functions for tests/kernels/comm/test_collectives_misuse.py: the collectives' misuse, each tried on
every rank of an emulated world (every rank imports its function by name, so they live in a
module: see tests/rank_fns.py). Each returns a dict of named outcomes."""

from __future__ import annotations

import torch


def _error(fn, *args, **kwargs) -> str:
    """What ``fn(*args, **kwargs)`` raised (type and message), or "no error". Any exception: what a
    call that should have been refused raised instead is reported, not propagated."""
    try:
        fn(*args, **kwargs)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _sync(ctx):
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def plan_launch_other_outs(ctx, n: int = 4096) -> dict:
    """``plan.launch(out)`` with outs the plan was not made for, on every rank in the same order:
    each is refused, naming ``out``, and the memory around a too-small view is untouched."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import symm
    from labkit.labs.collectives import experiments

    dev, w = ctx.device, ctx.world_size
    buf = symm.empty(n, torch.float32, device=dev, scratch_dir=ctx.scratch_dir)
    x, xs = experiments.rank_inputs(ctx, n, torch.float32, 7)
    buf.tensor.copy_(x)
    out = torch.empty(n, device=dev)
    p = C.all_reduce_plan(buf, out, algorithm="one_shot")
    fresh = C.all_reduce_plan(buf, algorithm="one_shot")  # out=None: a new tensor per call
    in_place = C.all_reduce_plan(buf, buf.tensor)
    guard = torch.full((2 * n,), -7.0, device=dev)
    elsewhere = torch.device("meta") if dev.type == "cpu" else torch.device("cpu")
    found = {
        "smaller out": _error(lambda: p.launch(guard[:16])),
        "larger out": _error(lambda: p.launch(guard)),
        "same numel, other shape": _error(lambda: p.launch(guard[:n].view(64, n // 64))),
        "other dtype": _error(lambda: p.launch(torch.empty(n, dtype=torch.bfloat16, device=dev))),
        "non-contiguous out": _error(lambda: p.launch(guard[::2])),
        "other device": _error(lambda: p.launch(torch.empty(n, device=elsewhere))),
        "not a tensor": _error(lambda: p.launch([0.0] * n)),
        "out in a peer's buffer": _error(lambda: p.launch(buf.peers[(ctx.rank + 1) % w])),
        "new-tensor plan, smaller out": _error(lambda: fresh.launch(guard[:16])),
        "in-place plan, another out": _error(lambda: in_place.launch(out)),
    }
    found["guard untouched"] = bool((guard == -7.0).all())
    # a held plan's out re-strided in place (same address and shape): refused by the plan's call
    big = torch.full((2 * n,), -7.0, device=dev)
    held = C.all_reduce_plan(buf, big[:n], algorithm="one_shot")
    held.out.set_(big.untyped_storage(), 0, (n,), (2,))
    found["held plan, out re-strided"] = _error(held)
    found["re-strided guard untouched"] = bool((big[1::2] == -7.0).all())
    # what a plan was made for still launches, and an out of the same kind at another address too
    other = torch.empty(n, device=dev)
    found["own out"] = p.launch(out) is out and experiments.close_to_sum(out, xs, torch.float32, w)
    found["another good out"] = p.launch(other) is other and experiments.close_to_sum(other, xs, torch.float32, w)
    found["new tensor"] = experiments.close_to_sum(fresh.launch(), xs, torch.float32, w)
    found["eager, cached"] = all(
        experiments.close_to_sum(C.all_reduce(buf, out, algorithm="one_shot"), xs, torch.float32, w) for _ in range(2)
    )
    _sync(ctx)
    ctx.barrier()
    return found


def ranks_disagree(ctx, n: int = 4096) -> dict:
    """Calls whose arguments differ by rank, one after another on every rank: each must raise the
    same UsageError on every rank (the plan's agreement check) instead of hanging; after each, the
    same call on every rank still sums right. Every case takes buffers of its own, on which no
    rank has called anything yet: the check runs where a buffer meets a set of arguments for the
    first time on every rank (on GPUs a rank reusing arguments its buffer already agreed on skips
    it; see ``labkit.kernels.comm.agreement``). Also counts the exchanges: one per new set of
    arguments on a buffer (in the emulated world: per call that differs from the last), none per
    repeated call."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import symm
    from labkit.labs.collectives import experiments

    dev, r, w = ctx.device, ctx.rank, ctx.world_size

    def mk(size=n, dtype=torch.float32):
        return symm.empty(size, dtype, device=dev, scratch_dir=ctx.scratch_dir)

    def pair(second=None):
        """(this case's buffer, the one rank 1 takes instead: another allocation)"""
        first = mk()
        return first, (mk() if second is None else second())

    x, xs = experiments.rank_inputs(ctx, n, torch.float32, 5)
    cases = {
        "algorithm": lambda b: C.all_reduce(b, algorithm=("one_shot", "two_shot")[r % 2]),
        "blocks": lambda b: C.all_reduce(b, algorithm="one_shot", blocks=1 + r % 2),
        "config": lambda b: C.all_reduce(b, algorithm="one_shot", config=C.LaunchConfig(num_warps=4 << r % 2)),
        "variant": lambda b: C.all_reduce(b, algorithm="one_shot", variant=("correct", "relaxed")[r % 2]),
        "in place or not": lambda b: C.all_reduce(b, b.tensor if r == 0 else None, algorithm="two_shot"),
        "held plan, algorithm": lambda b: C.all_reduce_plan(b, algorithm=("tree", "one_shot")[r % 2]),
        "reduce_scatter blocks": lambda b: C.reduce_scatter(b, blocks=1 + r % 2),
        "all_gather order": lambda b: C.all_gather(b, order=("rotated", "naive")[r % 2]),
        "all_gather blocks": lambda b: C.all_gather_plan(b, blocks=1 + r % 2),
    }
    found = {}
    for name, call in cases.items():
        b = mk()
        found[name] = _error(call, b)
        b.tensor.copy_(x)
        found[name + ", then agreeing"] = experiments.close_to_sum(
            C.all_reduce(b, algorithm="one_shot"), xs, torch.float32, w
        )
    for name, other in (
        ("another buffer", None),
        ("another size", lambda: mk(n // 2)),
        ("another dtype", lambda: mk(n, torch.bfloat16)),
    ):
        bufs = pair(other)
        found[name] = _error(C.all_reduce, bufs[r % 2], algorithm="one_shot")
        bufs[0].tensor.copy_(x)
        found[name + ", then agreeing"] = experiments.close_to_sum(
            C.all_reduce(bufs[0], algorithm="one_shot"), xs, torch.float32, w
        )

    # out of place into a symmetric out: blocks, config and the out's size, each by rank
    from labkit.kernels.comm import into

    def ws():
        return symm.empty(n, torch.float32, device=dev, scratch_dir=ctx.scratch_dir, workspace=True)

    into_cases = {
        "into blocks": lambda b, o: into.all_reduce_into(b, o, blocks=1 + r % 2),
        "into config": lambda b, o: into.all_reduce_into(b, o, config=C.LaunchConfig(num_warps=4 << r % 2)),
    }
    for name, call in into_cases.items():
        b, o = ws(), mk()
        found[name] = _error(call, b, o)
        b.tensor.copy_(x)
        found[name + ", then agreeing"] = experiments.close_to_sum(into.all_reduce_into(b, o), xs, torch.float32, w)
    # another out of the same shape and dtype (one that differs in either fails the local checks
    # on one rank, which then never joins the exchange: its peer waits for the world's timeout)
    b, outs = ws(), (mk(), mk())
    found["into another out"] = _error(into.all_reduce_into, b, outs[r % 2])
    b.tensor.copy_(x)
    found["into another out, then agreeing"] = experiments.close_to_sum(
        into.all_reduce_into(b, outs[0]), xs, torch.float32, w
    )

    # the exchange runs once per new set of arguments on a buffer: not per call, nor per plan
    from labkit.kernels.comm import agreement

    gathered = []
    real = symm.gather
    symm.gather = lambda mine: gathered.append(mine) or real(mine)

    def exchanges():  # on GPUs through symm.gather, in the emulated world through the store
        return len(gathered) + agreement.exchanges

    try:
        fresh = mk()
        made = exchanges()  # the allocation's own check
        for _ in range(3):
            fresh.tensor.copy_(x)
            C.all_reduce(fresh, torch.empty(n, device=dev), algorithm="two_shot")  # a new out: a new plan
        p = C.all_reduce_plan(fresh, torch.empty(n, device=dev), algorithm="two_shot")
        for _ in range(3):
            p()
        found["exchanges, one set of arguments"] = exchanges() - made
        C.all_reduce(fresh, algorithm="one_shot")
        C.all_reduce(fresh, algorithm="one_shot")
        found["exchanges, a second set"] = exchanges() - made
    finally:
        symm.gather = real
    _sync(ctx)
    ctx.barrier()
    return found


def push_counts_differ(ctx, capacity: int = 256) -> dict:
    """``push.all_reduce`` after two good calls, with ``capacity`` elements on rank 0 and half as
    many on rank 1, then one more call with ``capacity`` elements on both: whether the
    disagreeing call's result is NaN everywhere, the disagreements the inbox counted, and the
    next call's result against the sum of the inputs (fresh random values on every rank)."""
    from labkit.kernels.comm import push

    dev, r, w = ctx.device, ctx.rank, ctx.world_size
    box = push.inbox(capacity, torch.float32, device=dev, scratch_dir=ctx.scratch_dir)
    for c in (1, 2):  # two good calls: rank r pushes 10 c (r + 1) everywhere
        push.all_reduce(torch.full((capacity,), 10.0 * c * (r + 1), device=dev), box)
    n = capacity if r == 0 else capacity // 2
    found = {"n": n}
    y = push.all_reduce(torch.full((n,), float(r + 1), device=dev), box)
    found["all NaN"] = bool(torch.isnan(y).all())
    xs = [
        torch.randn(capacity, generator=torch.Generator().manual_seed(7919 + q), dtype=torch.float64) for q in range(w)
    ]
    after = push.all_reduce(xs[r].float().to(dev), box)
    found["next call's error"] = float((after.double().cpu() - sum(xs)).abs().max())
    found["next call's scale"] = float(sum(v.abs() for v in xs).max())
    found["disagreements"] = box.disagreements()
    _sync(ctx)
    ctx.barrier()
    return found


def planted_scratch(ctx, n: int = 64) -> dict:
    """``symm.empty`` in a scratch folder where rank 0 has planted, under the names an allocation
    might take, symlinks to a file of its own (``victim.txt``) and non-zero "signal pads" (stale
    files of a crashed run): the allocations must work, touch neither, and leave no file behind.
    Also records the names the allocations created (``os.open`` watched) and tries an allocation
    whose random token is forced to one whose names are taken (a symlink planted there)."""
    import glob
    import os
    import re

    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import symm

    r = ctx.rank
    folder = os.path.join(ctx.scratch_dir, "planted")
    victim = os.path.join(ctx.scratch_dir, "victim.txt")
    if r == 0:
        os.mkdir(folder)
        with open(victim, "w") as f:
            f.write("precious")
        for seq in range(1, 6):  # the names of this process's first allocations, any scheme
            for rank in range(ctx.world_size):
                for prefix in ("symm", "labkit-symm-"):
                    os.symlink(victim, os.path.join(folder, f"{prefix}{seq}-data-rank{rank}"))
                    with open(os.path.join(folder, f"{prefix}{seq}-pad-rank{rank}"), "wb") as f:
                        f.write(b"\x01" * 4096)  # a pad with every slot signalled
    ctx.barrier()
    planted = {p: os.path.islink(p) or open(p, "rb").read() for p in sorted(glob.glob(os.path.join(folder, "*")))}

    created = []
    real_open = os.open

    def watching(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            created.append((os.path.basename(path), flags))
        return real_open(path, flags, *args, **kwargs)

    os.open = watching
    try:
        buf = symm.empty(n, torch.float32, device=ctx.device, scratch_dir=folder)
        again = symm.empty(n, torch.float32, device=ctx.device, scratch_dir=folder)
    finally:
        os.open = real_open
    buf.tensor.fill_(float(r + 1))
    found = {"sum": C.all_reduce(buf, algorithm="one_shot").unique().tolist()}
    _sync(ctx)
    ctx.barrier()
    found["victim"] = open(victim).read()
    found["planted untouched"] = planted == {
        p: os.path.islink(p) or open(p, "rb").read() for p in sorted(glob.glob(os.path.join(folder, "*")))
    }
    found["created"] = [name for name, _ in created]
    found["exclusive, no symlink followed"] = all(
        f & os.O_EXCL and f & getattr(os, "O_NOFOLLOW", 0) == getattr(os, "O_NOFOLLOW", 0) for _, f in created
    )
    found["tokens"] = sorted({m.group(1) for name, _ in created if (m := re.search(r"-([0-9a-f]{32})-", name))})
    # a token whose names are taken: every rank gets an error naming scratch_dir, nothing hangs
    ctx.barrier()  # every rank has looked at the folder
    if r == 0:
        for rank in range(ctx.world_size):
            os.symlink(victim, os.path.join(folder, f"labkit-symm-{'ab' * 16}-3-data-rank{rank}"))
    ctx.barrier()
    token_hex = symm.secrets.token_hex
    symm.secrets.token_hex = lambda nbytes=None: "ab" * 16
    try:
        found["names taken"] = _error(symm.empty, n, torch.float32, device=ctx.device, scratch_dir=folder)
    finally:
        symm.secrets.token_hex = token_hex
    found["victim after"] = open(victim).read()
    ctx.barrier()
    found["left behind"] = sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(folder, "*")) if p not in planted and "ab" * 16 not in p
    )
    del buf, again
    return found


def algo_mismatch_after_agreed(ctx, n: int = 4096) -> list:
    """Both ranks agree on ``algorithm="one_shot"`` once; then rank 0 repeats it (its kept plan)
    while rank 1 asks ``"two_shot"`` (reliability review, finding 15 b)."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import symm

    buf = symm.empty(n, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir)
    buf.tensor.fill_(1.0)
    C.all_reduce(buf, algorithm="one_shot")
    return C.all_reduce(buf, algorithm="one_shot" if ctx.rank == 0 else "two_shot").tolist()[:2]


def alternate_calls(ctx, n: int = 1024) -> list:
    """The same calls on every rank, alternating algorithms and buffers: every call whose
    fingerprint differs from the last exchanges (emulated world), and every sum is right."""
    from labkit.kernels.comm import agreement, symm
    from labkit.kernels.comm import collectives as C

    bufs = [symm.empty(n, torch.float32, device=ctx.device, scratch_dir=ctx.scratch_dir) for _ in range(2)]
    sums = []
    before = agreement.exchanges
    for i in range(4):
        b = bufs[i % 2]
        b.tensor.fill_(float(ctx.rank + 1))
        sums.append(C.all_reduce(b, algorithm=("one_shot", "two_shot")[i // 2 % 2])[0].item())
    return [sums, agreement.exchanges - before]
