"""What the one-shot protocols with an inbox (``push``, ``flag_in_data``) share on the host: the
``Inbox`` both protocols' inboxes derive from (the buffer, the fixed launch, the kept launches),
the checks of a call, the one-shot kernel's launch (``one_shot_launch``: both kernels take the same
arguments), and the call's launch kept on the inbox, so that a repeated call costs one dict
lookup and a few compares before Triton's compiled launcher.

Both protocols read a plain local ``x`` and write a plain ``out`` (``out`` may be ``x``: in
place); only the inbox is symmetric, and the peers store into every rank's inbox during a call.
So a call checks, once per (x address, out address, elements):

1. ``box`` is the protocol's inbox and its buffer is still the allocation it was made with;
2. ``x`` is a contiguous tensor of the inbox's dtype and device with 1 to ``box.capacity``
   elements, not inside any rank's inbox;
3. ``out`` is None, ``x``, or a contiguous tensor like ``x`` that does not overlap it, not inside
   any rank's inbox.

A repeated call with the same addresses and element count repeats only the O(1) compares that
can change without the addresses changing (dtype, device, contiguity, shape): a tensor at an
address already checked, of the same dtype and size, covers the same bytes, so steps 2 and 3's
overlap checks give the answer they gave.
"""

from __future__ import annotations

import dataclasses

import torch

from labkit.kernels.comm import symm
from labkit.kernels.comm.graph_launch import GraphReplay
from labkit.kernels.comm.plan import OUT, KernelLaunch, _no_hooks
from labkit.kernels.launch_helpers import overlaps
from labkit.workbench.guard import on_device

#: launches kept per inbox (one per input address, output address, size and variant); the oldest
#: is dropped first
MAX_LAUNCHES = 16


@dataclasses.dataclass(eq=False)
class Inbox:
    """This rank's inbox of one protocol for all-reduces of up to ``capacity`` elements; each
    protocol derives its own (``push.Inbox``, ``flag_in_data.Inbox``: what its pad rows hold, its
    counters). ``programs`` and ``block`` are fixed here, not per call: both protocols need every
    call to map elements to programs alike."""

    buf: symm.SymmBuffer  # T [2, W, capacity] per rank, and its signal pad (the protocol's rows)
    capacity: int
    programs: int
    block: int
    num_warps: int
    #: (x address, out address, elements, the protocol's variant) -> its ``InputLaunch``, oldest first
    launches: dict = dataclasses.field(default_factory=dict)

    @property
    def dtype(self) -> torch.dtype:
        return self.buf.tensor.dtype

    @property
    def device(self) -> torch.device:
        return self.buf.tensor.device


def check_call(x, box, out, inbox_type: type, made_by: str) -> torch.Tensor:
    """Steps 1 to 3 of the module's checks for ``all_reduce(x, box, out)``; returns the output
    (a new tensor like ``x`` when ``out`` is None). ``inbox_type``: the protocol's ``Inbox``;
    ``made_by``: how one is made, for the error ("push.inbox(...)"). Errors name the argument."""
    if not isinstance(box, inbox_type):
        raise TypeError(
            f"all_reduce: box: expected a {inbox_type.__module__}.{inbox_type.__name__} ({made_by}), "
            f"got {type(box).__name__}"
        )
    symm.check_buffer("box.buf", box.buf)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"all_reduce: x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != box.dtype:
        raise TypeError(f"all_reduce: x: dtype {x.dtype} differs from the inbox's {box.dtype}")
    if x.device != box.device:
        raise ValueError(f"all_reduce: x: on {x.device}, the inbox on {box.device}: they must be on the same device")
    if not x.is_contiguous():
        raise ValueError("all_reduce: x: expected a contiguous tensor")
    if x.numel() == 0 or x.numel() > box.capacity:
        raise ValueError(f"all_reduce: x: {x.numel()} elements; the inbox takes 1 to {box.capacity}")
    outside_inboxes("x", x, box)
    if out is None:
        return torch.empty_like(x)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"all_reduce: out: expected a torch.Tensor or None, got {type(out).__name__}")
    if out.dtype != x.dtype or out.device != x.device or out.shape != x.shape or not out.is_contiguous():
        raise ValueError(
            f"all_reduce: out: expected a contiguous {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}, "
            f"got {'a contiguous' if out.is_contiguous() else 'a non-contiguous'} {out.dtype} tensor of "
            f"shape {tuple(out.shape)} on {out.device}"
        )
    if out.data_ptr() != x.data_ptr() and overlaps(out, x):
        raise ValueError("all_reduce: out: overlaps x without being x (in place means out is x)")
    outside_inboxes("out", out, box)
    return out


def outside_inboxes(name: str, t: torch.Tensor, box, what: str = "all_reduce") -> None:
    """The peers store into every rank's inbox while this rank reads ``x`` and writes ``out``:
    neither may live inside one. ``what``: the function named in the error."""
    for r, peer in enumerate(box.buf.peers):
        if overlaps(t, peer):
            whose = "this rank's" if r == box.buf.rank else f"rank {r}'s"
            raise ValueError(
                f"{what}: {name}: shares memory with {whose} inbox, which the peers write during the "
                "call; pass a tensor of its own"
            )


def call(box, x, out, inbox_type: type, check, make, variant: tuple = ()) -> torch.Tensor:
    """Launch ``all_reduce(x, box, out)`` through the launch kept on ``box`` for these addresses,
    size and ``variant`` (the protocol's switches, part of the key); returns the output.
    ``inbox_type``: the protocol's ``Inbox`` (anything else gets ``check``'s error).

    The repeated-call path: one dict lookup, the O(1) compares of the module docstring, the
    device guard, the compiled launcher. A call it does not know runs ``check(x, box, out)`` (the
    full checks, which return the output), then ``make(x, box)`` (an ``InputLaunch``), kept on
    ``box.launches``."""
    if type(box) is inbox_type and type(x) is torch.Tensor and (out is None or type(out) is torch.Tensor):
        n = x.numel()
        key = (x.data_ptr(), None if out is None else out.data_ptr(), n, variant)
        launch = box.launches.get(key)
        if (
            launch is not None
            and x.dtype == launch.dtype
            and x.device == launch.device
            and x.is_contiguous()
            and (
                out is None
                or (
                    out.dtype == launch.dtype
                    and out.device == launch.device
                    and out.shape == x.shape
                    and out.is_contiguous()
                )
            )
        ):
            if out is None:
                target = torch.empty_like(x)
            elif launch.replayed(x, out):
                return out
            else:
                target = out
            with launch.guard:
                launch.run(x, target)
            return target
    target = check(x, box, out)
    key = (x.data_ptr(), None if out is None else out.data_ptr(), x.numel(), variant)
    launch = box.launches.get(key)
    if launch is None:
        if len(box.launches) >= MAX_LAUNCHES:
            del box.launches[next(iter(box.launches))]
        launch = box.launches[key] = make(x, box)
    with launch.guard:
        launch.run(x, target)
    return target


def one_shot_launch(kernel, x: torch.Tensor, box, **constexprs) -> InputLaunch:
    """The launch of a protocol's one-shot kernel (``push_one_shot_kernel``,
    ``fid_one_shot_kernel``) for ``x``'s size on ``box``: both take (x, the inboxes' data and pad
    pointer tables, out, elements, capacity, rank), one program per block of the inbox, and the
    constexprs WORLD, MAX_BLOCKS (the signal pad's rows, as the inbox allocated it) and BLOCK;
    ``constexprs``: the protocol's own (its bit width, slots, delays)."""
    b = box.buf
    return InputLaunch(
        kernel,
        (box.programs,),
        (X, b.data_ptrs, b.pad_ptrs, OUT, x.numel(), box.capacity, b.rank),
        dict(WORLD=b.world_size, MAX_BLOCKS=b.max_blocks, BLOCK=box.block, **constexprs, num_warps=box.num_warps),
        x,
    )


def disagreements(buf: symm.SymmBuffer, channel: int, programs: int, column: int) -> int:
    """The calls in which a protocol's kernel saw counts that disagree, as its programs counted
    them into (``channel``, program b, ``column``) of this rank's pad: the most over the
    ``programs`` (every program of such a call counts it). Reads the device (a sync)."""
    return int(buf.local_pad[channel, :programs, column].max())


class X:
    """Marks the input's place among an ``InputLaunch``'s arguments (given on every call, as ``OUT``)."""

    def __repr__(self):
        return "X"


class InputLaunch(KernelLaunch):
    """One kernel launch of an inbox protocol, with the input (first argument, ``X``) and the
    output (``OUT``) given per call: after the first launch both go straight to Triton's compiled
    launcher (``KernelLaunch`` arms it) as addresses, and no tensor of a call is kept (the cache
    holds no caller's memory). Every other argument is fixed: the inbox's pointer tables (one
    int64 device table each, however many ranks), the element count, capacity and rank."""

    __slots__ = ("guard", "dtype", "graph", "_x_aligned")

    def __init__(self, kernel, grid: tuple, args: tuple, kwargs: dict, x: torch.Tensor):
        if args[0] is not X:
            raise ValueError("InputLaunch: args: the input (X) must be the kernel's first argument")
        super().__init__(kernel, grid, args, kwargs, x.device)
        self.guard = on_device(x.device)
        self.dtype = x.dtype
        self.graph = GraphReplay(x.device, _no_hooks)

    def replayed(self, x: torch.Tensor, out: torch.Tensor) -> bool:
        """The launch for this input and output, replayed from a CUDA graph (``graph_launch``:
        captured once settled, for the addresses of the call that captured); False when the call
        must launch the normal way (``run``). The caller passes a given ``out``, never a new one."""
        g = self.graph
        key = (x.data_ptr(), out.data_ptr())
        if g.graph is not None:
            return g.replay(key)
        if g.open and self.settled:
            return g.capture(key, lambda: self._run_guarded(x, out)) and g.replay(key)
        return False

    def _run_guarded(self, x: torch.Tensor, out: torch.Tensor) -> None:
        with self.guard:
            self.run(x, out)

    def run(self, x: torch.Tensor, out: torch.Tensor) -> None:
        if (
            self.compiled is not None
            and (x.data_ptr() % 16 == 0) == self._x_aligned
            and (out.data_ptr() % 16 == 0) == self._aligned
        ):
            args = list(self._ints)
            args[0], args[self._full_out_pos] = x.data_ptr(), out.data_ptr()
            self.launch_addresses(args, ((0, x), (self._full_out_pos, out)))
            return
        args = (x,) + self.args[1 : self.out_pos] + (out,) + self.args[self.out_pos + 1 :]
        compiled = self.kernel[self.grid](*args, **self.kwargs)
        if self.compiled is None:
            self._arm(compiled, args)
            if self.compiled is not None:
                # Keep no tensor of this call: the input's and output's places hold None and
                # each call gives their addresses (the tables live as long as the inbox).
                ints = list(self._ints)
                ints[0] = ints[self._full_out_pos] = None
                self._ints = tuple(ints)
                full = list(self._full)
                full[0] = full[self._full_out_pos] = None
                self._full = tuple(full)
                self._x_aligned = x.data_ptr() % 16 == 0


__all__ = [
    "MAX_LAUNCHES",
    "Inbox",
    "OUT",
    "X",
    "InputLaunch",
    "call",
    "check_call",
    "disagreements",
    "one_shot_launch",
    "outside_inboxes",
]
