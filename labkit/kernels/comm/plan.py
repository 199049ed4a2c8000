"""Launch plans: a collective's checks, choices and compiled kernel resolved once per buffer, then
launched for a few microseconds of host work.

Called eagerly without a plan, a collective spends tens of microseconds on the host before its
kernel starts (``labkit.labs.collectives.host_cost`` measures each stage): the argument checks,
the device guard, choosing the algorithm and launch configuration, and Triton's Python launch
path (binding the arguments, computing the specialisation key, finding the compiled kernel). For
a buffer used again and again almost all of that gives the same answer every time. A plan
computes it once:

    plan = all_reduce_plan(buf, out)     # every rank: the same plan (same algorithm, grid, config)
    buf.tensor.copy_(x)                  # this rank's input, in stream order
    y = plan()                           # = all_reduce(buf, out), same barrier semantics

and ``collectives.all_reduce`` / ``reduce_scatter`` / ``all_gather`` keep plans of their own
on the buffer (``kept``, ``keep``), so a plain call gets most of the saving too.

What a plan fixes when it is made (the full checks of the eager call run then, and only then):
the buffer, the output's shape, dtype and device, in place or not, the algorithm, the launch
configuration, the grid and every kernel argument. Making a plan also checks that every rank is
making the same one (``agree``: on GPUs the first time a buffer sees a set of arguments, the
ranks exchange a fingerprint of what they will launch and all raise if it differs; calls never
do. In the emulated world every eager call posts its fingerprint and one that differs from the
rank's last call's is compared with its peers': ``agreement``).
What it checks on every call, because it can change behind the plan's back and would otherwise
give a wrong answer silently:

* the buffer still exists and ``buf.tensor`` is the same tensor at the same address with the same
  shape (a tensor re-assigned, ``set_`` to other memory, or whose storage was freed is refused);
* a plan made with an ``out`` tensor: that tensor still has the address and shape it had, and
  is contiguous;
* ``plan.launch(out)``, the launches into an out given per call: ``out`` has the plan's output
  shape, dtype and device and is contiguous (O(1) compares); one at another address than the out
  the plan was made for is also checked against every rank's symmetric buffer (the eager calls
  skip this: their cache key holds the out's address, shape, strides, dtype and device);
* the device: every launch enters the buffer's device (``workbench.guard.on_device``), whatever
  device is current;
* the stream is never fixed: each launch goes to the current stream of the buffer's device, as
  the eager call's does (so a plan is also what a CUDA graph captures).

A standalone plan keeps its buffer alive; a cached one holds it weakly (it lives on the buffer).

The launch itself: the first call goes through Triton's normal path (``kernel[grid](...)``),
which compiles if needed and returns the ``CompiledKernel``; later calls hand the bound
arguments straight to ``CompiledKernel.run``, Triton's compiled launcher, skipping the binder
and the cache lookup. That reaches into Triton internals (triton >= 3.4: ``triton.knobs`` and
the launcher taking every argument, constexprs included), so it is guarded: ``FAST_LAUNCH``
(environment ``LABKIT_FAST_LAUNCH=0`` turns it off) and ``fast_launch_status()`` say whether it
is used; under the interpreter (the CPU tier) there is no compiled launcher and every launch
takes the normal path.

One level further down, ``CompiledKernel.run`` is a Python wrapper (it sets up scratch memory
and profiler hooks, then calls the C function that launches). The second fast launch records
what the wrapper hands that C function (``labkit.kernels.comm.direct_launch``); where everything
but the grid, the stream and the kernel's arguments is a constant of the launcher (no scratch
memory, no hooks), later launches call the C function with the recorded constants themselves
(``DIRECT_LAUNCH``, environment ``LABKIT_DIRECT_LAUNCH=0`` turns it off). Arguments go to it as
addresses: the fixed tensors are held by the launch, so their addresses stay theirs.
"""

from __future__ import annotations

import os
import weakref

import torch
import triton

from labkit.kernels.comm.agreement import CONTRACT as CONTRACT
from labkit.kernels.comm.agreement import agree as agree
from labkit.kernels.comm.agreement import call_made as call_made
from labkit.kernels.comm.agreement import fingerprint as fingerprint
from labkit.kernels.comm.direct_launch import record_launch
from labkit.kernels.comm.graph_launch import GraphReplay
from labkit.kernels.launch_helpers import overlaps
from labkit.workbench import tier
from labkit.workbench.errors import UsageError
from labkit.workbench.guard import on_device

#: Launch through ``CompiledKernel.run`` after the first call (see ``fast_launch_status``).
FAST_LAUNCH = os.environ.get("LABKIT_FAST_LAUNCH", "1") != "0"
#: After the fast path is armed, call the compiled launcher's C function with its recorded
#: constants (``record_launch``), skipping ``CompiledKernel.run``'s Python wrapper.
DIRECT_LAUNCH = os.environ.get("LABKIT_DIRECT_LAUNCH", "1") != "0"
#: Let ``all_reduce`` / ``reduce_scatter`` / ``all_gather`` keep plans on their buffer.
CACHE_PLANS = os.environ.get("LABKIT_PLAN_CACHE", "1") != "0"
#: Plans kept per buffer (one per op, output, algorithm and launch); the oldest is dropped first.
MAX_PLANS = 16
#: The first Triton whose JIT path calls ``kernel.run(..., knobs.runtime.launch_enter_hook,
#: knobs.runtime.launch_exit_hook, *all_arguments)``, which the fast path repeats.
MIN_TRITON = (3, 4)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def fast_launch_status() -> tuple[bool, str]:
    """(whether plans launch through Triton's compiled launcher here, why or why not)."""
    if not FAST_LAUNCH:
        return False, "switched off (labkit.kernels.comm.plan.FAST_LAUNCH is False; LABKIT_FAST_LAUNCH=0)"
    if tier.interpreted():
        return False, "Triton interpreter: kernels run in Python, there is no compiled launcher"
    if _version(triton.__version__) < MIN_TRITON:
        return False, f"triton {triton.__version__} is older than 3.4, whose launcher API the fast path repeats"
    try:
        from triton import knobs

        knobs.runtime.launch_enter_hook  # noqa: B018 (exists?)
    except (ImportError, AttributeError):
        return False, f"triton {triton.__version__} has no triton.knobs.runtime launch hooks"
    return True, f"triton {triton.__version__}: CompiledKernel.run after the first launch"


class _Out:
    """Marks where a launch's output tensor goes among its arguments (given on every call)."""

    def __repr__(self):
        return "OUT"


OUT = _Out()


_runtime_knobs = None


def _hooks():
    """Triton's launch hooks (a profiler's), or (None, None) when none is registered: then the
    launcher skips them and nobody needs the launch metadata. Read on every launch: a profiler
    attached after the plan was made still sees its launches."""
    global _runtime_knobs
    if _runtime_knobs is None:
        from triton import knobs

        _runtime_knobs = knobs.runtime
    enter, leave = _runtime_knobs.launch_enter_hook, _runtime_knobs.launch_exit_hook
    if not getattr(enter, "calls", enter is not None) and not getattr(leave, "calls", leave is not None):
        return None, None  # None, or an empty HookChain (triton >= 3.5)
    return enter, leave


def _no_hooks() -> bool:
    """No Triton launch hook is registered (``_hooks``): a graph replay hides no launch from a profiler."""
    enter, leave = _hooks()
    return enter is None and leave is None


def _stream_getter():
    """Triton's own way to the current stream of a device (torch's raw current stream): the
    stream its JIT path would launch on."""
    from triton.runtime.driver import driver

    return driver.active.get_current_stream


class KernelLaunch:
    """One Triton launch with every argument resolved: ``kernel[grid](*args, **kwargs)``, the
    output (``OUT`` in ``args``) given per call.

    After the first launch, when ``fast_launch_status()`` allows it, ``CompiledKernel.run`` is
    called directly with the arguments Triton's JIT path would give it: the grid as three ints,
    the current stream of the device, the kernel's function handle and packed metadata, the launch
    metadata and hooks, then every parameter of the kernel in order (constexprs included: the
    launcher drops them). The compiled kernel was specialised on the first call's arguments
    (16-byte alignment of pointers, integers equal to 1 or divisible by 16); every argument but the
    output is fixed, and an output whose alignment differs goes through the normal path."""

    __slots__ = (
        "kernel",
        "grid",
        "args",
        "kwargs",
        "device",
        "out_pos",
        "compiled",
        "fallback_reason",
        "armable",
        "_full",
        "_full_out_pos",
        "_ints",
        "_direct",
        "_aligned",
        "_stream",
        "_grid3",
    )

    def __init__(self, kernel, grid: tuple, args: tuple, kwargs: dict, device: torch.device):
        self.kernel, self.grid, self.args, self.kwargs, self.device = kernel, tuple(grid), tuple(args), kwargs, device
        self.out_pos = next((i for i, a in enumerate(self.args) if a is OUT), -1)
        self.compiled = None  # the CompiledKernel, once the fast path is armed
        self.fallback_reason = "not launched yet"
        self.armable = True  # False: launched once and dropped, preparing a fast path would be waste

    def __call__(self, out: torch.Tensor | None) -> None:
        c = self.compiled
        if c is not None and (self.out_pos < 0 or (out.data_ptr() % 16 == 0) == self._aligned):
            if self._full_out_pos < 0:
                self.launch_addresses(self._ints)
                return
            args = list(self._ints)
            args[self._full_out_pos] = out.data_ptr()
            self.launch_addresses(args, ((self._full_out_pos, out),))
            return
        args = self.args if self.out_pos < 0 else self.args[: self.out_pos] + (out,) + self.args[self.out_pos + 1 :]
        compiled = self.kernel[self.grid](*args, **self.kwargs)
        if c is None:
            if self.armable:
                self._arm(compiled, args)
            else:
                self.fallback_reason = "a plan for one call (not cached)"

    def launch_addresses(self, args, tensors: tuple = ()) -> None:
        """The armed launch with every argument given, pointers as addresses (``args``: the
        kernel's parameters in order): straight to the C launch function where ``record_launch``
        allowed it, else through ``CompiledKernel.run``. With a profiler's hook registered,
        ``CompiledKernel.run`` with tensors and the launch metadata, as Triton's JIT path calls it
        (``tensors``: (position, tensor) pairs for the places a call fills in)."""
        c = self.compiled
        stream = self._stream(self.device.index)
        enter, leave = _hooks()
        if enter is not None:
            full = list(self._full)
            for i, t in tensors:
                full[i] = t
            meta = c.launch_metadata(self._grid3, stream, *full)
            c.run(*self._grid3, stream, c.function, c.packed_metadata, meta, enter, leave, *full)
            return
        direct = self._direct
        if type(direct) is tuple:
            fn, constants, splat = direct
            if splat:
                fn(*self._grid3, stream, c.function, *constants, *args)
            else:
                fn(*self._grid3, stream, c.function, *constants, tuple(args))
            return
        if direct is None and DIRECT_LAUNCH:
            self._direct = record_launch(c, self._grid3, stream, tuple(args))  # launches too
            return
        c.run(*self._grid3, stream, c.function, c.packed_metadata, None, None, None, *args)

    def _arm(self, compiled, args: tuple) -> None:
        """Prepare the fast path from the first launch, or record why there is none."""
        ok, why = fast_launch_status()
        if not ok:
            self.fallback_reason = why
            return
        if hasattr(compiled, "result"):  # an asynchronous compile hands back a future
            compiled = compiled.result()
        missing = [a for a in ("run", "function", "packed_metadata", "launch_metadata") if not hasattr(compiled, a)]
        params = getattr(self.kernel, "params", None)
        if missing or params is None:
            self.fallback_reason = (
                f"triton {triton.__version__}: the launch returned "
                f"{type(compiled).__name__} without {missing or ['kernel.params']}"
            )
            return
        full, out_pos = [], -1
        for i, p in enumerate(params):  # every parameter in order, as Triton's binder binds them
            if i < len(args):
                value = args[i]
            elif p.name in self.kwargs:
                value = self.kwargs[p.name]
            else:
                value = p.default
            if self.out_pos >= 0 and i == self.out_pos:
                out_pos = i
            full.append(value)
        self._full, self._full_out_pos = tuple(full), out_pos
        # the launcher takes an int as the pointer itself (a tensor costs a data_ptr() call and a
        # pointer-attribute query); the tensors stay alive in self.args
        self._ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in full)
        self._direct = None if DIRECT_LAUNCH else "switched off (LABKIT_DIRECT_LAUNCH=0)"
        self._aligned = out_pos < 0 or args[self.out_pos].data_ptr() % 16 == 0
        self._stream = _stream_getter()
        self._grid3 = (self.grid + (1, 1))[:3]
        self.compiled = compiled
        self.fallback_reason = None

    @property
    def fast(self) -> bool:
        return self.compiled is not None

    @property
    def settled(self) -> bool:
        """Armed, and its direct launch recorded or refused: what a launch does no longer changes
        from one call to the next (``graph_launch``'s step 1)."""
        return self.compiled is not None and self._direct is not None

    @property
    def direct(self) -> bool:
        """Whether launches skip ``CompiledKernel.run``'s wrapper (``record_launch``)."""
        return type(self._direct) is tuple if self.compiled is not None else False

    @property
    def direct_reason(self) -> str | None:
        """Why launches go through the wrapper (None: direct, or not armed or recorded yet)."""
        if self.compiled is None or type(self._direct) is tuple:
            return None
        return self._direct


class CopySteps:
    """Copies between buffers made with ``Tensor.copy_`` (the copy engines): ``two_shot_ce``'s first shot."""

    __slots__ = ("pairs",)

    def __init__(self, pairs):
        self.pairs = tuple(pairs)  # (destination view, source view), in launch order

    def __call__(self, out) -> None:
        for dst, src in self.pairs:
            dst.copy_(src)


class CollectivePlan:
    """One collective on one buffer with everything decided: call it to launch (see the module
    docstring for what it fixes and what it checks on every call).

    op, algorithm: what runs; in_place: the result is ``buf.tensor``; out: the output tensor the
    plan was made for (None: a new one per call, like the eager call); steps: the launches
    (``KernelLaunch``, ``CopySteps``) in order; chooser_table: which chooser table the choices
    read (``tables.ChooserTable.describe``: the GPU's recorded table, or the defaults)."""

    def __init__(
        self,
        op: str,
        buf,
        steps,
        *,
        algorithm: str,
        in_place: bool,
        out_shape: tuple,
        out: torch.Tensor | None = None,
        checked_out: torch.Tensor | None = None,
        keep_buffer: bool = True,
        fast: bool = True,
        chooser_table: str | None = None,
    ):
        x = buf.tensor
        self.chooser_table = chooser_table
        for s in steps:
            if isinstance(s, KernelLaunch):
                s.armable = fast
        self.op, self.algorithm, self.in_place, self.steps = op, algorithm, in_place, tuple(steps)
        self.out_shape, self.dtype, self.device = tuple(out_shape), x.dtype, x.device
        self._out_size = torch.Size(out_shape)
        self.world_size, self.rank = buf.world_size, buf.rank
        self._buf = weakref.ref(buf)
        self.buf = buf if keep_buffer else None  # a standalone plan keeps its buffer alive
        self._x, self._x_ptr, self._x_shape = x, x.data_ptr(), x.shape
        self.out = out
        # the address of the out the plan's checks passed (held, or only seen: a cached plan's);
        # ``launch`` takes an out there with the plan's shape, dtype and device without a second look
        checked_out = out if out is not None else checked_out
        self._out_ptr = checked_out.data_ptr() if checked_out is not None else None
        if out is not None:
            self._out_shape = out.shape
        self._guard = on_device(x.device)
        # the launches replayed from a CUDA graph once settled, for calls into one fixed output
        # (in place, or the out the plan's checks passed): ``graph_launch``
        self._graph = GraphReplay(x.device, _no_hooks)
        if not all(isinstance(s, KernelLaunch) for s in self.steps):
            self._graph.reason = "a copy-engine step (Tensor.copy_) is not captured"
        elif not fast:
            self._graph.reason = "a plan for one call (not cached)"
        elif not in_place and self._out_ptr is None:
            self._graph.reason = "a new output per call"

    def __repr__(self):
        where = "in place" if self.in_place else ("into its out" if self.out is not None else "into a new tensor")
        return (
            f"CollectivePlan({self.op}, {self.algorithm}, rank {self.rank} of {self.world_size}, "
            f"{tuple(self._x_shape)} {str(self.dtype).replace('torch.', '')} on {self.device}, {where}, "
            f"launch: {self.launch_path})"
        )

    @property
    def launch_path(self) -> str:
        """How the plan's kernels launch now: "compiled launcher (direct)" (its C launch function,
        ``record_launch``), "compiled launcher" (through ``CompiledKernel.run``), or "triton (<why>)"."""
        kernels = [s for s in self.steps if isinstance(s, KernelLaunch)]
        if kernels and all(s.fast for s in kernels):
            path = "compiled launcher" + (" (direct)" if all(s.direct for s in kernels) else "")
            return path + (", replayed from a CUDA graph" if self._graph.graph is not None else "")
        return f"triton ({kernels[0].fallback_reason if kernels else 'no kernel'})"

    @property
    def graph_reason(self) -> str | None:
        """Why the plan's calls do not replay a CUDA graph (``graph_launch``), or None when they do."""
        return self._graph.reason

    def describe(self) -> list[dict]:
        """The launches as data, one dict per step: a kernel's name, grid, arguments (a tensor as
        its address, shape and dtype; the output as "OUT") and launch options; a copy step's
        (destination, source) addresses and lengths. Two plans with equal descriptions launch the
        same kernels with the same configuration: how tests check that ``all_reduce`` and
        ``all_reduce_plan`` (and ``collectives.Graphed``) choose alike."""
        out = []
        for s in self.steps:
            if isinstance(s, KernelLaunch):
                out.append(
                    {
                        "kernel": getattr(s.kernel, "fn", s.kernel).__name__,
                        "grid": s.grid,
                        "args": tuple(_describe_arg(a) for a in s.args),
                        "options": {k: _describe_arg(v) for k, v in sorted(s.kwargs.items())},
                    }
                )
            else:
                out.append({"copies": tuple((d.data_ptr(), s_.data_ptr(), d.numel()) for d, s_ in s.pairs)})
        return out

    def stale(self) -> str | None:
        """Why this plan can no longer launch (its buffer freed or changed), or None."""
        buf = self._buf()
        if buf is None:
            return "its symmetric buffer has been freed"
        x = buf.tensor
        if x is not self._x:
            return "buf.tensor is no longer the tensor the plan was made for (re-assigned)"
        if x.data_ptr() != self._x_ptr or x.shape != self._x_shape:
            return (
                f"buf.tensor moved or changed shape since the plan was made (address {self._x_ptr:#x} "
                f"shape {tuple(self._x_shape)}, now {x.data_ptr():#x} {tuple(x.shape)}: set_, resize_ or "
                "its storage freed)"
            )
        return None

    def __call__(self) -> torch.Tensor:
        """Launch on the current stream of the buffer's device; returns the output (``buf.tensor``
        in place). Same barrier semantics as the eager call: the input must be in ``buf.tensor``
        (in stream order) on every rank, and every rank must call its plan."""
        why = self.stale()
        out = self.out
        if (
            why is None
            and out is not None
            and (out.data_ptr() != self._out_ptr or out.shape != self._out_shape or not out.is_contiguous())
        ):
            why = (
                f"its out tensor moved or changed shape since the plan was made (address {self._out_ptr:#x} "
                f"shape {tuple(self._out_shape)} contiguous, now {out.data_ptr():#x} {tuple(out.shape)} "
                f"strides {out.stride()})"
            )
        if why is not None:
            raise UsageError(f"plan: {why}; make a new plan ({self.op}_plan(buf, ...))")
        return self._launch(out)

    def launch(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The launches alone, without ``__call__``'s staleness checks: into ``out``, or a new
        tensor when None, or ``buf.tensor`` in place (``out`` None or ``buf.tensor``).

        ``out`` is checked, with O(1) compares: a tensor of the plan's output shape (so of its
        numel), dtype and device, contiguous, else a UsageError naming ``out`` (TypeError for a
        non-tensor); a plan made in place takes only ``buf.tensor``. An out at the address the
        plan's checks passed (its own, or the one a cached plan was made for) needs nothing more;
        one elsewhere is also checked not to share memory with any rank's symmetric buffer (one
        compare per rank). Not checked here: whether the buffer is still the plan's (``__call__``
        and ``stale`` do that)."""
        if self.in_place:
            if out is not None and out is not self._x and not _same_memory(out, self._x):
                self._refuse_out(out)
        elif out is not None and not (
            type(out) is torch.Tensor
            and out.data_ptr() == self._out_ptr
            and out.shape == self._out_size
            and out.dtype == self.dtype
            and out.device == self.device
            and out.is_contiguous()
        ):
            self._check_out(out)
        return self._launch(out)

    def _launch(self, out: torch.Tensor | None) -> torch.Tensor:
        """``launch`` without its checks, for callers that have made them: ``__call__`` (the plan's
        own out, checked where it is now) and the eager calls (whose cache key holds the out's
        address, shape, strides, dtype and device: equal to those of the out the plan was checked
        with when it was made)."""
        if self.in_place:
            out = self._x
        elif out is None:
            out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        graph = self._graph
        if graph.graph is not None:
            if graph.replay(out.data_ptr()):
                return out
        elif graph.open and all(s.settled for s in self.steps):
            ptr = out.data_ptr()
            if (self.in_place or ptr == self._out_ptr) and graph.capture(ptr, lambda: self._run_steps(out)):
                if graph.replay(ptr):
                    return out
        self._run_steps(out)
        return out

    def _run_steps(self, out: torch.Tensor) -> None:
        with self._guard:
            for step in self.steps:
                step(out)

    def _check_out(self, out) -> None:
        """``launch``'s full look at an out it does not know: raises unless ``out`` is a contiguous
        tensor of the plan's shape, dtype and device outside every rank's symmetric buffer."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"plan.launch: out: expected a torch.Tensor or None, got {type(out).__name__}")
        made = f"the plan was made for {tuple(self._out_size)} {self.dtype} on {self.device}"
        if out.device != self.device:
            raise UsageError(f"plan.launch: out: is on {out.device}; {made}")
        if out.dtype != self.dtype:
            raise UsageError(f"plan.launch: out: dtype {out.dtype} differs; {made}")
        if out.shape != self._out_size:
            raise UsageError(
                f"plan.launch: out: shape {tuple(out.shape)} ({out.numel()} elements); {made} "
                f"({self._out_size.numel()} elements): the kernels would write past a smaller out"
            )
        if not out.is_contiguous():
            raise UsageError(f"plan.launch: out: is not contiguous (strides {out.stride()}); {made}")
        buf = self._buf()
        for r, peer in enumerate(buf.peers if buf is not None else ()):
            if overlaps(out, peer):
                whose = "this rank's" if r == self.rank else f"rank {r}'s"
                raise UsageError(
                    f"plan.launch: out: shares memory with {whose} symmetric buffer, which the kernels read "
                    "while they write out; pass a separate tensor"
                )
        inbox = getattr(buf, "inbox", None)
        if inbox is not None:  # the peers store into every inbox during a flag-in-data call
            for r, peer in enumerate(inbox.buf.peers):
                if overlaps(out, peer):
                    whose = "this rank's" if r == self.rank else f"rank {r}'s"
                    raise UsageError(
                        f"plan.launch: out: shares memory with {whose} flag-in-data inbox, which the peers "
                        "write during a call; pass a separate tensor"
                    )

    def _refuse_out(self, out) -> None:
        """An in-place plan given an out other than ``buf.tensor``."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"plan.launch: out: expected a torch.Tensor or None, got {type(out).__name__}")
        raise UsageError(
            "plan.launch: out: the plan computes in place (into buf.tensor); pass out=None or "
            "buf.tensor, or make a plan for this out"
        )


def _same_memory(a, b: torch.Tensor) -> bool:
    """``a`` is a tensor over exactly ``b``'s memory, as ``b`` lays it out (contiguous ``b``)."""
    return (
        type(a) is torch.Tensor
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.device == b.device
        and a.is_contiguous()
    )


def _describe_arg(a):
    if a is OUT:
        return "OUT"
    if isinstance(a, torch.Tensor):
        return ("tensor", a.data_ptr(), tuple(a.shape), str(a.dtype).replace("torch.", ""))
    return a


def out_key(out) -> tuple | None:
    """What a cached plan depends on in ``out``: the memory it covers and how (its address, shape,
    strides, dtype and device decide the checks and the compiled kernel's specialisation)."""
    if out is None:
        return ()
    return (out.data_ptr(), out.shape, out.stride(), out.dtype, out.device)


def kept(buf, key: tuple) -> CollectivePlan | None:
    """The plan kept on ``buf`` under ``key``, or None when there is none or the one there went
    stale (then the caller makes one with the eager call's full checks and ``keep``s it). ``key``
    holds every argument of the call but the buffer, and ``out_key(out)``; a TypeError says one of
    them is unhashable (then the caller makes a plan for that call alone, whose checks name it)."""
    p = buf._plans.get(key)
    if p is not None and p.stale() is None:
        return p
    return None


def keep(buf, key: tuple, p: CollectivePlan) -> None:
    """Keep ``p`` on ``buf`` under ``key`` (replacing a stale one), the oldest dropped beyond
    ``MAX_PLANS``."""
    plans = buf._plans
    if len(plans) >= MAX_PLANS and key not in plans:
        del plans[next(iter(plans))]
    plans[key] = p
