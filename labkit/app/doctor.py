"""``labkit doctor``: what this machine is and what each lab can do on it.

Reports versions (torch, triton, CUDA, NCCL, accelerate, ...), the execution tier, every GPU
(name, compute capability, memory, multiprocessors, L2 size), the peer-access matrix, the NVLink
topology where ``nvidia-smi`` exists, whether symmetric memory and multicast-off are in place,
and for each lab whether it runs fully, partly (which parts are skipped, and why) or is planned.
"""

from __future__ import annotations

import json
import os

from labkit.app import catalogue
from labkit.workbench import env, hardware, interpreter


def symmetric_memory_status() -> str:
    try:
        import torch.distributed._symmetric_memory as symm  # noqa: F401
    except Exception as e:
        return f"not importable ({type(e).__name__})"
    return "importable (torch.distributed._symmetric_memory)"


def collect() -> dict:
    """The doctor's report as a JSON-ready dict."""
    hw = hardware.snapshot()
    st = env.stamp(command="labkit doctor")
    return {
        "machine": st["machine"],
        "hostname": st["hostname"],
        "tier": st["tier"],
        "interpreter": st["interpreter"],
        "interpreter_problem": interpreter.problem(),
        "versions": st["versions"],
        "gpu_count": hw.gpu_count,
        "gpus": st["gpus"],
        "peer_access": [list(row) for row in hw.peer],
        "nvlink_topology": hardware.nvlink_topology(),
        "symmetric_memory": symmetric_memory_status(),
        "multicast_env": {
            k: os.environ.get(k)
            for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
        },
        "labs": [catalogue.capability(lab, hw) for lab in catalogue.LABS],
        "created": st["created"],
        "git_commit": st["git_commit"],
    }


#: Fields every doctor record carries (``labkit bench doctor --reference`` writes one record).
REQUIRED = ("machine", "gpu_count", "gpus", "peer_access", "versions", "labs")


def benchmark(profile: str) -> list[dict]:
    """The doctor's report as a one-record results file: the machine behind other references."""
    return [collect()]


def format_text(rep: dict) -> str:
    v = rep["versions"]
    lines = [
        f"labkit doctor: {rep['machine']} ({rep['hostname']}), tier: {rep['tier']}",
        "versions: "
        + ", ".join(
            f"{k} {v[k]}"
            for k in ("python", "torch", "triton", "cuda", "nccl", "accelerate", "papermill", "ipywidgets")
        ),
        f"GPUs: {rep['gpu_count']}",
    ]
    if rep.get("interpreter"):  # reports made before the check lack interpreter_problem
        lines.append("interpreter: " + (rep.get("interpreter_problem") or "runs labkit's grid-stride kernels"))
    for i, g in enumerate(rep["gpus"]):
        cap = ".".join(map(str, g["capability"]))
        l2 = f", {g['l2_mb']:g} MB L2" if g.get("l2_mb") else ""  # reports made before l2_mb lack it
        lines.append(f"  [{i}] {g['name']}, capability {cap}, {g['memory_gib']} GiB, {g['multiprocessors']} SMs{l2}")
    if rep["gpu_count"] > 1:
        lines.append("peer access (row can reach column):")
        n = rep["gpu_count"]
        lines.append("      " + " ".join(f"{j:>3}" for j in range(n)))
        for i, row in enumerate(rep["peer_access"]):
            lines.append(
                f"  {i:>3} " + " ".join("  -" if i == j else ("yes" if ok else " no") for j, ok in enumerate(row))
            )
    if rep["nvlink_topology"]:
        lines.append("nvidia-smi topo -m:")
        lines += ["  " + line for line in rep["nvlink_topology"].splitlines()]
    lines.append(f"symmetric memory: {rep['symmetric_memory']}")
    lines.append("multicast off: " + ", ".join(f"{k}={val}" for k, val in rep["multicast_env"].items()))
    lines.append("labs:")
    for cap in rep["labs"]:
        lines.append(f"  {cap['lab']:<18} {cap['can']:<8} {cap['detail']}")
    return "\n".join(lines)


def to_json(rep: dict) -> str:
    return json.dumps(rep, indent=1)


def widget(render_now: bool = True):
    """The report as an ipywidgets panel with a button that checks again (cache cleared).

    render_now=False leaves the panel empty until the button is pressed, for notebooks that
    print the text report already (a widget shows nothing in a notebook executed by papermill).
    """
    import html

    import ipywidgets as w

    out = w.HTML()
    button = w.Button(description="Check again", icon="refresh")

    def render(_=None):
        hardware.snapshot.cache_clear()
        out.value = f"<pre style='font-size:12px'>{html.escape(format_text(collect()))}</pre>"

    button.on_click(render)
    if render_now:
        render()
    return w.VBox([button, out])
