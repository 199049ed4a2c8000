"""Symmetric memory: one buffer per rank, every rank able to load and store every other rank's.

On GPUs the buffers come from PyTorch (``torch.distributed._symmetric_memory``: ``empty`` then
``rendezvous``), which maps each peer's allocation into this process over NVLink. On the CPU
tier the same handle is emulated: ranks are processes (``labkit.kernels.comm.ranks``) and each rank's
buffer is a file-backed shared mapping (``mmap`` of a file in a folder the ranks share, as a tensor
by ``torch.frombuffer``) that every rank maps, so the Triton interpreter's loads, stores and
atomics really cross processes. The files have random names agreed by the ranks, are created
exclusively and never through a symlink, and are removed as soon as every rank has mapped them
(``_file_alloc``). Either way a
kernel sees the same thing: a table of W pointers to the data (``data_ptrs``) and a table of W
pointers to int32 signal pads (``pad_ptrs``), both on the kernel's device.

The signal pads are labkit's own (a second symmetric int32 buffer per allocation, zeroed once):
``CHANNELS`` x ``max_blocks`` x W slots, slot (channel, block, src) of rank r's pad is where
rank src signals block ``block`` of rank r. Every labkit protocol leaves its slots at zero again
(a receiver consumes a signal by resetting it), so a buffer can be reused, and replayed inside a
CUDA graph, without clearing anything.

``empty`` is collective: every rank calls it in the same order with the same shape and dtype
(checked; a mismatch is an error naming the ranks), exactly as with PyTorch's rendezvous.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import mmap
import os
import secrets
import stat
import warnings

import torch
import torch.distributed as dist

from labkit.workbench import tier
from labkit.workbench.errors import UsageError

#: signal-pad channels: 0 block barriers, 1 tree "partial sum ready" (up), 2 tree "result ready" (down)
CHANNELS = 3
DEFAULT_MAX_BLOCKS = 256  # at least one program per SM on every current GPU (H100/H200: 132)
DTYPES = (torch.float32, torch.bfloat16)
#: pointer alignment every buffer must have: what 16-byte vector loads need
ALIGNMENT = 16
#: shards of a workspace start at multiples of this many elements (128 or 256 bytes)
WORKSPACE_UNIT = 64


@dataclasses.dataclass(eq=False)
class SymmBuffer:
    """This rank's view of one symmetric allocation."""

    tensor: torch.Tensor  # this rank's buffer (what the caller reads and writes)
    peers: list[torch.Tensor]  # every rank's buffer, mapped in this process (peers[rank] is tensor)
    data_ptrs: torch.Tensor  # int64 [W] on the device: peers[r].data_ptr()
    pads: list[torch.Tensor]  # every rank's signal pad (int32 [CHANNELS, max_blocks, W])
    pad_ptrs: torch.Tensor  # int64 [W] on the device: pads[r].data_ptr()
    rank: int
    world_size: int
    max_blocks: int  # programs a kernel on this buffer may use (signal-pad rows)
    emulated: bool  # True on the CPU tier (file-backed shared memory)
    _keep: tuple = ()  # handles that must live as long as the buffer
    #: a second symmetric allocation (``empty(..., workspace=True)``) where peers deposit
    #: shards for this rank: W slots of ``workspace_shard`` elements (``two_shot_ce``)
    workspace: SymmBuffer | None = None
    #: a flag-in-data inbox (``labkit.kernels.comm.flag_in_data.attach``) through which
    #: ``collectives.all_reduce`` may run that protocol; None: the buffer has none
    inbox: object | None = None
    #: this process's count of ``empty`` calls when it made the buffer: the same number names the
    #: same allocation on every rank, since ``empty`` is collective
    serial: int = 0
    #: launch plans of the collectives called on this buffer (``labkit.kernels.comm.plan``):
    #: kept on the buffer so that they live and die with it, never serving another allocation
    _plans: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    #: the launches of ``into.all_reduce_into`` from this buffer, per output buffer (weakly held)
    _into: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    #: what the ranks have agreed to launch on this buffer (``labkit.kernels.comm.plan.agree``)
    _agreed: set = dataclasses.field(default_factory=set, init=False, repr=False)

    def __post_init__(self):
        # where the allocation is: the pointer tables were made from it, and the kernels read
        # through them, whatever ``tensor`` says later (``check_buffer`` compares)
        self._ptr, self._shape = self.tensor.data_ptr(), self.tensor.shape

    @property
    def numel(self) -> int:
        return self.tensor.numel()

    @property
    def workspace_shard(self) -> int:
        """Elements per workspace slot: numel / W rounded up to ``WORKSPACE_UNIT`` (so that every
        slot and every shard starts 16-byte aligned, for vector loads)."""
        per_rank = -(-self.numel // self.world_size)  # ceil
        return -(-per_rank // WORKSPACE_UNIT) * WORKSPACE_UNIT

    @property
    def local_pad(self) -> torch.Tensor:
        return self.pads[self.rank]

    def pads_are_zero(self) -> bool:
        """True when every slot of this rank's pad is 0: nothing signalled and not consumed."""
        return int(torch.count_nonzero(self.local_pad)) == 0


def _world() -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        raise UsageError(
            "symmetric memory needs an initialised process group: run inside "
            "labkit.kernels.comm.ranks.run_ranks (or torchrun with init_process_group)"
        )
    return dist.get_rank(), dist.get_world_size()


def gather(mine) -> list:
    """Every rank's ``mine`` (a small picklable object), in rank order, on every rank: one
    ``all_gather_object`` over the default process group (gloo on the emulated world, NCCL on
    GPUs). Collective: every rank calls it, or the callers wait for the others (until the process
    group's timeout)."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def agree(what: str, mine: dict, contract: str) -> None:
    """Every rank's ``mine`` (name -> a comparable value) exchanged (``gather``, collective); when
    they differ, the same UsageError on every rank, starting with ``what``, naming each name that
    differs with every rank's value, then ``contract``. Names whose key starts with "=" are
    derived (what the arguments resolved to): reported only when no other name differs."""
    everyone = gather(mine)
    differ = [k for k in mine if any(o.get(k) != mine[k] for o in everyone)]
    if not differ:
        return
    given = [k for k in differ if not k.startswith("=")]
    listing = "; ".join(
        f"{k.lstrip('=')} ({', '.join(f'rank {r}: {o.get(k)}' for r, o in enumerate(everyone))})"
        for k in (given or differ)
    )
    raise UsageError(f"{what}: the ranks disagree on {listing}; {contract}")


def _check_same_everywhere(shape: tuple, dtype: torch.dtype, max_blocks: int, world: int) -> str:
    """Every rank asks for the same allocation (else the same ValueError on every rank); returns
    rank 0's random token, which names the allocation's scratch files on the CPU tier (made on
    every rank, taken from rank 0, in the same exchange)."""
    mine = (tuple(shape), str(dtype).replace("torch.", ""), max_blocks)
    everyone = gather((mine, secrets.token_hex(16)))
    asked = [o[0] for o in everyone]
    if any(o != asked[0] for o in asked):
        listing = ", ".join(f"rank {r}: shape {o[0]} {o[1]} max_blocks {o[2]}" for r, o in enumerate(asked))
        raise ValueError(
            f"symmetric allocation differs across ranks ({listing}); every rank must ask "
            "for the same shape, dtype and max_blocks"
        )
    return everyone[0][1]


_sequence = 0  # allocations made by this process: the same on every rank, since empty() is collective


def empty(
    shape,
    dtype: torch.dtype = torch.float32,
    *,
    device=None,
    max_blocks: int = DEFAULT_MAX_BLOCKS,
    scratch_dir: str | None = None,
    workspace: bool = False,
) -> SymmBuffer:
    """Allocate a symmetric buffer of ``shape`` on every rank (collective).

    device:      this rank's device (default: cuda:<current> on GPUs, cpu otherwise)
    max_blocks:  how many programs a kernel on this buffer may run (sizes the signal pads)
    workspace:   also allocate ``SymmBuffer.workspace`` (about as large again): what the
                 in-place ``two_shot_ce`` all-reduce needs
    scratch_dir: CPU emulation only: a folder all ranks share and may write
                 (``RankContext.scratch_dir``; default $LABKIT_SYMM_DIR). Each allocation puts two
                 files per rank there, named with a random token the ranks agree on, created
                 exclusively (O_EXCL, O_NOFOLLOW: an existing name or a symlink is an error on
                 every rank, never written through) and removed once every rank has mapped them:
                 nothing stays behind, and nothing else in the folder is read or written.

    Checked: each argument's type and range, on its own rank first (a rank that raises there
    leaves its peers waiting in the exchange until the world's timeout); then, on every rank at
    once (one exchange, the same error everywhere), that every rank asks for the same shape, dtype
    and max_blocks, and on the CPU tier that every rank could create and map the files.
    """
    global _sequence
    rank, world = _world()
    if world < 2:
        raise ValueError(f"world size {world}: symmetric-memory collectives need at least 2 ranks")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if dtype not in DTYPES:
        raise TypeError(f"dtype: {dtype} is not supported; expected one of {[str(d) for d in DTYPES]}")
    if not shape or math.prod(shape) <= 0:
        raise ValueError(f"shape: {shape} has no elements")
    if not isinstance(max_blocks, int) or max_blocks < 1:
        raise ValueError(f"max_blocks: expected a positive int, got {max_blocks!r}")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    token = _check_same_everywhere(shape, dtype, max_blocks, world)
    if device.type == "cpu" and not tier.interpreted():
        # A compiled kernel given a CPU pointer fails at launch ("Pointer argument cannot be
        # accessed from Triton"): refuse here, naming the argument, before any rank allocates.
        raise ValueError(
            f"device={device}: CPU symmetric buffers belong to the emulated world, whose kernels "
            f"run under the Triton interpreter (TRITON_INTERPRET=1); on the GPU tier each rank needs "
            f"a CUDA GPU of its own (a world of {world} ranks: {world} GPUs)"
        )
    pad_shape = (CHANNELS, max_blocks, world)
    _sequence += 1
    if device.type == "cuda":
        peers, pads, keep = _cuda_alloc(shape, dtype, pad_shape, device, rank, world)
        emulated = False
    else:
        folder = scratch_dir or os.environ.get("LABKIT_SYMM_DIR")
        if not folder:
            raise UsageError(
                "scratch_dir: the CPU emulation needs a folder every rank shares "
                "(RankContext.scratch_dir, or $LABKIT_SYMM_DIR)"
            )
        peers, pads = _file_alloc(shape, dtype, pad_shape, folder, rank, world, f"{token}-{_sequence}")
        keep, emulated = (), True
    for r, (p, q) in enumerate(zip(peers, pads)):
        if p.data_ptr() % ALIGNMENT or q.data_ptr() % ALIGNMENT:
            raise RuntimeError(f"rank {r}'s symmetric buffer is not {ALIGNMENT}-byte aligned")
    data_ptrs = torch.tensor([p.data_ptr() for p in peers], dtype=torch.int64, device=device)
    pad_ptrs = torch.tensor([q.data_ptr() for q in pads], dtype=torch.int64, device=device)
    buf = SymmBuffer(
        peers[rank], peers, data_ptrs, pads, pad_ptrs, rank, world, max_blocks, emulated, keep, serial=_sequence
    )
    if workspace:
        buf.workspace = empty(world * buf.workspace_shard, dtype, device=device, max_blocks=1, scratch_dir=scratch_dir)
    return buf


def _file_alloc(shape, dtype, pad_shape, folder, rank, world, name):
    """CPU emulation: rank r creates its two files, everyone maps everyone's, then each rank removes
    its own (the mappings keep the memory; it goes with the last of them).

    The files are ``labkit-symm-<name>-{data,pad}-rank<r>`` in ``folder``, ``name`` holding a random
    token the ranks agreed on: nothing else in the folder is opened, a crashed run's files
    included. Created with O_CREAT | O_EXCL | O_NOFOLLOW (a name already there, a symlink
    included, is an error rather than a file written through) and mode 0600; a peer's file is
    opened with O_NOFOLLOW and must be a regular file of this user with the expected size. A new
    file reads as zeros: the pads start cleared, as the protocol needs. Every failure is exchanged
    before anyone goes on, so that all ranks raise (a UsageError naming scratch_dir) instead of
    one raising while the others wait for it."""
    numel, pad_numel = math.prod(shape), math.prod(pad_shape)
    sizes = {"data": (numel, dtype), "pad": (pad_numel, torch.int32)}

    def path(kind, r):
        return os.path.join(folder, f"labkit-symm-{name}-{kind}-rank{r}")

    def nbytes(kind):
        n, dt = sizes[kind]
        return n * dt.itemsize

    def fail(step, errors):
        listing = "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e)
        raise UsageError(
            f"scratch_dir: {step} the emulated symmetric buffer's files in {folder} failed ({listing}); "
            "scratch_dir must be a folder every rank shares and may write (a name already there is "
            "left alone: allocating again takes new random names)"
        )

    mine, error = {}, None
    try:
        for kind in sizes:
            fd = os.open(path(kind, rank), os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, nbytes(kind))
                mine[kind] = _map(fd, nbytes(kind))
            finally:
                os.close(fd)
    except OSError as e:
        error = f"{e.filename}: {e.strerror}"
    try:
        errors = gather(error)
        if any(errors):
            fail("creating", errors)
        maps, error = {}, None
        try:
            for kind in sizes:
                for r in range(world):
                    maps[kind, r] = mine[kind] if r == rank else _open_peer(path(kind, r), nbytes(kind))
        except OSError as e:
            error = f"{e.filename}: {e.strerror}"
        errors = gather(error)
        if any(errors):
            fail("mapping", errors)
    finally:
        for kind in mine:  # every rank has mapped this rank's files, or failed: remove them
            with contextlib.suppress(OSError):
                os.unlink(path(kind, rank))
    peers = [_tensor(maps["data", r], numel, dtype).view(shape) for r in range(world)]
    pads = [_tensor(maps["pad", r], pad_numel, torch.int32).view(pad_shape) for r in range(world)]
    return peers, pads


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _map(fd: int, size: int) -> mmap.mmap:
    """A shared, writable mapping of ``size`` bytes of the open file ``fd``."""
    return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def _open_peer(path: str, size: int) -> mmap.mmap:
    """Map a peer's file, refusing a symlink, or anything but a regular file of this user of
    ``size`` bytes (raised as OSError, with the path)."""
    fd = os.open(path, os.O_RDWR | _NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size != size:
            raise OSError(
                errno.EINVAL,
                f"not a regular file of this user of {size} bytes (mode {st.st_mode:o}, uid {st.st_uid}, "
                f"{st.st_size} bytes)",
                path,
            )
        return _map(fd, size)
    finally:
        os.close(fd)


def _tensor(m: mmap.mmap, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The mapping as a tensor, which keeps it alive (``torch.frombuffer`` holds the buffer)."""
    return torch.frombuffer(m, dtype=dtype, count=numel)


def _cuda_alloc(shape, dtype, pad_shape, device, rank, world):
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD
    if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before torch 2.9, deprecated after
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group.group_name)
    out = []
    for shp, dt in ((shape, dtype), (pad_shape, torch.int32)):
        local = symm_mem.empty(shp, dtype=dt, device=device)
        if dt == torch.int32:
            local.zero_()
        handle = symm_mem.rendezvous(local, group.group_name)
        # the tensor may sit at an offset inside the allocation: the same offset on every rank
        offset = local.data_ptr() - handle.buffer_ptrs[rank]
        peers = [local if r == rank else handle.get_buffer(r, shp, dt, offset // dt.itemsize) for r in range(world)]
        out.append((peers, handle))
    torch.cuda.synchronize(device)
    dist.barrier()  # every pad is zero before anyone signals
    (peers, h1), (pads, h2) = out
    return peers, pads, (h1, h2)


def check_buffer(name: str, buf) -> SymmBuffer:
    """The error for a tensor that is not in symmetric memory (the most common misuse), or for a
    buffer whose ``tensor`` no longer is the memory it was allocated with."""
    if isinstance(buf, SymmBuffer):
        x = buf.tensor
        if x.data_ptr() != buf._ptr or x.shape != buf._shape:
            raise UsageError(
                f"{name}: buf.tensor is no longer the symmetric allocation (it was at {buf._ptr:#x}, shape "
                f"{tuple(buf._shape)}; now {x.data_ptr():#x}, {tuple(x.shape)}: re-assigned, set_, "
                "resized or its storage freed); the kernels read every rank's buffer through the "
                "pointers taken at allocation, so they would not see what is in it now"
            )
        return buf
    if isinstance(buf, torch.Tensor):
        raise TypeError(
            f"{name}: a plain tensor is not in symmetric memory; allocate it with "
            "labkit.kernels.comm.symm.empty(...) on every rank and write your data into .tensor"
        )
    raise TypeError(f"{name}: expected a labkit.kernels.comm.symm.SymmBuffer, got {type(buf).__name__}")


# ---- names for buffers: what the custom ops (``labkit.kernels.ops``) take instead of a buffer ----

#: name -> SymmBuffer. A torch op takes tensors, numbers and strings, not a SymmBuffer; as
#: ``torch.ops.symm_mem`` names its process group by a string, labkit's ops name their buffer.
_REGISTRY: dict[str, SymmBuffer] = {}
_registered = 0


def register(buf: SymmBuffer, name: str | None = None) -> str:
    """Give ``buf`` a name the custom ops accept (``torch.ops.labkit.all_reduce(x, name)``);
    returns it. Default name: ``labkit_symm_<k>`` for this process's k-th registration, the same
    on every rank when every rank registers its buffers in the same order (as it allocates them).
    The registry keeps the buffer alive until ``unregister(name)``. A name already taken by
    another buffer is refused: a stale name would silently send a collective to the wrong buffer."""
    global _registered
    buf = check_buffer("buf", buf)
    if name is None:
        _registered += 1
        name = f"labkit_symm_{_registered}"
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty str, got {name!r}")
    held = _REGISTRY.get(name)
    if held is not None and held is not buf:
        raise UsageError(
            f"name: {name!r} already names another symmetric buffer; unregister({name!r}) first or choose another name"
        )
    _REGISTRY[name] = buf
    return name


def unregister(name: str) -> None:
    """Forget a name (the buffer is freed once nothing else holds it). Unknown names: no error."""
    _REGISTRY.pop(name, None)


def lookup(name: str) -> SymmBuffer:
    """The buffer registered as ``name``; UsageError naming the registered ones otherwise."""
    buf = _REGISTRY.get(name) if isinstance(name, str) else None
    if buf is None:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UsageError(
            f"handle: {name!r} names no symmetric buffer of this process (registered: {known}); "
            "call labkit.kernels.comm.symm.register(buf, name) on every rank first"
        )
    return buf
