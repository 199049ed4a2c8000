"""Bulk allocation two ways, and how aligned the pieces are.

The story (seed ``te-grouped-wgrad-tensor-views-pr``): a grouped linear layer needs one weight
gradient per group. Allocating them one by one costs a trip through the caching allocator each,
so TransformerEngine allocated one block and cut it up.

* ``allocate_raw`` cuts it up the way a foreign library does: each piece is a new tensor made
  from a raw pointer (``__cuda_array_interface__`` on CUDA, ``__array_interface__`` on the CPU),
  at 256-byte aligned offsets. The pieces keep the block alive, but PyTorch's caching allocator
  no longer knows they live in its block: ``piece.record_stream(side)`` is a silent no-op, so the
  block can be handed out again while a side stream still writes into it (``labkit.labs.stream_races.race``).
* ``allocate_views`` is the fix: plain views of one ``torch.empty``. ``record_stream`` on a view
  reaches the allocator's block. Packed back to back (``alignment=None``, what the fix does) a
  piece starts wherever the previous one ended, so the 256-byte alignment is gone unless the
  piece sizes happen to be multiples of 256 bytes (``view_alignment``) or the offsets are padded
  (``alignment=256``).

``alignment_report`` says, for any tensors, which of 16 / 128 / 256 bytes their pointers honour:
16 bytes is what vector loads and Triton's pointer specialisation need, 128 and 256 what
cuBLAS and TMA prefer.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from labkit.workbench.checks import check_device
from labkit.workbench.errors import UsageError

#: Alignments the report checks, in bytes.
REPORT_ALIGNMENTS = (16, 128, 256)
#: What cudaMalloc (and so every caching-allocator block) guarantees at least.
ALLOCATOR_ALIGNMENT = 256
STYLES = ("raw", "views")


@dataclasses.dataclass
class Bulk:
    """What a bulk allocation hands out. Holding a ``Bulk`` does not keep the memory alive:
    only its tensors do, exactly as with a plain list of tensors."""

    style: str  # "raw" or "views"
    tensors: list[torch.Tensor]  # the pieces, in request order
    offsets: list[int]  # byte offset of each piece from the block's aligned start
    nbytes: int  # size of the backing block in bytes
    alignment: int | None  # offsets are multiples of this (None: packed)
    #: raw style only: a weak reference to the backing tensor, dead once every piece is gone.
    #: (Views hold the block through C++ references that a Python weakref cannot see; on CUDA
    #: ``torch.cuda.memory_allocated`` shows their lifetime instead.)
    backing: weakref.ReferenceType | None = None


def _normalise_request(shapes, dtypes) -> tuple[list[tuple[int, ...]], torch.dtype]:
    if isinstance(shapes, (torch.Size, tuple)) and all(isinstance(s, int) for s in shapes):
        raise TypeError(f"shapes: expected a list of shapes, got one shape {tuple(shapes)}; wrap it: [shape]")
    shapes = [tuple(s) for s in shapes]
    if not shapes:
        raise ValueError("shapes: zero-size request (no shapes given)")
    for s in set(shapes):  # each distinct shape once: bulk requests repeat one shape many times
        i = shapes.index(s)
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in s):
            raise TypeError(f"shapes[{i}]: dimensions must be ints, got {s}")
        if any(d < 0 for d in s):
            raise ValueError(f"shapes[{i}]: negative dimension in {s}")
        if math.prod(s) == 0:
            raise ValueError(f"shapes[{i}]: zero-size request {s}; every piece needs at least one element")
    if isinstance(dtypes, torch.dtype):
        return shapes, dtypes
    dtypes = list(dtypes)
    if len(dtypes) != len(shapes):
        raise ValueError(f"dtypes: {len(dtypes)} given for {len(shapes)} shapes")
    if not all(isinstance(d, torch.dtype) for d in dtypes):
        raise TypeError(f"dtypes: expected torch.dtype values, got {dtypes}")
    distinct = sorted({str(d).replace("torch.", "") for d in dtypes})
    if len(distinct) > 1:
        raise TypeError(
            f"dtypes: mixed dtypes {distinct} in one bulk allocation; "
            "allocate one bulk per dtype (a view can have only its block's element size)"
        )
    return shapes, dtypes[0]


def _check_alignment(alignment, itemsize: int, name: str = "alignment") -> int:
    if not isinstance(alignment, int) or isinstance(alignment, bool):
        raise TypeError(f"{name}: expected an int number of bytes, got {alignment!r}")
    if alignment <= 0:
        raise ValueError(f"{name}: must be positive, got {alignment}")
    if alignment & (alignment - 1):
        raise ValueError(f"{name}: must be a power of two, got {alignment}")
    if alignment < itemsize:
        raise ValueError(f"{name}: {alignment} bytes is smaller than one element ({itemsize} bytes)")
    return alignment


def layout(shapes, dtypes, alignment: int | None) -> tuple[list[int], int]:
    """Byte offsets of each piece and the total size: pieces back to back, each offset rounded up
    to ``alignment`` bytes (None: packed, i.e. aligned to the element size only)."""
    shapes, dtype = _normalise_request(shapes, dtypes)
    return _layout(shapes, dtype, alignment)


def _layout(shapes: list[tuple[int, ...]], dtype: torch.dtype, alignment: int | None) -> tuple[list[int], int]:
    itemsize = dtype.itemsize
    align = itemsize if alignment is None else _check_alignment(alignment, itemsize)
    offsets, cursor = [], 0
    for s in shapes:
        cursor = -(-cursor // align) * align
        offsets.append(cursor)
        cursor += math.prod(s) * itemsize
    return offsets, cursor


class _ForeignBlock:
    """A raw pointer presented the way a foreign library would: the array-interface protocols.
    It holds the backing tensor, so the memory lives exactly as long as some piece does."""

    def __init__(self, owner: torch.Tensor, offset: int, nbytes: int):
        self.owner = owner
        ptr = owner.data_ptr() + offset
        desc = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "strides": None}
        if owner.device.type == "cuda":
            # version 2: no "stream" key, so torch does not synchronise anything on import
            self.__cuda_array_interface__ = dict(desc, version=2)
        else:
            self.__array_interface__ = dict(desc, version=3)


def _block(total: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """A byte tensor holding ``total`` bytes from a 256-byte aligned start; returns (tensor, start).
    CUDA blocks are always 256-byte aligned (cudaMalloc and the caching allocator round to 512);
    the CPU allocator promises only 64, so on the CPU the block is over-allocated and the start
    moved up, which keeps every offset meaning the same on both tiers. A block the device cannot
    hold is a UsageError naming ``shapes`` and the bytes they need."""
    try:
        if device.type == "cuda":
            backing = torch.empty(total, dtype=torch.uint8, device=device)
            return backing, 0
        backing = torch.empty(total + ALLOCATOR_ALIGNMENT, dtype=torch.uint8, device=device)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        raise UsageError(
            f"shapes: the pieces need {total} bytes in one block on {device}, which could not be allocated "
            f"({str(e).splitlines()[0][:200]})"
        ) from None
    return backing, (-backing.data_ptr()) % ALLOCATOR_ALIGNMENT


def allocate_raw(shapes, dtypes, device, alignment: int = ALLOCATOR_ALIGNMENT) -> Bulk:
    """One block, handed out as tensors made from raw pointers (the bug's allocator).

    shapes:    a list of shapes, one per piece (no zero-size pieces)
    dtypes:    one dtype, or one per piece (all equal)
    device:    a CUDA device or the CPU ("cuda" is the current one); one this machine lacks is
               refused up front, naming ``device`` (labkit.workbench.checks.check_device)
    alignment: byte alignment of every piece's offset (power of two; 256 as TransformerEngine)
    """
    device = check_device("device", device)  # before torch.empty: a clear error, not torch's assert
    shapes, dtype = _normalise_request(shapes, dtypes)
    offsets, total = _layout(shapes, dtype, alignment)
    backing, start = _block(total, device)
    tensors = []
    for shape, off in zip(shapes, offsets):
        nbytes = math.prod(shape) * dtype.itemsize
        block = _ForeignBlock(backing, start + off, nbytes)
        if device.type == "cuda":
            raw = torch.as_tensor(block, device=device)  # keeps `block` (and so `backing`) alive
        else:
            raw = torch.from_numpy(np.asarray(block))  # the ndarray's base is `block`
        tensors.append(raw.view(dtype).view(shape))
    ref = weakref.ref(backing)
    del backing  # from here on only the pieces own the block
    return Bulk("raw", tensors, offsets, total, alignment, ref)


def allocate_views(shapes, dtypes, device, alignment: int | None = None) -> Bulk:
    """One ``torch.empty`` block, handed out as plain views of it (the fix).

    alignment: None packs the pieces back to back, as the fix does; a power of two pads every
               offset to it, which restores the guarantee the raw allocator gave.
    """
    device = check_device("device", device)  # before torch.empty: a clear error, not torch's assert
    shapes, dtype = _normalise_request(shapes, dtypes)
    offsets, total = _layout(shapes, dtype, alignment)
    isz = dtype.itemsize
    backing, start = _block(total, device)
    flat = backing[start : start + total].view(dtype)
    if len(set(shapes)) == 1:
        # Equal shapes (the grouped-wgrad case): one (groups, stride) view and one unbind, as
        # cheap as the story's torch.empty(G, *shape) + [w[i] for i]; this path is timed in the lab.
        shape, n, groups = shapes[0], math.prod(shapes[0]), len(shapes)
        stride = (offsets[1] - offsets[0]) // isz if groups > 1 else n
        pieces = flat.as_strided((groups, *shape), (stride, *_contiguous_strides(shape)))
        return Bulk("views", list(pieces.unbind(0)), offsets, total, alignment)
    # Mixed shapes: one split into pieces (and the gaps padding leaves), then a view per piece.
    sizes, kept, cursor = [], [], 0
    for s, off in zip(shapes, offsets):
        if off > cursor:
            sizes.append((off - cursor) // isz)  # padding, dropped below
        kept.append(len(sizes))
        sizes.append(math.prod(s))
        cursor = off + math.prod(s) * isz
    parts = flat.split(sizes)
    tensors = [parts[i].view(s) for i, s in zip(kept, shapes)]
    return Bulk("views", tensors, offsets, total, alignment)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def allocate(style: str, shapes, dtypes, device, alignment: int | None = None) -> Bulk:
    """``allocate_raw`` or ``allocate_views`` by name; alignment None means each style's default
    (256 for raw, packed for views)."""
    if style == "raw":
        return allocate_raw(shapes, dtypes, device, ALLOCATOR_ALIGNMENT if alignment is None else alignment)
    if style == "views":
        return allocate_views(shapes, dtypes, device, alignment)
    raise UsageError(f"style: {style!r} is not one of {STYLES}")


def pointer_alignment(ptr: int, cap: int = ALLOCATOR_ALIGNMENT) -> int:
    """The largest power of two (at most ``cap``) that divides ``ptr``."""
    if ptr == 0:
        return cap
    return min(cap, ptr & -ptr)


def alignment_report(tensors: Sequence[torch.Tensor] | Iterable[torch.Tensor], names=None) -> list[dict]:
    """One row per tensor: its pointer modulo 16 / 128 / 256 and whether each alignment holds."""
    tensors = list(tensors)
    names = [f"t{i}" for i in range(len(tensors))] if names is None else list(names)
    if len(names) != len(tensors):
        raise ValueError(f"names: {len(names)} names for {len(tensors)} tensors")
    rows = []
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        ptr = t.data_ptr()
        row = {
            "name": name,
            "shape": tuple(t.shape),
            "dtype": str(t.dtype).replace("torch.", ""),
            "aligned_to": pointer_alignment(ptr),
        }
        for a in REPORT_ALIGNMENTS:
            row[f"mod_{a}"] = ptr % a
            row[f"aligned_{a}"] = ptr % a == 0
        rows.append(row)
    return rows


def view_alignment(shape, dtype: torch.dtype, cap: int = ALLOCATOR_ALIGNMENT) -> int:
    """Alignment every piece of a packed bulk of equal ``shape`` pieces is guaranteed, given a
    block aligned to ``cap``: piece i starts at i * size, so it is the largest power of two
    dividing size = numel * itemsize (at most ``cap``). 4096 x 4096 bf16: 256. 4095 x 3 bf16: 2."""
    shape, dtype = _normalise_request([shape], dtype)
    return pointer_alignment(math.prod(shape[0]) * dtype.itemsize, cap)


def padded_numel(shape, dtype: torch.dtype, alignment: int = ALLOCATOR_ALIGNMENT) -> int:
    """Elements to reserve per piece so that packed pieces of ``shape`` stay ``alignment``-aligned
    (the padding that restores the guarantee)."""
    shape, dtype = _normalise_request([shape], dtype)
    align = _check_alignment(alignment, dtype.itemsize)
    nbytes = math.prod(shape[0]) * dtype.itemsize
    return -(-nbytes // align) * align // dtype.itemsize
