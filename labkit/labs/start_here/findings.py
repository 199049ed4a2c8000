"""Lab 00's findings rendered from the reference files (``labkit report``)."""

from __future__ import annotations


def recorded_l2(reference) -> str:
    """The L2 size each recorded GPU model reported (``labkit bench doctor``: ``gpus[].l2_mb``), for
    notebook 00's copy section: on the CPU tier the doctor's own report has no GPU to read it from."""
    seen: dict[str, tuple[float, str]] = {}
    for path in sorted(reference.root.glob("*/doctor.json")):
        name = f"{path.parent.name}/doctor.json"
        for rec in reference.file(name).records:
            for gpu in rec.get("gpus") or []:
                if gpu.get("l2_mb") is not None and gpu["name"] not in seen:
                    seen[gpu["name"]] = (gpu["l2_mb"], name)
    if not seen:
        return "no recorded doctor report holds an L2 size (`reference/<machine>/doctor.json`, `gpus[].l2_mb`)."
    parts = [
        f"{gpu.replace('NVIDIA ', '')}: {mb:g} MB (`reference/{name}`)" for gpu, (mb, name) in sorted(seen.items())
    ]
    return "; ".join(parts) + ", field `gpus[].l2_mb`."
