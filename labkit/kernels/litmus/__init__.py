"""Litmus tests of the GPU memory model: the tests as data, what each model allows, one Triton
kernel that runs any of them many times per launch, and the statistics of what came out.

* ``catalogue``: MP, SB, LB, CoRR, IRIW, 2+2W, RWC (threads, accesses, the weak outcome);
* ``model``: outcomes under sequential consistency and a simplified scoped relaxed model,
  per semantics x scope x placement, and where PTX itself differs (with sources);
* ``kernels``: ``litmus_kernel`` (plain / volatile on every tier, inline PTX on a GPU);
* ``run``: ``run_litmus`` (one launch, outcome counts), ``run_two_gpus`` (several tests, one start
  of the two ranks), ``allocate``, ``Stress``;
* ``classify``: histograms, the weak rate with an exact (Clopper-Pearson) bound.

    from labkit.kernels.litmus import run_litmus
    print(run_litmus("MP", "plain", None, "cross_cta", instances=256).classify().summary())
"""

from labkit.kernels.litmus.catalogue import TESTS, get_test

# (the function classify stays in its module: re-exported here it would hide the module itself)
from labkit.kernels.litmus.classify import Classified, histogram, lower_bound, upper_bound
from labkit.kernels.litmus.model import PLACEMENTS, SCOPES, SEMANTICS, outcomes, possible, ptx_verdict, verdict
from labkit.kernels.litmus.run import LitmusBuffers, LitmusRun, Stress, allocate, run_litmus, run_two_gpus

__all__ = [
    "TESTS",
    "get_test",
    "SEMANTICS",
    "SCOPES",
    "PLACEMENTS",
    "outcomes",
    "possible",
    "verdict",
    "ptx_verdict",
    "run_litmus",
    "run_two_gpus",
    "allocate",
    "Stress",
    "LitmusRun",
    "LitmusBuffers",
    "Classified",
    "histogram",
    "upper_bound",
    "lower_bound",
]
