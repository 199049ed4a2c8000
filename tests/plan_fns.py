"""Rank functions for tests/kernels/comm/test_plan.py and tests/kernels/test_ops.py (every rank imports its function by
name, so they live in a module: see tests/rank_fns.py).

Each returns a dict of named outcomes, so that one start of the emulated world (a few seconds per
rank) checks many things; the tests read the dict."""

from __future__ import annotations

import gc

import torch


def _sync(ctx):
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def _inputs(ctx, n, dtype, seed):
    from labkit.labs.collectives import experiments

    return experiments.rank_inputs(ctx, n, dtype, seed)


def _close(y, xs, dtype, w):
    from labkit.labs.collectives import experiments

    return experiments.close_to_sum(y, xs, dtype, w)


def _close_step(y, xs, dtype, w):
    """``y`` = all_reduce(2 x) + 1 against its fp64 value. The + 1 is one more term of the sum, in
    the reference and in the tolerance's scale: subtracting it again from an fp32 result (the
    check this replaces) loses up to 2^-24 absolute where the ranks' inputs are small, more than
    the relative tolerance allows there; on 2x H200 that failed the Inductor step (n = 16384),
    and in a host simulation 19 of 20 random inputs of that size fail it, a sum of exactly the
    right values."""
    return _close(y, [2 * v for v in xs] + [torch.ones_like(xs[0])], dtype, w + 1)


def _error(fn) -> str:
    try:
        fn()
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def plans_and_cache(ctx, n: int = 4096 + 24, dtype_name: str = "float32") -> dict:
    """Plans against fp64 sums, the plan cache of the eager calls, and stale plans refused."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import plan as P
    from labkit.kernels.comm import symm

    dtype = getattr(torch, dtype_name)
    w = ctx.world_size
    found = {}
    buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    out = torch.empty(n, dtype=dtype, device=ctx.device)

    # a plan with an out, called on new inputs each time
    p = C.all_reduce_plan(buf, out, algorithm="one_shot")
    found["repr"] = repr(p)
    found["launch_path"] = p.launch_path
    ok = []
    for seed in (1, 2):
        x, xs = _inputs(ctx, n, dtype, seed)
        buf.tensor.copy_(x)
        y = p()
        ok.append(y is out and _close(y, xs, dtype, w))
    found["plan with out"] = all(ok)
    found["launch_path after"] = p.launch_path

    # out=None: a new tensor per call; two-shot in place
    x, xs = _inputs(ctx, n, dtype, 3)
    q = C.all_reduce_plan(buf, algorithm="two_shot")
    buf.tensor.copy_(x)
    y1 = q()
    buf.tensor.copy_(x)
    y2 = q()
    found["plan new outs"] = (
        y1 is not y2 and y1.data_ptr() != y2.data_ptr() and _close(y1, xs, dtype, w) and _close(y2, xs, dtype, w)
    )
    ip = C.all_reduce_plan(buf, buf.tensor)
    buf.tensor.copy_(x)
    y = ip()
    found["plan in place"] = (
        y is buf.tensor and ip.in_place and ip.algorithm == "two_shot" and _close(y.clone(), xs, dtype, w)
    )
    found["tree plan"] = C.all_reduce_plan(buf, algorithm="tree").algorithm == "tree"
    buf.tensor.copy_(x)
    found["tree plan sums"] = _close(C.all_reduce_plan(buf, algorithm="tree")(), xs, dtype, w)

    # reduce-scatter and all-gather plans
    s = n // w
    buf.tensor.copy_(x)
    rs = C.reduce_scatter_plan(buf)()
    found["reduce_scatter plan"] = _close(rs, [v[ctx.rank * s : (ctx.rank + 1) * s] for v in xs], dtype, w)
    g = symm.empty(s, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    g.tensor.copy_(x[:s])
    ag = C.all_gather_plan(g)()
    found["all_gather plan"] = bool(torch.equal(ag.cpu(), torch.cat([v[:s] for v in xs])))

    # the eager calls keep plans on the buffer: one per (op, out, algorithm, blocks, variant, config)
    buf._plans.clear()
    buf.tensor.copy_(x)
    a = C.all_reduce(buf, algorithm="one_shot")
    first = dict(buf._plans)
    buf.tensor.copy_(x)
    b = C.all_reduce(buf, algorithm="one_shot")
    found["cached sums"] = _close(a, xs, dtype, w) and _close(b, xs, dtype, w) and a is not b
    found["cached plan reused"] = len(buf._plans) == 1 and all(buf._plans[k] is v for k, v in first.items())
    buf.tensor.copy_(x)
    C.all_reduce(buf, out, algorithm="one_shot")  # another out: another plan
    buf.tensor.copy_(x)
    C.all_reduce(buf, algorithm="two_shot")  # another algorithm: another plan
    buf.tensor.copy_(x)
    C.all_reduce(buf, buf.tensor)  # in place
    found["cached plans"] = len(buf._plans)
    found["cached plans hold the buffer weakly"] = all(v.buf is None and v.out is None for v in buf._plans.values())
    # a different out at another address, same shape: its own plan, the right answer
    other = torch.empty(n, dtype=dtype, device=ctx.device)
    buf.tensor.copy_(x)
    y = C.all_reduce(buf, other, algorithm="one_shot")
    found["another out"] = y is other and _close(other, xs, dtype, w) and len(buf._plans) == 5
    # many outs: the cache stays bounded, the answers right
    outs = [torch.empty(n, dtype=dtype, device=ctx.device) for _ in range(P.MAX_PLANS + 3)]
    good = True
    for o in outs:
        buf.tensor.copy_(x)
        good &= _close(C.all_reduce(buf, o, algorithm="one_shot"), xs, dtype, w)
    found["bounded cache"] = good and len(buf._plans) == P.MAX_PLANS
    # reduce-scatter / all-gather go through the cache too
    buf.tensor.copy_(x)
    C.reduce_scatter(buf)
    g.tensor.copy_(x[:s])
    C.all_gather(g)
    found["shard ops cached"] = any(k[0] == "reduce_scatter" for k in buf._plans) and any(
        k[0] == "all_gather" for k in g._plans
    )
    # a buffer of another size or dtype is another buffer: its own plans
    b2 = symm.empty(2 * n, torch.bfloat16, device=ctx.device, scratch_dir=ctx.scratch_dir)
    x2, xs2 = _inputs(ctx, 2 * n, torch.bfloat16, 4)
    b2.tensor.copy_(x2)
    found["other buffer"] = (
        _close(C.all_reduce(b2, algorithm="one_shot"), xs2, torch.bfloat16, w) and len(b2._plans) == 1
    )
    # bad arguments still reach the checks that name them (unhashable, wrong types)
    found["unhashable config"] = _error(lambda: C.all_reduce(buf, config={"vectors": 2}))
    found["out not a tensor"] = _error(lambda: C.all_reduce(buf, [1.0]))

    # the cache switched off: the same sums, nothing kept
    P.CACHE_PLANS = False
    try:
        before = len(buf._plans)
        buf.tensor.copy_(x)
        found["cache off"] = _close(C.all_reduce(buf, algorithm="tree"), xs, dtype, w) and len(buf._plans) == before
    finally:
        P.CACHE_PLANS = True

    # stale plans: an out that moved, a buffer whose tensor moved, a freed buffer
    _sync(ctx)
    ctx.barrier()
    moved = torch.empty(n, dtype=dtype, device=ctx.device)
    p_out = torch.empty(n, dtype=dtype, device=ctx.device)
    pp = C.all_reduce_plan(buf, p_out, algorithm="one_shot")
    p_out.set_(moved)  # same tensor object, other memory
    found["plan out moved"] = _error(pp)
    held = buf.tensor
    buf.tensor = torch.empty_like(held)  # re-assigned: not the symmetric allocation any more
    found["plan buffer re-assigned"] = _error(p)
    found["eager on re-assigned buffer"] = _error(lambda: C.all_reduce(buf, algorithm="one_shot"))
    buf.tensor = held
    held.set_(torch.empty(n, dtype=dtype, device=ctx.device))  # the same tensor moved to other memory
    found["plan buffer moved"] = _error(p)
    found["eager on moved buffer"] = _error(lambda: C.all_reduce(buf, algorithm="one_shot"))
    # a cached plan lives on its buffer and holds it weakly: once the buffer is gone, it refuses
    b3 = symm.empty(64, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    C.all_reduce(b3, algorithm="one_shot")
    (cached,) = b3._plans.values()
    # a standalone plan keeps its buffer alive
    b4 = symm.empty(64, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    keeper = C.all_reduce_plan(b4, algorithm="one_shot")
    del b3, b4
    gc.collect()
    found["cached plan after free"] = _error(cached)
    found["standalone plan keeps its buffer"] = keeper.stale() is None
    keeper()  # every rank launches it once more: a collective
    _sync(ctx)
    ctx.barrier()
    return found


def host_cost(ctx, n: int = 1024, reps: int = 20, launch_reps: int = 3) -> list[dict]:
    """``labkit.labs.collectives.host_cost.measure`` on every rank."""
    from labkit.labs.collectives import host_cost

    return host_cost.measure(ctx, n=n, reps=reps, launch_reps=launch_reps)


def ops_in_the_world(ctx, n: int = 2 * 1024) -> dict:
    """torch.ops.labkit's collectives on every rank: against fp64 sums, the fake implementations'
    shapes, opcheck, and torch.compile(fullgraph=True) over them (backend "aot_eager")."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import labkit.kernels.ops  # noqa: F401  (registers torch.ops.labkit)
    from labkit.kernels.comm import symm

    w = ctx.world_size
    found = {}
    dtype = torch.float32
    buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    name = symm.register(buf, "ops_test")
    found["lookup"] = symm.lookup(name) is buf
    x, xs = _inputs(ctx, n, dtype, 11)
    s = n // w
    found["all_reduce"] = _close(torch.ops.labkit.all_reduce(x, name), xs, dtype, w)
    found["all_reduce one_shot"] = _close(torch.ops.labkit.all_reduce(x, name, "one_shot"), xs, dtype, w)
    buf.tensor.copy_(x)
    found["all_reduce from the buffer itself"] = _close(torch.ops.labkit.all_reduce(buf.tensor, name), xs, dtype, w)
    found["reduce_scatter"] = _close(
        torch.ops.labkit.reduce_scatter(x, name), [v[ctx.rank * s : (ctx.rank + 1) * s] for v in xs], dtype, w
    )
    g = symm.empty(s, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    gname = symm.register(g)
    found["default name"] = gname.startswith("labkit_symm_")
    found["all_gather"] = bool(
        torch.equal(torch.ops.labkit.all_gather(x[:s].contiguous(), gname).cpu(), torch.cat([v[:s] for v in xs]))
    )
    mode = FakeTensorMode()
    fx, fg = mode.from_tensor(x), mode.from_tensor(x[:s].contiguous())
    with mode:
        shapes = {
            "all_reduce": torch.ops.labkit.all_reduce(fx, name),
            "reduce_scatter": torch.ops.labkit.reduce_scatter(fx, name),
            "all_gather": torch.ops.labkit.all_gather(fg, gname),
        }
    found["fake"] = {k: (tuple(v.shape), str(v.dtype)) for k, v in shapes.items()}
    found["wrong shape"] = _error(lambda: torch.ops.labkit.all_reduce(x[:-1].contiguous(), name))
    found["unknown handle"] = _error(lambda: torch.ops.labkit.all_reduce(x, "nobody"))
    # opcheck calls the op several times, the same number on every rank: collectives pair up
    try:
        found["opcheck"] = torch.library.opcheck(torch.ops.labkit.all_reduce.default, (x, name, "one_shot"))
    except Exception as e:  # reported, not raised: the test says what failed
        found["opcheck"] = f"{type(e).__name__}: {e}"

    def step(t):
        return torch.ops.labkit.all_reduce(t * 2, name, "one_shot") + 1

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    found["compiled"] = _close_step(compiled(x), xs, dtype, w)
    symm.unregister(name)
    symm.unregister(gname)
    found["unregistered"] = _error(lambda: symm.lookup(name))
    _sync(ctx)
    ctx.barrier()
    return found


def fast_path_on_gpu(ctx, n: int = (1 << 16) + 8) -> dict:
    """GPU tier: plans launch through Triton's compiled launcher and stay right on new inputs, on
    a side stream, with another device current, under CUDA-graph capture, and with the fast path
    switched off."""
    from labkit.check.graphs import replay_with_fresh_inputs
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import plan as P
    from labkit.kernels.comm import symm

    dtype = torch.bfloat16
    w = ctx.world_size
    dev = ctx.device
    found = {"status": P.fast_launch_status()}
    buf = symm.empty(n, dtype, device=dev, scratch_dir=ctx.scratch_dir)
    out = torch.empty(n, dtype=dtype, device=dev)

    def fresh(seed):
        x, xs = _inputs(ctx, n, dtype, seed)
        buf.tensor.copy_(x)
        return xs

    p = C.all_reduce_plan(buf, out, algorithm="one_shot")
    ok = []
    for seed in range(3):
        xs = fresh(seed)
        ok.append(_close(p(), xs, dtype, w))
    found["plan sums"] = all(ok)
    found["launch_path"] = p.launch_path
    for alg in ("two_shot", "tree"):
        q = C.all_reduce_plan(buf, algorithm=alg)
        fresh(10)
        q()
        xs = fresh(11)
        found[alg] = _close(q(), xs, dtype, w) and q.launch_path.startswith("compiled launcher")
    ip = C.all_reduce_plan(buf, buf.tensor)
    fresh(12)
    ip()
    xs = fresh(13)
    found["in place"] = _close(ip().clone(), xs, dtype, w) and ip.launch_path.startswith("compiled launcher")

    # a side stream: the plan launches on the current stream, which is s, not the default one
    # (the default stream sleeps first: a launch there would start after the clone on s read out)
    xs = fresh(14)
    out.zero_()
    _sync(ctx)
    ctx.barrier()
    s = torch.cuda.Stream(dev)
    torch.cuda._sleep(int(2e8))
    with torch.cuda.stream(s):
        p()
        seen = out.clone()
    s.synchronize()
    found["side stream"] = _close(seen, xs, dtype, w)
    _sync(ctx)
    ctx.barrier()

    # another device current: the plan enters the buffer's
    others = [i for i in range(torch.cuda.device_count()) if i != dev.index]
    if others:
        xs = fresh(15)
        torch.cuda.set_device(others[0])
        try:
            y = p()
        finally:
            torch.cuda.set_device(dev)
        found["other device current"] = _close(y, xs, dtype, w)

    # CUDA-graph capture of a plan, replayed on new inputs
    replayed = replay_with_fresh_inputs(
        p, lambda step: fresh(16 + step), lambda step, _, xs: not _close(out, xs, dtype, w), replays=2, warmup=1
    )
    found["graph replay"] = replayed.ok

    # the eager calls' cached plans go fast too
    buf._plans.clear()
    for seed in (18, 19):
        xs = fresh(seed)
        y = C.all_reduce(buf, algorithm="one_shot")
    found["cached fast"] = _close(y, xs, dtype, w) and [
        v.launch_path.startswith("compiled launcher") for v in buf._plans.values()
    ] == [True]

    # switched off: Triton's normal path, the same sums
    P.FAST_LAUNCH = False
    try:
        q = C.all_reduce_plan(buf, algorithm="one_shot")
        fresh(20)
        q()
        xs = fresh(21)
        found["switched off"] = _close(q(), xs, dtype, w) and q.launch_path.startswith("triton (switched off")
    finally:
        P.FAST_LAUNCH = True
    _sync(ctx)
    ctx.barrier()
    return found


def ops_under_graphs_on_gpu(ctx, n: int = 1 << 14) -> dict:
    """GPU tier: torch.ops.labkit.all_reduce captured in a CUDA graph and under
    torch.compile(fullgraph=True) with Inductor."""
    import labkit.kernels.ops  # noqa: F401
    from labkit.check.graphs import replay_with_fresh_inputs
    from labkit.kernels.comm import symm

    dtype = torch.float32
    w = ctx.world_size
    dev = ctx.device
    buf = symm.empty(n, dtype, device=dev, scratch_dir=ctx.scratch_dir)
    name = symm.register(buf, "graph_test")
    x = torch.empty(n, dtype=dtype, device=dev)
    found = {}

    def refill(step):
        v, xs = _inputs(ctx, n, dtype, 1 + step)
        x.copy_(v)
        return xs

    replayed = replay_with_fresh_inputs(
        lambda: torch.ops.labkit.all_reduce(x, name, "one_shot"),
        refill,
        lambda step, y, xs: not _close(y, xs, dtype, w),
        replays=2,
        warmup=1,
    )
    found["graph"] = replayed.ok

    def step(t):
        return torch.ops.labkit.all_reduce(t * 2, name, "one_shot") + 1

    compiled = torch.compile(step, fullgraph=True)  # Inductor
    v, xs = _inputs(ctx, n, dtype, 3)
    found["inductor"] = _close_step(compiled(v), xs, dtype, w)
    symm.unregister(name)
    _sync(ctx)
    ctx.barrier()
    return found


def choices_agree(ctx) -> dict:
    """For each case: the algorithm and launches of a held plan (``all_reduce_plan``), of the plan
    ``all_reduce`` keeps on the buffer, of the call without a plan (``host_cost.eager_uncached``'s
    checks and choices), of what ``Graphed`` would capture (``collectives.graph_target``), and the
    chooser's own answer; whether the eager call summed right. Run on W=3 (a crossover that is not
    "always one-shot") with the copy engines' threshold lowered for the in-place case."""
    import dataclasses

    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import plan as P
    from labkit.kernels.comm import symm, tables

    w = ctx.world_size
    dtype = torch.float32
    found = {}
    small, large = 1024, (C.DEFAULT_CROSSOVER_ABOVE_2 // 4) + 4 * w  # fp32: just above 256 KiB
    cases = [
        ("small out", small, "out", {}, False),
        ("large out", large, "out", {}, False),
        ("small new", small, "new", {}, False),
        ("small in place", small, "in_place", {}, False),
        ("in place ce", small, "in_place", {}, True),
        (
            "explicit launch",
            small,
            "out",
            {"algorithm": "two_shot", "blocks": 3, "config": C.LaunchConfig(num_warps=4)},
            False,
        ),
    ]
    table_key = (tables.gpu_name(ctx.device), w)
    saved = tables.TABLES.get(table_key)
    # in place with a workspace: two_shot_ce at every size
    tables.TABLES[table_key] = dataclasses.replace(tables.table_for(*table_key), ce_from=0)
    try:
        for label, n, where, kwargs, workspace in cases:
            buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir, workspace=workspace)
            target = {
                "out": lambda n=n: torch.empty(n, dtype=dtype, device=ctx.device),
                "new": lambda: None,
                "in_place": lambda buf=buf: buf.tensor,
            }[where]()
            held = C.all_reduce_plan(buf, target, **kwargs)
            x, xs = _inputs(ctx, n, dtype, 30 + len(found))
            buf.tensor.copy_(x)
            y = C.all_reduce(buf, target, **kwargs)
            sums = _close(y.clone(), xs, dtype, w)
            cached = buf._plans[C.plan_key("all_reduce", target, **kwargs)]
            checked = C.check_all_reduce(buf, target, kwargs.get("algorithm", "auto"))
            in_place = checked.in_place
            choice = C.choose_all_reduce(checked.buf, in_place, **kwargs)
            alg = choice.algorithm
            uncached = P.CollectivePlan(
                "all_reduce",
                checked.buf,
                choice.steps,
                algorithm=alg,
                in_place=in_place,
                out_shape=tuple(checked.buf.tensor.shape),
            )
            _, graphed = C.graph_target(C.all_reduce, buf, target, **kwargs)
            nbytes = n * dtype.itemsize
            chooser = kwargs.get("algorithm") or (
                C.choose_in_place(nbytes, w, workspace) if in_place else C.choose(nbytes, w)
            )
            found[label] = {
                "held": held.algorithm,
                "cached": cached.algorithm,
                "uncached": alg,
                "graphed": graphed.algorithm,
                "chooser": chooser,
                "sums": sums,
                "same launches": held.describe() == cached.describe() == uncached.describe() == graphed.describe(),
                "kernels": [d.get("kernel", "copies") for d in held.describe()],
                "tables": {held.chooser_table, cached.chooser_table, graphed.chooser_table},
            }
        # reduce-scatter and all-gather: Graphed's plan is the cached one's
        n = 64 * w
        buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
        C.reduce_scatter(buf)
        (rs,) = [p for k, p in buf._plans.items() if k[0] == "reduce_scatter"]
        found["reduce_scatter same launches"] = C.graph_target(C.reduce_scatter, buf)[1].describe() == rs.describe()
        C.all_gather(buf)
        (ag,) = [p for k, p in buf._plans.items() if k[0] == "all_gather"]
        found["all_gather same launches"] = C.graph_target(C.all_gather, buf)[1].describe() == ag.describe()
        found["graph_target of a plan"] = C.graph_target(ag)[1] is ag
        found["graph_target, bad argument"] = _error(lambda: C.graph_target(C.all_reduce, buf, bogus=1))
        found["graph_target, other callable"] = C.graph_target(len, [1, 2])[0]() == 2
    finally:
        if saved is None:
            del tables.TABLES[table_key]
        else:
            tables.TABLES[table_key] = saved
    _sync(ctx)
    ctx.barrier()
    return found


def eager_series_in_the_world(ctx, n: int = 1024, stand_in: bool = True) -> list[dict]:
    """``labkit.labs.collectives.eager_bench.eager_series`` on the emulated world: every labkit path, in
    place and out of place; torch's symm_mem ops need GPUs, so a stand-in "torch" op (labkit's
    one-shot on a buffer of its own) exercises the paired ratios."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import symm
    from labkit.labs.collectives import eager_bench

    dtype = torch.float32
    w = ctx.world_size
    buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
    out = torch.empty(n, dtype=dtype, device=ctx.device)
    x, xs = _inputs(ctx, n, dtype, 40)
    close = lambda y: _close(y, xs, dtype, w)  # noqa: E731
    ops = {}
    if stand_in:
        other = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir)
        ops["torch_stand_in"] = (
            {"impl": "torch_stand_in", "in_place": False, "algorithm": "one_shot"},
            lambda: C.all_reduce(other, algorithm="one_shot"),
            lambda: (other.tensor.copy_(x), close(C.all_reduce(other, algorithm="one_shot")))[-1],
        )
    records = eager_bench.eager_series(ctx, buf, out, x, close, ops, iters=1, reps=3, warmup=1, dtype_name="float32")
    _sync(ctx)
    ctx.barrier()
    return records


def graphed_on_gpu(ctx, n: int = (1 << 14) + 8) -> dict:
    """GPU tier: ``Graphed`` captures the plan of its call (the algorithm and launches of the eager
    call's own plan) and replays it right on new inputs; ``Graphed(plan)`` too."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import plan as P
    from labkit.kernels.comm import symm

    dtype = torch.bfloat16
    w = ctx.world_size
    buf = symm.empty(n, dtype, device=ctx.device, scratch_dir=ctx.scratch_dir, workspace=True)
    out = torch.empty(n, dtype=dtype, device=ctx.device)
    found = {}

    def fresh(seed):
        x, xs = _inputs(ctx, n, dtype, seed)
        buf.tensor.copy_(x)
        return xs

    cases = (
        ("all_reduce out", (out,), {}),
        ("all_reduce in place", (buf.tensor,), {}),
        ("all_reduce one_shot new", (), {"algorithm": "one_shot"}),
        ("all_reduce two_shot out", (out,), {"algorithm": "two_shot"}),
    )
    for label, args, kwargs in cases:
        fresh(50)
        g = C.Graphed(C.all_reduce, buf, *args, **kwargs)
        ok = []
        for seed in (51, 52):
            xs = fresh(seed)
            ok.append(_close(g().clone(), xs, dtype, w))
        fresh(53)
        C.all_reduce(buf, *args, **kwargs)  # the eager call: its plan, kept on the buffer
        key = (
            "all_reduce",
            P.out_key(args[0] if args else None),
            kwargs.get("algorithm", "auto"),
            None,
            "correct",
            None,
        )
        found[label] = {
            "replays sum": all(ok),
            "algorithm": g.plan.algorithm,
            "same as the eager call's": g.plan.describe() == buf._plans[key].describe(),
        }
    held = C.all_reduce_plan(buf, out, algorithm="two_shot")
    g = C.Graphed(held)
    ok = []
    for seed in (54, 55):
        xs = fresh(seed)
        ok.append(_close(g().clone(), xs, dtype, w))
    found["held plan"] = {
        "replays sum": all(ok),
        "algorithm": g.plan.algorithm,
        "same as the eager call's": g.plan is held,
    }
    _sync(ctx)
    ctx.barrier()
    return found


def graph_launch_on_gpu(ctx, n: int = 4096 + 8, calls: int = 60, dtype_name: str = "bfloat16") -> dict:
    """GPU tier: repeated eager calls into a fixed output replay their kernels from a CUDA graph
    (labkit.kernels.comm.graph_launch), checked against fp64 on fresh inputs every call, with a
    rotating late rank (its stream sleeps before the call, so its peers' kernels wait for it):
    ``all_reduce(buf, out)``, in place, flag-in-data through ``all_reduce`` and by itself, push.
    Then the cases that must launch the normal way: a user's capture of the eager call (replayed
    on fresh inputs), another device current, a plan into a new tensor per call."""
    from labkit.kernels.comm import collectives as C
    from labkit.kernels.comm import flag_in_data as fid
    from labkit.kernels.comm import push, symm

    dtype = getattr(torch, dtype_name)
    w, dev = ctx.world_size, ctx.device
    buf = symm.empty(n, dtype, device=dev, scratch_dir=ctx.scratch_dir)
    fid.attach(buf, scratch_dir=ctx.scratch_dir)
    fbox = fid.inbox(n, dtype, device=dev, scratch_dir=ctx.scratch_dir)
    pbox = push.inbox(n, dtype, device=dev, scratch_dir=ctx.scratch_dir)
    out = torch.empty(n, dtype=dtype, device=dev)
    x = torch.empty(n, dtype=dtype, device=dev)
    found = {}

    def series(name, call, into_buf: bool, seed0: int):
        wrong = []
        for step in range(calls):
            mine, xs = _inputs(ctx, n, dtype, seed0 + step)
            (buf.tensor if into_buf else x).copy_(mine)
            if step % w == ctx.rank and step % 3 == 0:
                torch.cuda._sleep(int(2e6))  # this rank late on its stream: the peers' kernels wait
            y = call()
            if not _close(y, xs, dtype, w):
                wrong.append(step)
        _sync(ctx)
        ctx.barrier()
        found[name] = wrong

    series("all_reduce out", lambda: C.all_reduce(buf, out), True, 100)
    series("all_reduce in place", lambda: C.all_reduce(buf, buf.tensor).clone(), True, 300)
    series("all_reduce flag_in_data", lambda: C.all_reduce(buf, out, algorithm="flag_in_data"), True, 500)
    series("fid.all_reduce", lambda: fid.all_reduce(x, fbox, out), False, 700)
    series("push.all_reduce", lambda: push.all_reduce(x, pbox, out), False, 900)
    found["plan paths"] = [p.launch_path for p in buf._plans.values()]
    found["inbox graphs"] = [launch.graph.graph is not None for box in (fbox, pbox) for launch in box.launches.values()]

    # a user's capture of the eager call whose plan replays a graph: the kernels are captured
    from labkit.check.graphs import replay_with_fresh_inputs

    def refill(step):
        mine, xs = _inputs(ctx, n, dtype, 1100 + step)
        buf.tensor.copy_(mine)
        return xs

    replayed = replay_with_fresh_inputs(
        lambda: C.all_reduce(buf, out),
        refill,
        lambda step, _, xs: not _close(out, xs, dtype, w),
        replays=20,
        warmup=0,
    )
    found["user capture"] = replayed.ok
    _sync(ctx)
    ctx.barrier()

    # another device current: the call enters the buffer's device and launches the normal way
    others = [i for i in range(torch.cuda.device_count()) if i != dev.index]
    if others:
        mine, xs = _inputs(ctx, n, dtype, 1300)
        buf.tensor.copy_(mine)
        _sync(ctx)
        torch.cuda.set_device(others[0])
        try:
            y = C.all_reduce(buf, out)
        finally:
            torch.cuda.set_device(dev)
        found["other device current"] = _close(y, xs, dtype, w)

    # a new output per call: never captured, and says why
    for step in range(4):
        mine, xs = _inputs(ctx, n, dtype, 1400 + step)
        buf.tensor.copy_(mine)
        y = C.all_reduce(buf)
    found["new out"] = _close(y, xs, dtype, w)
    key = next(k for k in buf._plans if k[1] == ())
    found["new out reason"] = buf._plans[key].graph_reason
    _sync(ctx)
    ctx.barrier()
    return found
