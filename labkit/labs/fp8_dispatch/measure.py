"""What ``run_case`` measures on each FP8 run, independently of the code under test.

* ``fp8_steps``: runs the steps (the same input each step, or that input times a per-step factor,
  ``input_scales``, to show how delayed scaling follows a change) and checks every amax and scale
  the context recorded against a second, independent model of delayed scaling: CPU copies of each
  module's state, fed with the TRUE amaxes (``x.abs().amax()`` of each layer's real input, taken by
  a forward pre-hook: a torch op, always on the right device) and updated by the pure rules of
  ``labkit.kernels.fp8.recipe``.
  An amax folded into the wrong state, an update that wrote elsewhere, or one still running on
  another GPU's stream when the state is read back (the read syncs only the state's own device)
  shows up as a mismatch ("wrong_scale"), even when nothing raised. A cast that READ a stale
  scale is not a mismatch (the amaxes are of unscaled inputs): it shows in the output error.
* ``rel_err`` / ``norm_rel_err`` against the bf16 run of the same model, ``digest`` (bit identity
  of results across placements), ``errors_of`` (an exception chain, with where each surfaced).
"""

from __future__ import annotations

import hashlib
import traceback

import torch

from labkit.kernels.fp8 import FP8Linear, FP8Meta, fp8_autocast


def rel_err(outs, refs) -> float:
    """max |out - ref| / max |ref|, the worst over the outputs (out, k, v)."""
    return max(((o.float() - r.float()).abs().max() / r.float().abs().max()).item() for o, r in zip(outs, refs))


def norm_rel_err(outs, refs) -> float:
    """||out - ref|| / ||ref|| (Frobenius), the worst over the outputs."""
    return max(((o.float() - r.float()).norm() / r.float().norm()).item() for o, r in zip(outs, refs))


def digest(outs) -> str:
    """A short hash of the outputs' bytes: equal digests mean bit-identical results."""
    h = hashlib.sha256()
    for o in outs:
        h.update(o.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def fp8_steps(model, x, ref, recipe, policy, steps: int, rec: dict, input_scales=None):
    """``steps`` FP8 forwards, each in its own context; checks every recorded forward amax and
    scale against an independent CPU model of delayed scaling fed with the true amaxes.

    input_scales: None (step s runs ``x``, compared with ``ref``) or one factor per step (step s
    runs ``x * input_scales[s]``, compared with the bf16 forward of that input)."""
    linears = {m.fp8_name: m for m in model.modules() if isinstance(m, FP8Linear)}
    true_amax = {}
    hooks = [
        m.register_forward_pre_hook(
            lambda mod, args: true_amax.__setitem__(mod.fp8_name, args[0].detach().abs().amax().float())
        )
        for m in linears.values()
    ]
    shadow = {n: FP8Meta.create(2, recipe.amax_history_len, "cpu") for n in linears}
    w_amax = {n: m.weight.detach().abs().amax().float().item() for n, m in linears.items()}
    try:
        for step in range(steps):
            casts = {n: m.weight_casts for n, m in linears.items()}
            x_s, ref_s = x, ref
            if input_scales is not None:
                x_s = x * input_scales[step]
                ref_s = model(x_s)  # outside the FP8 context: the bf16 forward of this input
            with fp8_autocast(recipe=recipe, mode=policy, record=True) as ac:
                out = model(x_s)
            rec["rel_err_per_step"].append(rel_err(out, ref_s))
            rec["norm_rel_err_per_step"].append(norm_rel_err(out, ref_s))
            rec["records"] += [dict(r, step=step) for r in ac.records]
            for name, m in linears.items():
                sh = shadow[name]
                sh.amax_history[0, 0] = true_amax[name].item()
                sh.amax_history[0, 1] = w_amax[name] if m.weight_casts > casts[name] else 0.0
                expected_amax = sh.amax_history[0].tolist()
                sh.update_(recipe.fp8_max("forward"), recipe)
                got = [r for r in ac.records if r["module"] == name and r["direction"] == "forward"]
                for r, a, s in zip(got, expected_amax, sh.scale.tolist()):
                    if (r["amax"], r["scale"]) != (a, s):
                        rec["mismatches"].append(
                            {
                                "step": step,
                                "module": name,
                                "tensor": r["tensor"],
                                "amax": r["amax"],
                                "expected_amax": a,
                                "scale": r["scale"],
                                "expected_scale": s,
                            }
                        )
    finally:
        for h in hooks:
            h.remove()
    return out


def errors_of(e: BaseException) -> list[dict]:
    """The exception and the ones it was raised during (the story's second error, at the context's
    exit), each with the innermost labkit line it surfaced at."""
    chain = []
    while e is not None and len(chain) < 4:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "labkit" in f.filename]
        last = frames[-1] if frames else None
        at = f"{last.filename.split('labkit/')[-1]}:{last.lineno} ({last.line})" if last else None
        chain.append({"type": type(e).__name__, "message": str(e)[:500], "at": at})
        e = e.__cause__ or e.__context__
    return chain


__all__ = ["fp8_steps", "rel_err", "norm_rel_err", "digest", "errors_of"]
