"""Whether Triton's interpreter can run labkit's kernels here: the CPU tier's own health check.

Triton 3.4-3.6's interpreter turns a program id into a Python int with ``int()`` of a
one-element numpy array, which NumPy 2.4 made an error ("only 0-dimensional arrays can be
converted to Python scalars"; triton-lang/triton#9171, fixed upstream by #9172, in triton 3.9
here). Every labkit kernel with a grid-stride loop (``range(pid * BLOCK, n, nprog * BLOCK)``:
the collectives' one-shot, two-shot, tree, scatter/gather and push kernels) then fails under the
interpreter. Checked on triton 3.6.0 with NumPy 2.4.6 on the CPU: the probe below raises that
TypeError; triton 3.9.0 runs it.

``problem()`` runs one tiny kernel looping so, once per process, on the interpreter tier only.
``labkit doctor`` prints its answer, and the test suite stops at once with it, rather than
failing hundreds of tests with the interpreter's traceback.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from labkit.workbench import tier


@triton.jit
def _grid_stride_probe(
    x_ptr,  # *fp32 [N]: incremented by one, every element once
    n,  # N
    BLOCK: tl.constexpr,  # elements per program per step
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for start in range(pid * BLOCK, n, nprog * BLOCK):  # the loop labkit's collectives use
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@functools.cache
def problem() -> str | None:
    """Why the interpreter cannot run labkit's kernels in this process, or None (also on the
    GPU tier, where kernels compile and the interpreter is not used)."""
    if not tier.interpreted():
        return None
    import numpy

    x = torch.zeros(100)
    try:
        _grid_stride_probe[(2,)](x, 100, BLOCK=16)
    except Exception as e:
        return (
            f"triton {triton.__version__}'s interpreter cannot run a grid-stride loop with numpy "
            f"{numpy.__version__} ({type(e).__name__}: {e}); the known cause is NumPy >= 2.4 with "
            f"triton <= 3.6 (triton-lang/triton#9171): pip install 'numpy<2.4', or a triton with the fix"
        )
    if not bool((x == 1).all()):
        return (
            f"triton {triton.__version__}'s interpreter ran a grid-stride loop wrong "
            f"({int((x != 1).sum())} of 100 elements)"
        )
    return None
