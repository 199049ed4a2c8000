"""labkit.labs.fp8_dispatch: the story's three mechanisms, each on its own (lazy state on the current
device, one global update kernel, unguarded cast launches), the one-kernel update against the
product's per-device update bit for bit, the amax/scale checker of ``run_case`` (and that it is
not vacuous), and ``run_case`` records on the CPU tier. On two GPUs: where each mechanism puts
the state, the device-aware run equal to the one-GPU run bit for bit, and every story mode run
contained in the sandbox."""

import json
import math

import pytest
import torch

import labkit  # noqa: F401  (picks the tier before the kernels are imported)
from labkit.kernels.fp8 import DelayedScaling, DeviceAware, FP8Linear, fp8_autocast
from labkit.kernels.fp8.autocast import update_stacked
from labkit.kernels.fp8.recipe import FP8Meta
from labkit.labs.fp8_dispatch import measure, naive
from labkit.labs.fp8_dispatch import model as story
from labkit.labs.fp8_dispatch.bulk_update import bulk_update
from labkit.workbench import sandbox
from labkit.workbench.errors import UsageError

SIZE = 1 / 512  # hidden 16, kv 16, intermediate 64, tokens 32
#: where the small runs go: "cpu" under the interpreter, "one_gpu" on a GPU machine's compiled tier
HERE = story.local_placement()
HERE_DEVICE = story.PLACEMENTS[HERE][0]


def test_mechanisms_switch_one_at_a_time():
    assert naive.NAIVE.on == naive.MECHANISMS and naive.NAIVE.label == "all three"
    assert naive.DEVICE_AWARE.on == () and naive.DEVICE_AWARE.label == "none"
    for name in naive.MECHANISMS:
        assert naive.Mechanisms.only(name).on == (name,)
        assert naive.policy_for(name).mechanisms == naive.Mechanisms.only(name)
        assert naive.mechanism_label(name) == name
    assert naive.policy_for("fp8_device_aware") == "device_aware" and naive.mechanism_label("bf16") is None
    assert naive.policy_for("fp8_naive").name == "story[all three]"
    with pytest.raises(ValueError, match="name: 'lazy' is not one of 'lazy_meta_on_current_device'"):
        naive.Mechanisms.only("lazy")
    with pytest.raises(ValueError, match="mode: 'naive' is not 'fp8_device_aware', 'fp8_naive' or one of"):
        naive.policy_for("naive")
    with pytest.raises(TypeError, match="global_reduction: expected a bool"):
        naive.Mechanisms(global_reduction=1)


def test_lazy_state_lands_on_the_current_device_not_the_weights(monkeypatch):
    """(a) with a fake current device: the state appears at first use, on that device, outside the
    module's buffers, and .to() leaves it where it is (as TransformerEngine's fp8_meta dict)."""
    monkeypatch.setattr(naive, "current_device", lambda: torch.device("meta"))
    lin = FP8Linear(32, 16, recipe=DelayedScaling(amax_history_len=3))
    policy = naive.StoryPolicy(naive.Mechanisms.only("lazy_meta_on_current_device"))
    assert "_story_meta" not in lin.__dict__
    meta = policy.meta(lin, "forward")
    assert meta.device == torch.device("meta") and lin.weight.device == torch.device("cpu")
    assert meta.amax_history.shape == (3, 2) and policy.meta(lin, "backward").scale.shape == (1,)
    assert policy.meta(lin, "forward") is meta
    lin.to("cpu")
    assert policy.meta(lin, "forward").device == torch.device("meta")
    assert {b.device for b in lin.buffers()} == {torch.device("cpu")}
    # the product's policy keeps it on the weight's device
    assert DeviceAware().meta(lin, "forward").device == torch.device("cpu")


def test_lazy_state_is_used_instead_of_the_buffers():
    lin = FP8Linear(32, 16, dtype=torch.bfloat16, device=HERE_DEVICE)
    x = torch.randn(16, 32, device=HERE_DEVICE).to(torch.bfloat16)
    with fp8_autocast(mode=naive.StoryPolicy(naive.Mechanisms.only("lazy_meta_on_current_device"))):
        lin(x)
    assert lin.fp8_forward_scale.eq(1).all() and lin.fp8_forward_amax_history.eq(0).all()
    lazy = lin.__dict__["_story_meta"]["forward"]
    assert lazy.scale[0].item() == torch.tensor(448.0).div(x.float().abs().max()).item()


def _random_states(m, length, n, g):
    metas = []
    for _ in range(m):
        meta = FP8Meta.create(n, length, HERE_DEVICE)
        meta.amax_history.copy_(torch.rand(length, n, generator=g) * 100)
        meta.scale.copy_(torch.rand(n, generator=g) * 10 + 0.1)
        metas.append(meta)
    metas[0].amax_history[0, 0] = 0.0  # never ran: keep the scale
    metas[0].amax_history[:, 0] = 0.0
    metas[-1].amax_history[0, -1] = math.inf  # overflowed: keep the scale
    if length == 1 or m > 2:
        metas[1].amax_history[:, 0] = 1e-38  # tiny: the scale becomes fp32's max
    return metas


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # 448 / 1e-38 in the interpreter
@pytest.mark.parametrize(
    "length, n, algo, margin", [(16, 2, "max", 0), (3, 1, "most_recent", 1), (1, 2, "max", 2), (5, 2, "most_recent", 0)]
)
def test_one_kernel_update_equals_the_per_device_update_bit_for_bit(length, n, algo, margin):
    g = torch.Generator().manual_seed(length * 10 + n)
    kernel_states = _random_states(4, length, n, g)
    torch_states = [FP8Meta(m.scale.clone(), m.scale_inv.clone(), m.amax_history.clone()) for m in kernel_states]
    recipe = DelayedScaling(margin=margin, amax_history_len=length, amax_compute_algo=algo)
    bulk_update(torch.cat([m.amax_history[0] for m in kernel_states]), kernel_states, 448.0, margin, algo)
    update_stacked(torch_states, 448.0, recipe)
    for k, t in zip(kernel_states, torch_states):
        for a, b in ((k.amax_history, t.amax_history), (k.scale, t.scale), (k.scale_inv, t.scale_inv)):
            assert torch.equal(a, b), (a, b)


def test_every_mode_runs_on_one_device_and_agrees():
    """On one device every mechanism is harmless: same outputs, bit for bit, and sane records
    (the CPU under the interpreter, cuda:0 on a GPU machine)."""
    records = {mode: story.run_case(HERE, mode, size=SIZE, steps=2) for mode in story.MODES}
    digests = {mode: r["output_digest"] for mode, r in records.items() if mode != "bf16"}
    assert len(set(digests.values())) == 1, digests
    for mode, r in records.items():
        assert r["outcome"] == "ok", (mode, r["outcome"], r["errors"], r["mismatches"][:3])
        assert r["placement"] == HERE and r["mode"] == mode
        assert r["forward_ms"] is None if HERE == "cpu" else r["forward_ms"] > 0
        assert r["mechanism"] == naive.mechanism_label(mode)
        json.dumps(r)
    bf16, fp8 = records["bf16"], records["fp8_device_aware"]
    assert bf16["rel_err_vs_bf16"] == 0.0 and bf16["records"] == []
    assert 0 < fp8["norm_rel_err_vs_bf16"] < story.WRONG_OUTPUT and 0 < fp8["rel_err_vs_bf16"] < 0.3
    # per step: 7 modules x (input, weight, grad_output)
    assert len(fp8["records"]) == 2 * 7 * 3
    inputs = [r for r in fp8["records"] if r["tensor"] == "input"]
    assert {r["module"] for r in inputs} == {
        f"{b}.{p}_proj" for b, ps in (("attn", "qkvo"), ("mlp", ())) for p in ps
    } | {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    assert all(
        r["amax"] > 0 and r["scale"] == pytest.approx(448.0 / r["amax"], rel=1e-6) for r in inputs if r["step"] == 0
    )
    assert {(r["device"], r["weight_device"]) for r in fp8["records"]} == {(HERE_DEVICE, HERE_DEVICE)}


class _Stuck(DeviceAware):
    """A broken policy: never updates a scale."""

    name = "stuck"

    def reduce_and_update(self, entries, recipe):
        pass


def test_the_checker_catches_a_scale_that_is_not_updated():
    recipe = DelayedScaling()
    devices = story.PLACEMENTS[HERE]
    model = story.dispatch(story.build(SIZE, 0, devices, recipe), devices)
    x = story.make_input(SIZE, 0, HERE_DEVICE)
    rec = {"rel_err_per_step": [], "norm_rel_err_per_step": [], "records": [], "mismatches": []}
    with torch.no_grad():
        measure.fp8_steps(model, x, model(x), recipe, _Stuck(), 2, rec)
    assert rec["mismatches"] and {m["module"] for m in rec["mismatches"]} >= {"attn.q_proj", "mlp.down_proj"}
    assert all(m["scale"] == 1.0 and m["expected_scale"] != 1.0 for m in rec["mismatches"])


def _raise_twice():
    """The story's shape: an error in the body, a second one on the context's exit."""
    try:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    finally:
        raise RuntimeError("raised again at torch.cat")


def test_failures_become_outcomes_with_their_chain():
    try:
        _raise_twice()
    except Exception as e:
        errors = measure.errors_of(e)
    assert [err["message"] for err in errors] == [
        "raised again at torch.cat",
        "CUDA error: an illegal memory access was encountered",
    ]
    assert all(err["at"] is None for err in errors)  # raised in the test file, not in labkit
    rec = {"errors": errors, "mismatches": [], "norm_rel_err_vs_bf16": None}
    assert story._outcome(rec) == "illegal_memory_access"
    rec["errors"] = [{"type": "ValueError", "message": "Pointer argument (at 0) cannot be accessed\nmore", "at": None}]
    assert story._outcome(rec) == "exception: ValueError: Pointer argument (at 0) cannot be accessed"
    assert story._outcome({"errors": [], "mismatches": [{}], "norm_rel_err_vs_bf16": 0.1}) == "wrong_scale"
    assert story._outcome({"errors": [], "mismatches": [], "norm_rel_err_vs_bf16": 0.9}) == "wrong_output"
    assert story._outcome({"errors": [], "mismatches": [], "norm_rel_err_vs_bf16": float("nan")}) == "wrong_output"


def test_run_case_refuses_bad_arguments():
    with pytest.raises(ValueError, match="placement: 'three_gpus' is not one of"):
        story.run_case("three_gpus")
    with pytest.raises(ValueError, match="mode: 'fp16' is not one of 'bf16', 'fp8_naive'"):
        story.run_case("cpu", "fp16")
    with pytest.raises(ValueError, match="steps: expected an int >= 1"):
        story.run_case("cpu", steps=0)
    with pytest.raises(ValueError, match="size: expected a number in"):
        story.run_case("cpu", size=2.0)
    with pytest.raises(ValueError, match="amax_history_len"):
        story.run_case("cpu", recipe={"amax_history_len": 0})
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="placement: 'cuda:0' asked for a CUDA device"):
            story.run_case("two_gpus")


def test_story_shapes():
    assert story.dims(1.0) == {"hidden": 8192, "kv": 1024, "intermediate": 28672, "tokens": 12000}
    assert story.dims(1 / 256) == {"hidden": 32, "kv": 16, "intermediate": 112, "tokens": 48}


# --- two GPUs ------------------------------------------------------------------------------------


@pytest.mark.multigpu
def test_where_each_policy_puts_the_state_under_dispatch_model():
    """No kernel runs here: only where the state is made (a crash cannot happen in this process)."""
    torch.cuda.set_device(0)
    devices = story.PLACEMENTS["two_gpus"]
    model = story.dispatch(story.build(1 / 64, 0, devices), devices)
    up = model.mlp.up_proj
    assert up.weight.device == torch.device("cuda:1")
    assert {b.device for b in up.buffers()} == {torch.device("cuda:1")}  # buffers moved with it
    assert DeviceAware().meta(up, "forward").device == torch.device("cuda:1")
    lazy = naive.StoryPolicy(naive.Mechanisms.only("lazy_meta_on_current_device")).meta(up, "forward")
    assert lazy.device == torch.device("cuda:0")  # the story's placement


@pytest.mark.multigpu
def test_device_aware_two_gpus_equals_one_gpu_bit_for_bit():
    res = {
        p: sandbox.run_isolated(story.run_case, p, "fp8_device_aware", 1 / 16, 3, timeout=600)
        for p in ("one_gpu", "two_gpus")
    }
    one, two = (res[p].unwrap() for p in ("one_gpu", "two_gpus"))
    assert one["outcome"] == two["outcome"] == "ok", (one["errors"], two["errors"])
    assert one["output_digest"] == two["output_digest"]
    assert {r["device"] for r in two["records"] if r["module"].startswith("mlp.")} == {"cuda:1"}


@pytest.mark.multigpu
@pytest.mark.parametrize("mode", ["fp8_naive", *naive.MECHANISMS])
def test_story_modes_run_contained_on_two_gpus(mode):
    """What each mechanism does on two GPUs is the lab's finding, not an assertion: the test only
    requires that the sandbox reports it (the record, or the child's crash) and prints it."""
    res = sandbox.run_isolated(story.run_case, "two_gpus", mode, 1 / 16, 3, timeout=600)
    assert res.status in sandbox.STATUSES
    rec = res.value if res.ok else None
    print(
        f"{mode}: {res.summary()} -> {rec['outcome'] if rec else res.status}"
        f"{'; ' + str(rec['mismatches'][:2]) if rec and rec['mismatches'] else ''}"
    )
