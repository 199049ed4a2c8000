"""What this machine has: GPUs, their properties, and which pairs can reach each other.

Everything here is read once and cached (``snapshot()``); gates, the doctor and the results
stamp all use the same snapshot. ``Hardware`` is a plain dataclass so tests can build fake
machines (``Hardware.fake(gpus=2, ...)``) and check the gates against them.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
import subprocess

import torch


@dataclasses.dataclass(frozen=True)
class GPU:
    index: int
    name: str
    capability: tuple[int, int]
    memory_gib: float
    multiprocessors: int
    l2_mb: float = 0.0  # L2 cache, MB (10**6 bytes), from the device properties (L2_cache_size)


@dataclasses.dataclass(frozen=True)
class Hardware:
    gpus: tuple[GPU, ...]
    #: peer[i][j] is True when GPU i can map GPU j's memory (cudaDeviceCanAccessPeer).
    peer: tuple[tuple[bool, ...], ...]

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def all_peers(self, n: int | None = None) -> bool:
        """True when every pair among the first n GPUs (default all) has peer access both ways."""
        n = self.gpu_count if n is None else n
        return all(self.peer[i][j] for i in range(n) for j in range(n) if i != j)

    @classmethod
    def fake(
        cls,
        gpus: int = 0,
        name: str = "NVIDIA H200",
        capability=(9, 0),
        memory_gib: float = 140.0,
        peer: bool = True,
        l2_mb: float = 52.4,
    ) -> Hardware:
        """A made-up machine, for tests of code that decides from hardware."""
        g = tuple(GPU(i, name, tuple(capability), memory_gib, 132, l2_mb) for i in range(gpus))
        p = tuple(tuple(peer and i != j for j in range(gpus)) for i in range(gpus))
        return cls(g, p)


#: HBM bandwidth from NVIDIA's datasheets, TB/s, by the name the device reports. A ceiling to
#: draw on plots, labelled as a datasheet figure: never a measurement. (H100 SXM5 80GB: 3.35 TB/s,
#: H100 datasheet; H200 SXM 141GB: 4.8 TB/s, H200 datasheet.)
DATASHEET_HBM_TBPS = {"NVIDIA H100 80GB HBM3": 3.35, "NVIDIA H200": 4.8}


#: NVIDIA datasheets, dense tensor-core TFLOP/s by the name the device reports. The H100 SXM5 80GB
#: and H200 SXM 141GB datasheets list FP8 3,958 and BF16 1,979 TFLOPS "with sparsity"; dense is half
#: (1,978.9 and 989.4). Other variants (PCIe, NVL) run at lower clocks and power and are not listed:
#: no ceiling is drawn for them. Ceilings to draw, labelled as datasheet figures, never measurements.
DATASHEET_DENSE_TFLOPS = {
    "NVIDIA H100 80GB HBM3": {"bf16": 989.4, "fp8": 1978.9},
    "NVIDIA H200": {"bf16": 989.4, "fp8": 1978.9},
}


def datasheet_dense_tflops(gpu_name: str | None, dtype: str) -> float | None:
    """The datasheet dense tensor-core TFLOP/s of a GPU ("bf16" or "fp8"), or None if not listed."""
    return DATASHEET_DENSE_TFLOPS.get(gpu_name or "", {}).get(dtype)


def datasheet_hbm_tbps(gpu_name: str) -> float | None:
    """The datasheet HBM bandwidth of a GPU by its reported name, or None when not listed."""
    return DATASHEET_HBM_TBPS.get(gpu_name)


@functools.lru_cache(maxsize=1)
def snapshot() -> Hardware:
    """This machine's GPUs and peer matrix (cached; no CUDA context is created for the matrix)."""
    if not torch.cuda.is_available():
        return Hardware((), ())
    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append(
            GPU(
                i,
                p.name,
                (p.major, p.minor),
                round(p.total_memory / 2**30, 1),
                p.multi_processor_count,
                round(getattr(p, "L2_cache_size", 0) / 1e6, 1),
            )
        )
    n = len(gpus)
    peer = tuple(tuple(i != j and torch.cuda.can_device_access_peer(i, j) for j in range(n)) for i in range(n))
    return Hardware(tuple(gpus), peer)


def machine_tag(hw: Hardware | None = None) -> str:
    """Short name for the machine, used as the folder of its reference results.

    ``NVIDIA H200`` x2 -> ``h200x2``; ``NVIDIA H100 80GB HBM3`` x1 -> ``h100x1``; no GPU -> ``cpu``.
    Mixed GPUs are named after the first one, with the count of all.
    """
    hw = snapshot() if hw is None else hw
    if not hw.gpus:
        return "cpu"
    words = [w for w in re.split(r"[\s_-]+", hw.gpus[0].name.lower()) if w not in ("nvidia", "tesla", "geforce", "")]
    # The model word (h200, a100, ...); for names like "RTX PRO 6000 ..." the words up to the
    # first number ("rtxpro6000"). Memory sizes and packaging words are dropped.
    model = next((w for w in words if re.fullmatch(r"[a-z]+\d+[a-z]*", w)), None)
    if model is None:
        upto = next((i for i, w in enumerate(words) if any(ch.isdigit() for ch in w)), len(words) - 1)
        model = "".join(words[: upto + 1]) or "gpu"
    return f"{model}x{hw.gpu_count}"


def nvlink_topology() -> str | None:
    """``nvidia-smi topo -m`` as text, or None where nvidia-smi is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout).strip()  # nvidia-smi underlines its header
