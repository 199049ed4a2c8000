"""Calling Triton's compiled launcher one level down: the C function under ``CompiledKernel.run``.

``CompiledKernel.run`` (Triton's launcher object) is a Python wrapper: per launch it sets up
scratch memory and profiler hooks, then calls a C function (``launcher.launch``) that packs the
arguments and calls ``cuLaunchKernelEx``. For a launch repeated with the same kernel, grid and
no hooks, what the wrapper hands that function is the same every time except the grid, the
stream and the kernel's arguments. ``record_launch`` watches one launch through the wrapper and
says whether the rest is constant; ``labkit.kernels.comm.plan.KernelLaunch`` then calls the C
function itself (``plan.DIRECT_LAUNCH``; environment ``LABKIT_DIRECT_LAUNCH=0`` turns it off).

1. Wrap ``launcher.launch`` for one call, launch through ``c.run`` as usual (the launch happens
   either way), and put the launcher's own function back.
2. The recorded call must start with the grid, the stream and the function handle we passed,
   and end with the kernel's arguments as we passed them: spread out (Triton 3.4 to 3.6) or as
   one tuple (later versions, which put signature tables before it).
3. Everything between must be a constant: None, a bool, a number or a string, the kernel's packed
   metadata, or an object the launcher holds. A value made per launch (scratch memory, a tensor)
   fails step 3, and the wrapper stays in the path, with the reason kept.

Why that is safe to repeat: by 2 and 3, a later call of the C function with the same constants
and new grid, stream and arguments is the call the wrapper would have made. What could change it
is checked on every launch by the caller: a profiler's hook registered later (``plan._hooks``)
sends the launch back through ``c.run``.
"""

from __future__ import annotations

_PLAIN = (type(None), bool, int, float, str, bytes)


def record_launch(c, grid3: tuple, stream: int, args: tuple):
    """Launch ``c`` (a ``CompiledKernel``) once through ``c.run`` with ``args`` (the kernel's
    arguments in order, pointers as addresses, no hooks), recording what its Python wrapper hands
    the C launch function. Returns ``(launch_fn, constants, splat)`` when a later launch can call
    ``launch_fn(*grid3, stream, c.function, *constants, *args)`` (``splat``) or
    ``launch_fn(*grid3, stream, c.function, *constants, args)`` (Triton versions that pass the
    arguments as one tuple) and do what the wrapper would; else a string saying why not.

    What counts as a constant: None, a bool, a number or a string, ``c.packed_metadata``, or an
    object the launcher itself holds (its signature tables). Anything else (scratch memory
    allocated for this launch, a tensor) is made per launch, so the wrapper stays in the path."""
    launcher = c.run
    # 1. wrap the launcher's C function for one launch, which happens either way
    original = getattr(launcher, "launch", None)
    if not callable(original):
        c.run(*grid3, stream, c.function, c.packed_metadata, None, None, None, *args)
        return f"{type(launcher).__name__} has no launch function to call"
    seen = []

    def recorder(*a, **kw):
        seen.append((a, kw))
        return original(*a, **kw)

    own = "launch" in vars(launcher) if hasattr(launcher, "__dict__") else False
    try:
        launcher.launch = recorder
    except AttributeError:
        c.run(*grid3, stream, c.function, c.packed_metadata, None, None, None, *args)
        return f"{type(launcher).__name__}.launch cannot be wrapped"
    try:
        c.run(*grid3, stream, c.function, c.packed_metadata, None, None, None, *args)
    finally:
        if own:
            launcher.launch = original
        else:
            del launcher.launch
    # 2. the grid, the stream and the function first, the kernel's arguments last, as given
    if len(seen) != 1:
        return f"the wrapper called its launch function {len(seen)} times"
    a, kw = seen[0]
    if kw:
        return f"the wrapper passes keyword arguments ({', '.join(sorted(kw))}) to its launch function"
    if len(a) < 5 or tuple(a[:3]) != tuple(grid3) or a[3] != stream or a[4] is not c.function:
        return "the wrapper's launch call does not start with the grid, the stream and the function"
    held = list(vars(launcher).values()) if hasattr(launcher, "__dict__") else []

    def constant(v) -> bool:
        return type(v) in _PLAIN or v is c.packed_metadata or any(v is h for h in held)

    n = len(args)
    if len(a) >= 5 + n and all(_same(x, y) for x, y in zip(a[len(a) - n :], args)):
        middle, splat = a[5 : len(a) - n], True
    elif isinstance(a[-1], tuple) and len(a[-1]) == n and all(_same(x, y) for x, y in zip(a[-1], args)):
        middle, splat = a[5:-1], False
    else:
        return "the kernel's arguments are not passed through as given"
    # 3. everything between is a constant of the launcher
    odd = [type(v).__name__ for v in middle if not constant(v)]
    if odd:
        return f"the wrapper passes per-launch values ({', '.join(odd)}: scratch memory or hooks)"
    return original, tuple(middle), splat


def _same(x, y) -> bool:
    return x is y or (type(x) is type(y) and type(x) in _PLAIN and x == y)
