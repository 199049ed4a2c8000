"""Compile ``litmus_kernel`` for a GPU architecture without a GPU and list its memory
instructions: what each semantics and scope really becomes (``ld.acquire.gpu``, ``fence.sc.sys``,
...). The CPU tier's proof that the GPU-only variants emit what the model assumes.

Triton reads TRITON_INTERPRET when a kernel is defined, so call this in a process started with
TRITON_INTERPRET=0 (e.g. ``labkit.workbench.sandbox.run_isolated(..., env={"TRITON_INTERPRET": "0"})``).
"""

from __future__ import annotations

import re

from labkit.kernels.litmus import model, run
from labkit.kernels.litmus.catalogue import get_test

#: the instructions that matter to the memory model (the test's own, the records, the barrier)
MEMORY_OP = re.compile(r"\b(ld|st|atom|red|fence|membar)\.[\w.]+")
BLOCKED = re.compile(r"#ttg\.blocked<\{[^}]*\}>")


def compile_kernel(
    test: str, semantics: str, scope: str | None, placement: str = "cross_cta", arch: int = 90, delay: int = 0
):
    """``litmus_kernel`` compiled for sm_<arch> as ``run_litmus`` would launch it (lanes 128, or
    32 for same_cta). Needs TRITON_INTERPRET=0 in this process (see the module docstring)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from labkit.kernels.litmus import kernels

    if kernels.litmus_kernel.__class__.__name__ == "InterpretedFunction":
        raise RuntimeError(
            "the kernel was defined under TRITON_INTERPRET=1; call this in a process started with TRITON_INTERPRET=0"
        )
    t = get_test(test)
    model.check_variant(semantics, scope, placement)
    sem, ld, st, fence = run.ptx_for(semantics, scope)
    lanes = 32 if placement == "same_cta" else 128
    block = run._block(t, placement, lanes)
    constexprs = {
        "PROGRAM": run.program_of(t),
        "NREG": run.MAX_REGS,
        "SAME_CTA": placement == "same_cta",
        "LANES": lanes,
        "BLOCK": block,
        "SEM": sem,
        "LD_ASM": ld,
        "ST_ASM": st,
        "FENCE_ASM": fence,
        "DELAY": delay,
        "BARRIER": True,
        "SPIN": 1024,
        "STRESS_ITERS": 4,
        "STRESS_LINES": 8,
    }
    signature = {
        "loc_bases": "*i64",
        "loc_slots": "*i32",
        "loc_homes": "*i32",
        "out_ptr": "*i32",
        "jobs": "*i32",
        "sync_bases": "*i64",
        "scratch_ptr": "*i32",
        "n_instances": "i32",
        "n_test_programs": "i32",
        "expected": "i32",
    }
    signature.update({k: "constexpr" for k in constexprs})
    return triton.compile(
        ASTSource(fn=kernels.litmus_kernel, signature=signature, constexprs=constexprs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": max(1, block // 32)},
    )


def memory_ops(
    test: str, semantics: str, scope: str | None, placement: str = "cross_cta", arch: int = 90, delay: int = 0
) -> list[str]:
    """The distinct memory instructions (opcode with qualifiers) of the compiled kernel, sorted."""
    ptx = compile_kernel(test, semantics, scope, placement, arch, delay).asm["ptx"]
    return sorted({m.group(0) for m in MEMORY_OP.finditer(ptx) if not m.group(0).startswith("ld.param")})


def blocked_layouts(test: str, semantics: str, scope: str | None, placement: str = "same_cta") -> list[str]:
    """The register layouts Triton chose (TTGIR ``#ttg.blocked``). same_cta relies on one element
    per thread (``sizePerThread = [1]``) and consecutive 32-lane groups per warp: a role per warp."""
    ttgir = compile_kernel(test, semantics, scope, placement).asm["ttgir"]
    return sorted(set(BLOCKED.findall(ttgir)))


def memory_ops_table(variants) -> list[dict]:
    """``memory_ops`` and ``blocked_layouts`` for each (test, semantics, scope, placement): one
    child process for all."""
    return [{"variant": tuple(v), "ops": memory_ops(*v), "layouts": blocked_layouts(*v)} for v in variants]
