"""Lab 04's exercises, registered with :mod:`labkit.workbench.exercises`; solutions in ``solutions/``.

* ``04.nosync`` (fix) and ``04.starts`` (write) run the learner's function on counts wrapped in
  :class:`~labkit.labs.grouped_gemm.host_reads.CountedSplits`, which counts every host read (on a
  GPU, a sync), and compare its result with a float64 (or integer) reference. On a GPU the
  check also runs ``labkit.check.no_host_sync`` (sync-debug mode "error").
* ``04.full`` (predict) is judged by the staging model of section 6 (``staging.overflow_scenario``),
  whose outcome is fixed by the code.
"""

from __future__ import annotations

import torch

from labkit.labs.grouped_gemm import host_reads, staging
from labkit.workbench import tier
from labkit.workbench.exercises import Wrong, exercise

#: the cases the checks run: counts with an empty expert and sizes that are not tile multiples
SPLITS = ([5, 0, 9, 3], [0, 7, 1], [12])


def _sync_free_on_gpu(fn, *args) -> str:
    """On a GPU, ``labkit.check.no_host_sync`` (sync-debug "error" after a warm-up call); '' elsewhere."""
    if tier.interpreted() or not torch.cuda.is_available():
        return ""
    from labkit.check import no_host_sync

    r = no_host_sync(fn, lambda device: (args, {}))
    if not r.ok:
        raise Wrong(f"on this GPU, labkit.check.no_host_sync says: {r.outcome}: {r.message[:160]}.")
    return " On this GPU labkit.check.no_host_sync also passes (sync-debug 'error', no sync)."


def _reads_line(reads: list[str]) -> str:
    shown = "; ".join(reads[:3]) + (f"; ... ({len(reads)} in all)" if len(reads) > 3 else "")
    return f"the host read the counts {len(reads)} time(s) ({shown})"


@exercise(
    "04.nosync",
    kind="fix",
    question="Make the experts' forward compute x[rows of e] @ w[e] for every expert without reading "
    "m_splits on the host",
    answer="experts_forward",
    hint="Every host read of a GPU tensor (.tolist(), .item(), int(), iterating, slicing by a count) waits "
    "for the GPU. Section 2's kernel reads the counts itself, on the device.",
)
def judge_nosync(experts_forward) -> str:
    if not callable(experts_forward):
        raise Wrong(f"`experts_forward` must be a function (x, w, m_splits) -> out; got {experts_forward!r:.60}.")
    dev = tier.kernel_device()
    g = torch.Generator().manual_seed(4)
    for splits in SPLITS:
        M, E, K, N = sum(splits), len(splits), 24, 17
        x, w = torch.randn(M, K, generator=g), torch.randn(E, K, N, generator=g)
        counts = torch.tensor(splits)
        counted = host_reads.CountedSplits.wrap(counts.to(dev))
        out = experts_forward(x.to(dev), w.to(dev), counted)
        reads = list(host_reads.CountedSplits.reads)
        if reads:
            raise Wrong(f"with counts {splits}, {_reads_line(reads)}: on a GPU each is a sync.")
        starts = [sum(splits[:e]) for e in range(E)]
        ref = torch.cat([x[a : a + n].double() @ w[e].double() for e, (a, n) in enumerate(zip(starts, splits))])
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N):
            raise Wrong(f"with counts {splits}, expected an output of shape {(M, N)}; got {out!r:.80}.")
        err = ((out.detach().double().cpu() - ref).abs().max() / ref.abs().max()).item()
        if not err < 1e-4:
            raise Wrong(f"with counts {splits}, no host read, but the output is wrong: max relative error {err:.1e}.")
    x, w = torch.randn(20, 24, device=dev), torch.randn(3, 24, 17, device=dev)
    gpu = _sync_free_on_gpu(experts_forward, x, w, torch.tensor([9, 0, 11], device=dev))
    return f"no host read of the counts in {len(SPLITS)} cases (an empty expert among them), outputs correct.{gpu}"


@exercise(
    "04.starts",
    kind="write",
    question="Write row_starts(m_splits): each expert's first row, computed on the counts' device, "
    "without reading them on the host",
    answer="row_starts",
    hint="An expert's first row is the sum of the counts before it. torch has a running sum that runs "
    "where its input is; the first expert starts at row 0.",
)
def judge_starts(row_starts) -> str:
    if not callable(row_starts):
        raise Wrong(f"`row_starts` must be a function m_splits -> tensor; got {row_starts!r:.60}.")
    dev = tier.kernel_device()
    for splits in SPLITS:
        counted = host_reads.CountedSplits.wrap(torch.tensor(splits, device=dev))
        got = row_starts(counted)
        reads = list(host_reads.CountedSplits.reads)
        if reads:
            raise Wrong(f"with counts {splits}, {_reads_line(reads)}: on a GPU each is a sync.")
        want = [sum(splits[:e]) for e in range(len(splits))]
        if not isinstance(got, torch.Tensor):
            raise Wrong(f"with counts {splits}, expected a tensor on the counts' device; got {type(got).__name__}.")
        got = got.as_subclass(torch.Tensor)
        if got.is_floating_point() or got.is_complex():
            raise Wrong(f"with counts {splits}, expected integer row numbers; got dtype {got.dtype}.")
        if got.device != counted.device:
            raise Wrong(f"with counts {splits}, the result is on {got.device}, the counts on {counted.device}.")
        if got.shape != (len(splits),) or got.tolist() != want:
            raise Wrong(f"with counts {splits}, expected starts {want}; got {got.tolist()}.")
    gpu = _sync_free_on_gpu(row_starts, torch.tensor([9, 0, 11], device=dev))
    return f"correct starts for {len(SPLITS)} splits (an empty expert among them), no host read.{gpu}"


#: the scenario of 04.full: one operator, 4 grouped GEMMs a call (8 words), 16 calls, 64 words:
#: the overflow scenario of section 6's figure (staging.overflow_scenario's defaults)
FULL = {"capacity": 64, "num_gemms": 4, "calls": 16}


@exercise(
    "04.full",
    kind="predict",
    question="A 64-word staging buffer, one operator of 4 GEMMs (2 words each) called 16 times: how many "
    "calls does each design stage before it refuses one?",
    answer="calls_staged",
    hint="Count the words one call takes, and ask of each design whether its index ever comes back to 0. "
    "Never full is not the same as safe: that is section 6's other half.",
)
def judge_full(calls_staged) -> str:
    designs = ("global_index", "resetting", "owned")
    if not isinstance(calls_staged, dict) or set(calls_staged) != set(designs):
        raise Wrong(f"`calls_staged` must be a dict with the keys {list(designs)}; got {calls_staged!r:.80}.")
    if any(v is Ellipsis for v in calls_staged.values()):
        raise Wrong("some predictions are still `...`.")
    model = {d: staging.overflow_scenario(d, **FULL)["succeeded_calls"] for d in designs}
    wrong = {d: (calls_staged[d], model[d]) for d in designs if calls_staged[d] != model[d]}
    if wrong:
        said = ", ".join(f"{d}: you said {got!r}" for d, (got, _) in wrong.items())
        raise Wrong(f"{len(wrong)} of 3 predictions differ from the staging model ({said}).")
    return "the staging model agrees: " + ", ".join(f"{d} stages {model[d]} of {FULL['calls']}" for d in designs) + "."
