"""labkit.kernels.alloc: bulk allocation (raw pointers, views), alignment arithmetic and the report.

CPU tests run everywhere (the raw allocator goes through ``__array_interface__`` there); the GPU
tests check the CUDA path and the allocator's own accounting of when the memory is released."""

import gc
import math

import pytest
import torch

from labkit.kernels import alloc
from labkit.workbench import tier

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.uint8]


@pytest.mark.parametrize("style", alloc.STYLES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pieces_have_the_requested_shapes_and_do_not_overlap(style, dtype):
    shapes = [(3, 5), (7,), (2, 2, 3), (1,)]
    bulk = alloc.allocate(style, shapes, dtype, tier.kernel_device())
    assert [tuple(t.shape) for t in bulk.tensors] == shapes
    assert all(t.dtype == dtype and t.is_contiguous() for t in bulk.tensors)
    # each piece starts at its planned offset from the first one, and no two pieces share a byte
    base = bulk.tensors[0].data_ptr() - bulk.offsets[0]
    spans = []
    for t, off in zip(bulk.tensors, bulk.offsets):
        assert t.data_ptr() == base + off
        spans.append((off, off + t.numel() * t.element_size()))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] <= bulk.nbytes
    # writing one piece leaves the others alone (fresh random values, compared exactly)
    for t in bulk.tensors:
        t.fill_(0)
    vals = torch.randint(1, 100, bulk.tensors[2].shape).to(dtype)
    bulk.tensors[2].copy_(vals.to(bulk.tensors[2].device))
    assert torch.equal(bulk.tensors[2].cpu(), vals)
    assert all(int(torch.count_nonzero(t)) == 0 for i, t in enumerate(bulk.tensors) if i != 2)


def test_raw_offsets_are_256_aligned_and_packed_views_are_not():
    shapes = [(4095, 3)] * 4  # 24570 bytes of bf16 per piece: 2-byte aligned when packed
    raw = alloc.allocate_raw(shapes, torch.bfloat16, tier.kernel_device())
    views = alloc.allocate_views(shapes, torch.bfloat16, tier.kernel_device())
    padded = alloc.allocate_views(shapes, torch.bfloat16, tier.kernel_device(), alignment=256)
    assert [r["aligned_256"] for r in alloc.alignment_report(raw.tensors)] == [True] * 4
    assert [r["aligned_256"] for r in alloc.alignment_report(padded.tensors)] == [True] * 4
    rep = alloc.alignment_report(views.tensors)
    assert rep[0]["aligned_256"] and not any(r["aligned_16"] for r in rep[1:])
    assert [r["mod_256"] for r in rep] == [(i * 24570) % 256 for i in range(4)]
    assert alloc.view_alignment((4095, 3), torch.bfloat16) == 2


@pytest.mark.parametrize(
    "shape,dtype,expected",
    [
        ((4096, 4096), torch.bfloat16, 256),  # 32 MiB per piece
        ((4096, 1), torch.bfloat16, 256),  # 8192 bytes
        ((8,), torch.float32, 32),  # 32 bytes
        ((3, 5), torch.bfloat16, 2),  # 30 bytes
        ((1408, 2048), torch.bfloat16, 256),  # a MoE expert's weight
        ((7,), torch.uint8, 1),
    ],
)
def test_view_alignment_is_what_packed_views_get(shape, dtype, expected):
    assert alloc.view_alignment(shape, dtype) == expected
    views = alloc.allocate_views([shape] * 5, dtype, tier.kernel_device())
    # measured on real pointers: every piece honours it (the block itself is 256-byte aligned)
    assert min(alloc.pointer_alignment(t.data_ptr()) for t in views.tensors) == expected


@pytest.mark.parametrize("shape,dtype", [((3, 5), torch.bfloat16), ((4095, 3), torch.float16), ((33,), torch.float32)])
def test_padding_restores_the_guarantee(shape, dtype):
    n = alloc.padded_numel(shape, dtype)
    assert n >= math.prod(shape) and (n * dtype.itemsize) % 256 == 0
    assert (n - math.prod(shape)) * dtype.itemsize < 256  # the least padding that works
    # packed views of the padded size are all 256-byte aligned; the real shape is a prefix
    views = alloc.allocate_views([(n,)] * 4, dtype, tier.kernel_device())
    pieces = [v[: math.prod(shape)].view(shape) for v in views.tensors]
    assert all(r["aligned_256"] for r in alloc.alignment_report(pieces))


def test_alignment_report_fields():
    buf = torch.empty(1024, dtype=torch.uint8, device=tier.kernel_device())
    base = buf.data_ptr()
    start = (-base) % 256  # first 256-aligned byte in the buffer
    rows = alloc.alignment_report(
        [buf[start:], buf[start + 2 :], buf[start + 16 :], buf[start + 128 :]], names=["a", "b", "c", "d"]
    )
    assert [r["name"] for r in rows] == ["a", "b", "c", "d"]
    assert [r["mod_256"] for r in rows] == [0, 2, 16, 128]
    assert [r["mod_16"] for r in rows] == [0, 2, 0, 0]
    assert [r["aligned_128"] for r in rows] == [True, False, False, True]
    assert [r["aligned_to"] for r in rows] == [256, 2, 16, 128]


def test_raw_pieces_keep_the_block_alive_exactly_as_long_as_needed():
    bulk = alloc.allocate_raw([(64,), (32,)], torch.float32, "cpu")
    assert bulk.backing() is not None
    keep = bulk.tensors[1]
    keep.fill_(3.0)
    bulk.tensors.clear()
    gc.collect()
    assert bulk.backing() is not None, "a live piece must keep the block alive"
    assert torch.all(keep == 3.0)  # and its memory is still readable, unchanged
    del keep
    gc.collect()
    assert bulk.backing() is None, "the block must die with its last piece"


def test_raw_piece_shares_memory_with_the_block():
    bulk = alloc.allocate_raw([(4,), (4,)], torch.float32, "cpu")
    backing = bulk.backing()
    bulk.tensors[1].copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    start = bulk.tensors[0].data_ptr() - backing.data_ptr()
    got = backing[start + bulk.offsets[1] : start + bulk.offsets[1] + 16].view(torch.float32)
    assert torch.equal(got, torch.tensor([1.0, 2.0, 3.0, 4.0]))


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"shapes": []}, ValueError, "zero-size request"),
        ({"shapes": [(3,), (0, 4)]}, ValueError, r"shapes\[1\]: zero-size request"),
        ({"shapes": [(3,), (-1,)]}, ValueError, r"shapes\[1\]: negative"),
        ({"shapes": (3, 4)}, TypeError, "one shape"),
        ({"alignment": 0}, ValueError, "alignment: must be positive"),
        ({"alignment": -256}, ValueError, "alignment: must be positive"),
        ({"alignment": 96}, ValueError, "power of two"),
        ({"alignment": 2.5}, TypeError, "alignment"),
        ({"alignment": 2, "dtypes": torch.float32}, ValueError, "smaller than one element"),
        ({"dtypes": [torch.float32, torch.bfloat16]}, TypeError, "mixed dtypes"),
        ({"dtypes": [torch.float32]}, ValueError, "1 given for 2 shapes"),
        ({"device": "meta"}, ValueError, "device"),
    ],
)
@pytest.mark.parametrize("fn", [alloc.allocate_raw, alloc.allocate_views])
def test_bad_requests_are_refused_with_the_argument_named(fn, kwargs, exc, match):
    args = {"shapes": [(3,), (4,)], "dtypes": torch.float32, "device": "cpu", "alignment": 256}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        fn(**args)


ALLOCATORS = [
    alloc.allocate_raw,
    alloc.allocate_views,
    lambda shapes, dtypes, device: alloc.allocate("raw", shapes, dtypes, device),
    lambda shapes, dtypes, device: alloc.allocate("views", shapes, dtypes, device),
]
ALLOCATOR_IDS = ["allocate_raw", "allocate_views", "allocate-raw", "allocate-views"]


@pytest.mark.parametrize("fn", ALLOCATORS, ids=ALLOCATOR_IDS)
def test_a_cuda_device_this_machine_lacks_is_refused_naming_device(fn):
    """Not torch's bare ``AssertionError: Torch not compiled with CUDA enabled`` (or an invalid
    device ordinal) from deep inside torch.empty: a UsageError (a ValueError) naming the
    argument, what was asked and what this machine has. cuda:<device_count()> never exists, so
    this holds on GPU machines too."""
    from labkit.workbench.errors import UsageError

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    asked = [f"cuda:{n}", torch.device("cuda", n + 3)] + (["cuda:7"] if n <= 7 else [])
    for device in asked:
        with pytest.raises(UsageError, match=rf"^device: '{torch.device(device)}' .*this machine has {n} CUDA device"):
            fn([(3,), (4,)], torch.float32, device)
    if n == 0:  # a bare "cuda" is the current device: there is none
        with pytest.raises(UsageError, match=r"^device: 'cuda' asked for a CUDA device, but this machine has 0"):
            fn([(3,)], torch.float32, "cuda")


@pytest.mark.parametrize("fn", ALLOCATORS, ids=ALLOCATOR_IDS)
@pytest.mark.parametrize(
    "device,exc,match",
    [
        ("garbage", ValueError, r"^device: 'garbage' is not a device"),
        ("cuda:x", ValueError, r"^device: 'cuda:x' is not a device"),
        ("cuda:-1", ValueError, r"^device: 'cuda:-1' is not a device"),
        ("", ValueError, r"^device: '' is not a device"),
        ("meta", ValueError, r"^device: expected one of the device types \('cpu', 'cuda'\), got 'meta'"),
        (None, TypeError, r"^device: expected a device such as 'cpu' or 'cuda:0', got NoneType"),
        (2.5, TypeError, r"^device: expected a device"),
    ],
)
def test_a_bad_device_is_refused_naming_device(fn, device, exc, match):
    with pytest.raises(exc, match=match):
        fn([(3,), (4,)], torch.float32, device)


def test_check_device_accepts_what_exists():
    from labkit.workbench.checks import check_device

    assert check_device("device", "cpu") == torch.device("cpu")
    assert check_device("device", torch.device("cpu")) == torch.device("cpu")
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        assert check_device("device", "cuda") == torch.device("cuda", torch.cuda.current_device())
        assert check_device("device", f"cuda:{n - 1}") == torch.device("cuda", n - 1)
    from labkit.workbench.errors import UsageError

    with pytest.raises(UsageError, match="^x: expected one of the device types"):
        check_device("x", "cpu", types=("cuda",))


def test_unknown_style_and_report_errors():
    from labkit.workbench.errors import UsageError

    with pytest.raises(UsageError, match="style"):
        alloc.allocate("malloc", [(3,)], torch.float32, "cpu")
    with pytest.raises(TypeError, match="t1: expected a torch.Tensor"):
        alloc.alignment_report([torch.zeros(1), [1, 2]])
    with pytest.raises(ValueError, match="names"):
        alloc.alignment_report([torch.zeros(1)], names=["a", "b"])


@pytest.mark.gpu
@pytest.mark.parametrize("style", alloc.STYLES)
def test_cuda_memory_is_released_with_the_last_piece(style):
    """The allocator's own accounting: the block is allocated while any piece lives, and given
    back (memory_allocated returns to where it was) when the last one dies, not before."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    bulk = alloc.allocate(style, [(1 << 20,)] * 4, torch.float32, "cuda")
    during = torch.cuda.memory_allocated()
    assert during - before >= 4 * (1 << 22)
    last = bulk.tensors[3]
    del bulk
    gc.collect()
    assert torch.cuda.memory_allocated() == during, "a live piece must keep the whole block"
    last.fill_(1.0)
    torch.cuda.synchronize()
    del last
    gc.collect()
    assert torch.cuda.memory_allocated() == before


@pytest.mark.gpu
def test_record_stream_is_a_no_op_on_raw_pieces_only():
    """What makes raw pieces dangerous, observed through the allocator's stats: record_stream on
    a view delays the block's reuse; on a raw piece it does nothing."""
    side = torch.cuda.Stream()
    for style, expect_held in (("views", True), ("raw", False)):
        torch.cuda.synchronize()
        bulk = alloc.allocate(style, [(1 << 20,)], torch.float32, "cuda")
        addr = bulk.tensors[0].data_ptr()
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # keep the side stream busy (about 25 ms)
        bulk.tensors[0].record_stream(side)
        del bulk
        fresh = torch.empty(1 << 20, device="cuda")
        held = fresh.data_ptr() != addr
        torch.cuda.synchronize()
        assert held == expect_held, f"{style}: block held back = {held}, expected {expect_held}"
        del fresh


@pytest.mark.parametrize("fn", [alloc.allocate_raw, alloc.allocate_views])
def test_a_block_that_cannot_be_allocated_names_shapes_and_bytes(fn):
    from labkit.workbench.errors import UsageError

    """(2**60,) float32 gave the allocator's own error, naming the request only by its bytes."""
    with pytest.raises(
        UsageError, match=r"shapes: the pieces need 4611686018427387904 bytes .* could not be allocated"
    ):
        fn([(2**60,)], torch.float32, "cpu")
