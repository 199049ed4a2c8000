import json

import pytest
import torch
import torch.nn.functional as F

import labkit
from labkit.labs.grouped_gemm import moe, moe_bench, moe_graph, moe_plots, moe_timeline
from labkit.workbench.errors import UsageError
from labkit.workbench.tier import kernel_device

# Tiny sizes: every grouped GEMM runs under the Triton interpreter on the CPU tier (on the GPU
# of a GPU tier).
T, H, FFN, E, K = 24, 32, 16, 4, 2
DEV = kernel_device()


def make(sync="device", dtype=torch.float32, device=DEV, seed=0, route_bias=None):
    torch.manual_seed(seed)
    layer = moe.MoELayer(H, FFN, E, K, sync=sync, dtype=dtype, device=device)
    if route_bias is not None:
        layer.route_bias.copy_(torch.as_tensor(route_bias, dtype=torch.float32))
    x = torch.randn(T, H, dtype=dtype, device=device)
    return layer, x, torch.randn_like(x)


def reference(layer, x, grad_out):
    """Float64, one (token, expert) pair at a time, from the layer's own weights: no sort, no
    permutation, no grouped GEMM. Returns (out, grads in moe.grad_names order, expert ids)."""
    wr, wgu, wd = (
        p.detach().double().requires_grad_() for p in (layer.router.weight, layer.gate_up.weight, layer.down.weight)
    )
    x64 = x.detach().double().requires_grad_()
    probs = torch.softmax(x64 @ wr.T + layer.route_bias.double(), dim=-1)
    top_p, ids = probs.topk(layer.top_k, dim=-1)
    weights = top_p / top_p.sum(-1, keepdim=True)
    tokens = []
    for t in range(x.shape[0]):
        per_expert = []
        for j in range(layer.top_k):
            e = int(ids[t, j])
            h = x64[t] @ wgu[e]
            per_expert.append(weights[t, j] * ((F.silu(h[: layer.ffn_size]) * h[layer.ffn_size :]) @ wd[e]))
        tokens.append(torch.stack(per_expert).sum(0))
    out = torch.stack(tokens)
    grads = torch.autograd.grad(out, (x64, wr, wgu, wd), grad_out.double())
    return out, grads, ids


def assert_close(got, want, tol, what):
    err = moe_graph.max_relative_error(got, want)
    assert err <= tol, f"{what}: max relative error {err:.2e} > {tol:.0e}"


# --- the two paths compute one function ----------------------------------------------------


@pytest.mark.parametrize("route_bias", [None, [0.0, 2.0, -1.0, 0.5]], ids=["router", "skewed"])
def test_device_and_host_paths_match_each_other_and_a_float64_loop(route_bias):
    layer, x, grad_out = make(route_bias=route_bias)
    host = moe.with_sync(layer, "host")
    out_d, grads_d = moe.forward_backward(layer, x, grad_out)
    out_h, grads_h = moe.forward_backward(host, x, grad_out)
    out_r, grads_r, ids = reference(layer, x, grad_out)
    assert len(grads_d) == len(grads_h) == len(moe.grad_names(layer)) == 4
    for name, d, h, r in zip(("out",) + moe.grad_names(layer), (out_d, *grads_d), (out_h, *grads_h), (out_r, *grads_r)):
        assert d.shape == r.shape and d.dtype == torch.float32, name
        assert_close(d, h, 1e-5, f"{name}: device vs host")
        assert_close(d, r, 1e-5, f"{name}: device vs float64 loop")
        assert_close(h, r, 1e-5, f"{name}: host vs float64 loop")
    assert torch.equal(layer.last_counts, torch.bincount(ids.flatten(), minlength=E).to(DEV))


def test_with_sync_copies_parameters_and_route_bias():
    layer, _, _ = make(route_bias=[1.0, 0.0, -2.0, 3.0])
    twin = moe.with_sync(layer, "host")
    assert twin.sync == "host" and layer.sync == "device"
    for (name, a), (_, b) in zip(layer.state_dict().items(), twin.state_dict().items()):
        assert torch.equal(a, b), name
        assert a.data_ptr() != b.data_ptr(), f"{name}: a copy, not shared storage"


# --- routing, permutation, un-permutation -------------------------------------------------


def test_routing_counts_match_bincount_and_rows_are_grouped_by_expert():
    layer, x, _ = make(route_bias=[0.0, 1.5, -0.5, 0.0])
    weights, ids = moe.route(x, layer.router.weight, layer.route_bias, K)
    assert weights.dtype == torch.float32 and ids.shape == (T, K)
    assert torch.allclose(weights.sum(-1), torch.ones(T, device=DEV))
    assert (ids[:, 0] != ids[:, 1]).all(), "top-k picks k different experts per token"
    rows, order, counts = moe.permute(x, ids, E)
    assert counts.dtype == torch.int64 and int(counts.sum()) == T * K
    assert torch.equal(counts, torch.bincount(ids.flatten(), minlength=E))
    sorted_ids = ids.flatten()[order]
    assert torch.equal(sorted_ids, torch.repeat_interleave(torch.arange(E, device=DEV), counts)), "grouped by expert"
    assert torch.equal(rows, x[order // K])


def test_unpermute_inverts_permute():
    layer, x, _ = make()
    weights, ids = moe.route(x, layer.router.weight, layer.route_bias, K)
    rows, order, _ = moe.permute(x, ids, E)
    inverse = moe.inverse_permutation(order)
    everyone = torch.arange(T * K, device=DEV)
    assert torch.equal(order[inverse], everyone) and torch.equal(inverse[order], everyone)
    # each token's k rows are copies of x[t]: weights summing to 1 give x back
    assert torch.allclose(moe.unpermute(rows, order, weights), x, atol=1e-6)
    # and with distinct rows, token t gets sum_j w[t, j] * (row of pair (t, j))
    tagged = rows + order[:, None].float()  # row of flat pair i carries i
    expected = ((x.repeat_interleave(K, 0) + everyone[:, None].float()).view(T, K, H) * weights[..., None]).sum(1)
    assert torch.allclose(moe.unpermute(tagged, order, weights), expected, atol=1e-5)


def test_experts_with_no_tokens_work_on_both_paths():
    dead = moe_graph.DEAD_LOGIT
    layer, x, grad_out = make(route_bias=[dead, 0.0, dead, 0.0])  # k=2 of 2 live experts
    host = moe.with_sync(layer, "host")
    out_d, grads_d = moe.forward_backward(layer, x, grad_out)
    assert layer.last_counts.tolist() == [0, T, 0, T]
    out_h, grads_h = moe.forward_backward(host, x, grad_out)
    out_r, grads_r, _ = reference(layer, x, grad_out)
    assert torch.isfinite(out_d).all()
    for d, h, r in zip((out_d, *grads_d), (out_h, *grads_h), (out_r, *grads_r)):
        assert_close(d, h, 1e-5, "device vs host")
        assert_close(d, r, 1e-5, "device vs float64 loop")
    d_gate_up, d_down = grads_d[2], grads_d[3]
    for e in (0, 2):
        assert d_gate_up[e].abs().max() == 0 and d_down[e].abs().max() == 0, f"expert {e} got no token"
    assert d_gate_up[1].abs().max() > 0


def test_skewed_route_bias_is_seeded_and_kills_experts():
    a = moe_graph.skewed_route_bias(8, 2.0, dead=3, seed=5)
    b = moe_graph.skewed_route_bias(8, 2.0, dead=3, seed=5)
    assert torch.equal(a, b) and a.dtype == torch.float32
    assert (a[:3] == moe_graph.DEAD_LOGIT).all() and (a[3:].abs() < 100).all()
    assert torch.equal(moe_graph.skewed_route_bias(4, 0.0), torch.zeros(4))
    with pytest.raises(UsageError, match="dead"):
        moe_graph.skewed_route_bias(4, 1.0, dead=4)


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        ({"sync": "both"}, UsageError, "sync"),
        ({"top_k": E + 1}, UsageError, "top_k"),
        ({"top_k": 0}, UsageError, "top_k"),
        ({"hidden_size": 2.5}, UsageError, "hidden_size"),
        ({"dtype": torch.float64}, UsageError, "dtype"),
    ],
)
def test_bad_construction_names_the_argument(kwargs, error, name):
    args = {"hidden_size": H, "ffn_size": FFN, "num_experts": E, "top_k": K, **kwargs}
    sync = args.pop("sync", "device")
    dtype = args.pop("dtype", torch.float32)
    with pytest.raises(error, match=rf"^{name}:"):
        moe.MoELayer(*args.values(), sync=sync, dtype=dtype)


def test_bad_input_names_the_argument():
    layer, x, grad_out = make()
    with pytest.raises(ValueError, match=r"^x: shape \(24, 16\)"):
        layer(x[:, :16])
    with pytest.raises(ValueError, match=r"^x: expected a 2-D"):
        layer(x[0])
    with pytest.raises(TypeError, match=r"^x: dtype float64"):
        layer(x.double())
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor"):
        layer(x.tolist())
    with pytest.raises(ValueError, match=r"^grad_out:"):
        moe.forward_backward(layer, x, grad_out[:3])
    with pytest.raises(TypeError, match=r"^layer:"):
        moe.forward_backward(torch.nn.Linear(H, H), x, grad_out)
    with pytest.raises(UsageError, match=r"^layer: has sync='host'"):
        moe_graph.CapturedStep(moe.with_sync(layer, "host"), x, grad_out)
    on_cpu, x_cpu, grad_cpu = make(device="cpu")  # built, never run: nothing launches
    with pytest.raises(UsageError, match=r"^layer: is on cpu"):
        moe_graph.CapturedStep(on_cpu, x_cpu, grad_cpu)
    with pytest.raises(UsageError, match=r"^layer: is on cpu"):
        moe_graph.sync_debug_check(on_cpu, x_cpu, grad_cpu)
    with pytest.raises(UsageError, match=r"^profile:"):
        moe_bench.moe_records("tpu")


# --- timeline reduction, records, plots (no GPU needed) ------------------------------------


def _trace():
    """A synthetic chrome trace: the step [1000, 1100] on the host; kernels at 1005-1020,
    1020-1030 and 1070-1120; a device-to-host copy and the wait for it at 1030-1065."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": moe_timeline.STEP, "ts": 1000.0, "dur": 100.0},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "void at::native::(anonymous namespace)::sortKernel<float, 4>(int*)",
            "ts": 1005.0,
            "dur": 15.0,
        },
        {"ph": "X", "cat": "kernel", "name": "_grouped_mm_kernel", "ts": 1020.0, "dur": 10.0},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaMemcpyAsync",
            "ts": 1030.0,
            "dur": 5.0,
            "args": {"correlation": 7},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy DtoH (Device -> Pageable)",
            "ts": 1031.0,
            "dur": 1.0,
            "args": {"correlation": 7},
        },
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 1035.0, "dur": 30.0},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaMemcpyAsync",
            "ts": 1080.0,
            "dur": 2.0,
            "args": {"correlation": 9},
        },  # host to device: not a wait
        {"ph": "X", "cat": "kernel", "name": "nvjet_tst_128x256", "ts": 1070.0, "dur": 50.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 1101.0, "dur": 19.0},
    ]
    return ev


def test_reduce_trace_measures_idle_and_host_waits():
    r = moe_timeline.reduce_trace(_trace())
    assert r["device_events"] and r["gpu_events"] == 4
    assert r["span_us"] == 120.0 and r["host_us"] == 100.0
    # busy: 1005-1030 (25) + 1031-1032 (1) + 1070-1120 (50) = 76 of 120
    assert r["gpu_busy_us"] == 76.0 and r["gpu_idle_us"] == 44.0
    assert [s[2] for s in r["syncs"]] == ["cudaMemcpyAsync", "cudaStreamSynchronize"], (
        "the D2H copy and the wait; not the H2D copy, not the synchronize after the step"
    )
    assert r["sync_us"] == 35.0
    assert r["kernels"][0] == [5.0, 15.0, "sortKernel", 15.0]
    json.dumps(r)


def test_reduce_trace_merges_the_smallest_gaps_and_keeps_the_idle_total():
    ev = [{"ph": "X", "cat": "user_annotation", "name": moe_timeline.STEP, "ts": 0.0, "dur": 10.0}]
    # 1000 kernels of 1 µs with 0.5 µs gaps, one 500 µs hole after kernel 400
    t = 0.0
    for i in range(1000):
        ev.append({"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": t, "dur": 1.0})
        t += 1.5 + (500.0 if i == 400 else 0.0)
    full = moe_timeline.reduce_trace(ev, max_intervals=2000)
    small = moe_timeline.reduce_trace(ev, max_intervals=50)
    assert len(full["kernels"]) == 1000 and len(small["kernels"]) <= 50
    assert small["gpu_idle_us"] == full["gpu_idle_us"]
    assert any(b[0] - (a[0] + a[1]) >= 500 for a, b in zip(small["kernels"], small["kernels"][1:])), (
        "the large gap survives merging"
    )
    assert small["merged"] and any("(+" in k[2] for k in small["kernels"])
    # merged stretches keep how much of them is kernels: 1 µs in every 1.5 µs
    merged = [k for k in small["kernels"] if "(+" in k[2]]
    assert all(0.6 < k[3] / k[1] < 0.72 for k in merged if k[1] > 20)
    assert abs(sum(k[3] for k in small["kernels"]) - full["gpu_busy_us"]) < 0.1


def test_reduce_trace_without_device_events_says_so():
    r = moe_timeline.reduce_trace([e for e in _trace() if e["cat"] == "user_annotation"])
    assert not r["device_events"] and r["gpu_idle_us"] is None and r["kernels"] == []
    assert "no GPU events" in r["note"]
    assert moe_timeline.short_name("void cutlass::Kernel2<cutlass_80_tensorop_gemm<x, y>>(Params)") == "Kernel2"


def test_timeline_on_the_cpu_tier_records_no_device_events():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU tier's profile (no CUDA activity)")
    layer, x, grad_out = make()
    r = moe_timeline.timeline(layer, x, grad_out, warmup=0)
    assert r["kind"] == "timeline" and r["impl"] == "device" and r["method"] == "eager"
    assert r["device_events"] is False and r["host_us"] > 0
    json.dumps(r)


def test_cpu_profile_records_show_the_two_paths_agree():
    records = moe_bench.moe_records("cpu")
    assert {r["kind"] for r in records} == {"paths_equal"} and len(records) == 2
    for r in records:
        assert r["ok"] and r["max_rel_err"] <= 1e-5 and r["tier"].startswith("cpu" if labkit.interpreted() else "gpu")
        assert sum(r["counts"]) == moe_bench.PROFILES["cpu"]["tokens"] * moe_bench.PROFILES["cpu"]["top_k"]
        assert all(k in r for k in moe_bench.REQUIRED)
    assert records[0]["counts"] != records[1]["counts"], "the skewed route_bias moved tokens"
    json.dumps(records)


def test_step_flops_counts_three_times_the_forward():
    assert moe_bench.step_flops(10, 8, 4, 2) == 3 * 2 * 20 * (8 * 8 + 4 * 8)


def test_plots_draw_records():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def layer_row(impl, method, ms, skew):
        return {
            "kind": "moe_layer",
            "impl": impl,
            "method": method,
            "skew": skew,
            "ms_fwd_bwd": ms,
            "us_p25": ms * 900,
            "us_p75": ms * 1100,
            "tokens": 4096,
            "experts": 64,
            "top_k": 4,
            "K": 2048,
            "N": 1408,
            "ratio_vs_host_sync": None,
        }

    rows = [
        layer_row(i, m, ms, s)
        for s in (0.0, 2.0)
        for i, m, ms in (("host_sync", "eager", 9.0), ("device", "eager", 3.0), ("device", "graph", 2.0))
    ]
    fig, (a, b, c) = plt.subplots(1, 3)
    moe_plots.plot_layer_times(rows, a, "step time")
    assert any("4.5x faster" in t.get_text() for t in a.texts)
    moe_plots.plot_timeline({"kind": "timeline", **moe_timeline.reduce_trace(_trace())}, b, "host sync")
    assert any("GPU idle 44" in t.get_text() for t in b.texts)
    moe_plots.plot_timeline({"kind": "timeline", **moe_timeline.reduce_trace([])}, c, "cpu")
    assert any("no GPU events" in t.get_text() for t in c.texts)
    plt.close(fig)


# --- the lab's claims on a GPU --------------------------------------------------------------

GPU_SIZES = {"tokens": 512, "hidden_size": 256, "ffn_size": 128, "num_experts": 8, "top_k": 2}


def gpu_layer(sync="device", dtype=torch.bfloat16):
    torch.manual_seed(0)
    p = GPU_SIZES
    layer = moe.MoELayer(
        p["hidden_size"], p["ffn_size"], p["num_experts"], p["top_k"], sync=sync, dtype=dtype, device="cuda"
    )
    x = torch.randn(p["tokens"], p["hidden_size"], dtype=dtype, device="cuda")
    return layer, x, torch.randn_like(x)


@pytest.mark.gpu
def test_graph_replay_equals_eager_under_new_distributions():
    layer, x, grad_out = gpu_layer()
    records = moe_graph.graph_equals_eager(layer, x, grad_out)
    assert len(records) == len(moe_graph.DISTRIBUTIONS)
    for r in records:
        assert r["ok"], f"distribution {r['distribution']}: max relative error {r['max_rel_err']:.2e}"
        assert r["counts_equal_eager"] and sum(r["counts"]) == GPU_SIZES["tokens"] * GPU_SIZES["top_k"]
    assert all(r["counts_changed"] for r in records[1:]), "every new distribution moved tokens"
    assert records[-1]["zero_token_experts"] >= 2
    assert torch.equal(layer.route_bias, torch.zeros_like(layer.route_bias)), "route_bias restored"


@pytest.mark.gpu
def test_sync_debug_mode_sees_the_host_sync_and_nothing_in_the_device_path():
    layer, x, grad_out = gpu_layer()
    previous = torch.cuda.get_sync_debug_mode()
    device = moe_graph.sync_debug_check(layer, x, grad_out)
    host = moe_graph.sync_debug_check(moe.with_sync(layer, "host"), x, grad_out)
    assert not device["raised"], device["error"]
    assert host["raised"] and "synchroniz" in host["error"].lower()
    assert torch.cuda.get_sync_debug_mode() == previous


@pytest.mark.gpu
def test_device_and_host_paths_agree_in_bf16():
    layer, x, grad_out = gpu_layer()
    r = moe_bench.paths_agree(layer, x, grad_out)
    assert r["ok"], {k: v for k, v in r.items() if k.startswith("err_")}


@pytest.mark.gpu
def test_capturing_the_host_path_fails_in_a_child_process():
    r = moe_graph.capture_record(**GPU_SIZES)
    assert r["status"] == "ok", r["error"]  # the child itself ran to the end
    assert r["captured"] is False and r["error"], r
    assert r["tokens"] == GPU_SIZES["tokens"] and r["experts"] == GPU_SIZES["num_experts"]


@pytest.mark.gpu
def test_timings_and_timelines_on_a_small_layer():
    layer, x, grad_out = gpu_layer()
    host = moe.with_sync(layer, "host")
    records = moe_bench.time_layer(layer, host, x, grad_out, reps=3, cpu_reps=2, warmup=1)
    assert [(r["impl"], r["method"]) for r in records] == [
        ("host_sync", "eager"),
        ("device", "eager"),
        ("device", "graph"),
    ]
    assert all(r["ms_fwd_bwd"] > 0 and r["tflops"] > 0 and r["cpu_us"] > 0 for r in records)
    tl_host = moe_timeline.timeline(host, x, grad_out)
    tl_graph = moe_timeline.timeline(layer, x, grad_out, graph=True)
    json.dumps(records + [tl_host, tl_graph])
    if tl_host["device_events"]:
        assert tl_host["sync_calls"] >= 1 and len(tl_host["kernels"]) <= 300
        assert tl_host["gpu_idle_us"] >= 0
