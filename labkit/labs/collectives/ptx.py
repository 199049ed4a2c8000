"""Compile labkit's collective kernels for a GPU architecture without a GPU, and read the PTX:
which atomics (and with which memory-order qualifiers) and which vector loads the barrier and
the data movement really use. Lets the CPU tier check what the docstrings claim about the GPU
path (run it in a process with TRITON_INTERPRET=0, e.g. ``labkit.workbench.sandbox.run_isolated``)."""

from __future__ import annotations

SIGNATURES = {
    "one_shot": ("labkit.kernels.comm.one_shot", "one_shot_all_reduce_kernel", ("n", "rank")),
    "two_shot": ("labkit.kernels.comm.two_shot", "two_shot_all_reduce_kernel", ("n", "shard_blocks", "rank")),
    "two_shot_in_place": (
        "labkit.kernels.comm.two_shot",
        "two_shot_all_reduce_in_place_kernel",
        ("n", "shard_blocks", "rank"),
    ),
    "two_shot_ce": ("labkit.kernels.comm.two_shot", "two_shot_ce_kernel", ("n", "shard_units", "rank")),
    "reduce_scatter": ("labkit.kernels.comm.scatter_gather", "reduce_scatter_kernel", ("shard", "rank")),
    "all_gather": ("labkit.kernels.comm.scatter_gather", "all_gather_kernel", ("shard", "rank")),
    "tree": (
        "labkit.kernels.comm.tree",
        "tree_all_reduce_kernel",
        ("n", "half", "rank", "a_parent", "a_child0", "a_child1", "b_parent", "b_child0", "b_child1"),
    ),
}


def compile_collective(
    algorithm: str,
    world: int = 4,
    sem: int = 0,
    dtype: str = "bf16",
    arch: int = 90,
    delay: int = 0,
    rotate: bool = True,
):
    """One collective kernel compiled for sm_<arch> (``delay``: lab 06's DELAY constexpr, on rank 1;
    ``rotate``: the all-gather's ROTATE, False for its naive order)."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name, ints = SIGNATURES[algorithm]
    fn = getattr(importlib.import_module(module), name)
    constexprs = {"WORLD": world, "MAX_BLOCKS": 128, "BLOCK": 2048, "SEM": sem, "END_BARRIER": True}
    if algorithm == "tree":
        constexprs["GUARD_LEAF"] = True
    if algorithm == "two_shot_ce":
        constexprs["UNIT"] = 64
    signature = {"data_ptrs": "*i64", "pad_ptrs": "*i64"}
    if algorithm == "two_shot_ce":
        signature.update({"out_ptrs": "*i64", "x_ptr": f"*{dtype}", "received_ptr": f"*{dtype}"})
    else:
        signature["x_ptr" if algorithm.endswith("in_place") else "out_ptr"] = f"*{dtype}"
    signature.update({k: "i32" for k in ints})
    constexprs.update(DELAY=delay, SLOW_RANK=1 if delay else 0)  # every constexpr, defaults included
    if algorithm == "all_gather":
        constexprs["ROTATE"] = rotate
    elif not rotate:
        raise ValueError(f"rotate: only the all-gather has an order to choose, not {algorithm!r}")
    signature.update({k: "constexpr" for k in constexprs})
    return triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=GPUTarget("cuda", arch, 32)
    )


def ptx_summary(algorithm: str, world: int = 4, sem: int = 0, dtype: str = "bf16", arch: int = 90) -> dict:
    """The distinct atomic instructions and whether 16-byte vector loads and stores appear in the PTX."""
    ptx = compile_collective(algorithm, world, sem, dtype, arch).asm["ptx"]
    atomics = sorted(
        {
            line.split()[1] if line.strip().startswith("@") else line.split()[0]
            for line in (raw.strip() for raw in ptx.splitlines())
            if "atom." in line
        }
    )
    return {
        "algorithm": algorithm,
        "world": world,
        "sem": sem,
        "atomics": atomics,
        "vector_loads": any("ld.global.v4" in line for line in ptx.splitlines()),
        "vector_stores": any("st.global.v4" in line for line in ptx.splitlines()),
    }


def summarize_all(worlds=(2, 8), algorithms=None) -> list[dict]:
    """``ptx_summary`` for every kernel (or those named in ``algorithms``), world size in
    ``worlds`` and both memory orders."""
    for a in algorithms or ():
        if a not in SIGNATURES:
            raise ValueError(f"algorithms: {a!r} is not one of {list(SIGNATURES)}")
    return [ptx_summary(a, w, sem) for a in (algorithms or SIGNATURES) for w in worlds for sem in (0, 1)]


def push_memory_ops(world: int = 2, dtype: str = "bf16", counts: bool = True, arch: int = 90) -> dict:
    """The push one-shot (``labkit.kernels.comm.push``) compiled for sm_<arch> with its count
    headers (``counts``) or without: its distinct global memory instructions, in order of first
    appearance, and the PTX's length in lines."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from labkit.kernels.comm import push

    constexprs = dict(WORLD=world, MAX_BLOCKS=2 * 132, BLOCK=1024, SLOTS=2, DELAY=0, SLOW_RANK=0, COUNTS=counts)
    signature = {"x_ptr": f"*{dtype}", "inbox_ptrs": "*i64", "pad_ptrs": "*i64", "out_ptr": f"*{dtype}"}
    signature.update({k: "i32" for k in ("n", "cap", "rank")})
    signature.update({k: "constexpr" for k in constexprs})
    ptx = triton.compile(
        ASTSource(fn=push.push_one_shot_kernel, signature=signature, constexprs=constexprs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": 4},
    ).asm["ptx"]
    ops = re.findall(r"\b(?:atom|red|fence|membar|ld\.global|st\.global)[\w.]*", ptx)
    return {"world": world, "counts": counts, "ops": list(dict.fromkeys(ops)), "lines": len(ptx.splitlines())}


def all_gather_orders(world: int = 4, sem: int = 0, dtype: str = "bf16", arch: int = 90) -> dict[str, str]:
    """The all-gather's PTX in each order ("rotated", the default, and "naive": ``ROTATE=False``)."""
    return {
        order: compile_collective("all_gather", world, sem, dtype, arch, rotate=order == "rotated").asm["ptx"]
        for order in ("rotated", "naive")
    }
