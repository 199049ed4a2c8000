"""Whether Triton's interpreter can run labkit's kernels here (the CPU tier's own health check),
and how labkit runs them (``fast_device_calls``).

Triton 3.4-3.6's interpreter turns a program id into a Python int with ``int()`` of a
one-element numpy array, which NumPy 2.4 made an error ("only 0-dimensional arrays can be
converted to Python scalars"; triton-lang/triton#9171, fixed upstream by #9172, in triton 3.9).
Every kernel with a grid-stride loop (``range(pid * BLOCK, n, nprog * BLOCK)``: the collectives'
one-shot, two-shot, tree, scatter/gather and push kernels) then fails under the interpreter; the
GPU machines' triton 3.6 with NumPy 2.5 do, when a GPU host runs an emulated world (the collective
checker's held rounds). ``fast_device_calls`` installs the upstream fix where it is missing: after
the interpreter patches ``tl.tensor`` for a launch, ``__index__`` squeezes the array first.

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

    fast_device_calls()  # with the index fix, where this Triton needs it
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


# --- a tensor as a Python int: triton-lang/triton#9171 -------------------------------------------


def _numpy_refuses_one_element_int() -> bool:
    """NumPy >= 2.4: ``int()`` of a one-element array that is not 0-d raises."""
    import numpy

    try:
        int(numpy.ones(1))
    except TypeError:
        return True
    return False


def _as_index(self) -> int:
    """``tl.tensor.__index__`` under the interpreter: the one element of its handle (squeezed to
    0-d first, as triton 3.9's interpreter does)."""
    return int(self.handle.data.squeeze())


def _index_fix(fn, scope) -> None:
    """After the interpreter patched ``tl.tensor`` for ``fn``: its ``__index__`` squeezes first.
    Set through the launch's patch scope, which undoes it with the rest (last set, first undone)."""
    for lang in (tl, tl.core):
        if any(value is lang for value in fn.__globals__.values()):
            scope.set_attr(lang.tensor, "__index__", _as_index)


# --- device-function calls without re-patching ---------------------------------------------------

_grid = {"starting": False, "langs": None}  # the running grid's patched language modules (ids)


class _NothingToRestore:
    def restore(self) -> None:
        pass


def _lang_ids(fn) -> frozenset:
    import inspect

    return frozenset(
        id(value) for value in fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core)
    )


@functools.cache
def fast_device_calls() -> bool:
    """Under the interpreter, a call of one ``@triton.jit`` function from another (a device
    function: labkit's barriers call ``send``, ``wait`` and ``pad_slot`` in loops) re-patches
    Triton's language modules first, as the launch did (``_patch_lang``: every builtin found
    with ``inspect.getmembers``), although the launch's patches are still in place and the
    call's own are never restored. In a 3-rank ``check_dtypes`` of lab 02 the re-patching took
    1.5 s of rank 0's 4.8 s under cProfile; skipping it took the call from 2.5 to 2.0 s (no
    profiler, triton 3.9). This skips a device function's re-patch when the running launch
    patched the same modules; anything else (a launch, a device function of a module the
    launch did not patch, a call outside a launch) goes through Triton as before. Installed once
    per process on the interpreter tier (importing ``labkit.kernels`` does); returns whether it
    is installed (False on the GPU tier, or where this Triton's interpreter is not built as
    expected: no ``GridExecutor.__call__`` or ``_patch_lang``).

    Where NumPy refuses ``int()`` of a one-element array and this Triton's patch scope can be
    added to (``_LangPatchScope.set_attr``: triton 3.6 and 3.9 have it), every patch of the
    language it lets through also gets ``_index_fix`` (module docstring); harmless where Triton
    has the fix. Without ``set_attr`` nothing is fixed, and ``problem()`` says so."""
    if not tier.interpreted():
        return False
    from triton.runtime import interpreter as ti

    grid_call = vars(getattr(ti, "GridExecutor", object)).get("__call__")
    patch_lang = getattr(ti, "_patch_lang", None)
    if grid_call is None or patch_lang is None or getattr(patch_lang, "__wrapped__", None) is not None:
        return False
    fix_index = _numpy_refuses_one_element_int() and hasattr(getattr(ti, "_LangPatchScope", None), "set_attr")

    def patch(fn):
        scope = patch_lang(fn)
        if fix_index:
            _index_fix(fn, scope)
        return scope

    @functools.wraps(patch_lang)
    def _patch_lang(fn):
        langs = _lang_ids(fn)
        if _grid["starting"]:  # the launch's own patch
            _grid["starting"], _grid["langs"] = False, langs
            return patch(fn)
        if _grid["langs"] is not None and langs <= _grid["langs"]:
            return _NothingToRestore()
        return patch(fn)

    @functools.wraps(grid_call)
    def _grid_call(self, *args, **kwargs):
        outer = dict(_grid)
        _grid["starting"], _grid["langs"] = True, None
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _grid.update(outer)

    ti._patch_lang = _patch_lang
    ti.GridExecutor.__call__ = _grid_call
    return True
