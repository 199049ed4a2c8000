"""The Llama-shaped decoder: KV-cache decode equals a full forward, SC linears plug in, accelerate
dispatch keeps the logits, and on 2 GPUs the guarded SC model runs sharded (the story's fix)."""

import pytest
import torch

import labkit
from labkit.labs.wrong_device import model as M
from labkit.workbench import sandbox

DEV = labkit.workbench.tier.kernel_device()


def test_cached_decode_equals_full_forward():
    m = M.build(M.TINY, seed=3, dtype=torch.float32)
    prompt = torch.tensor([1, 5, 9, 2])
    toks, logits, _ = M.greedy_decode(m, prompt, 5)
    full = m(torch.tensor([prompt.tolist() + toks[:-1]]), 0)[0, len(prompt) - 1 :]
    assert torch.allclose(full, logits, atol=1e-4), (full - logits).abs().max()


def test_same_seed_same_weights_and_config_shapes():
    a, b = M.build(M.TINY, seed=7), M.build(M.TINY, seed=7)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    c = M.LLAMA_8B_LAYERS
    assert (c.hidden, c.intermediate, c.n_heads, c.n_kv_heads, c.head_dim) == (4096, 14336, 32, 8, 128)


def test_sc_linears_replace_every_layer_linear_and_agree_roughly():
    ref = M.build(M.TINY, seed=1, dtype=torch.float32, device=DEV)
    sc = M.use_sc(M.build(M.TINY, seed=1, dtype=torch.float32, device=DEV), down_chunk_d=32)
    assert all(isinstance(getattr(layer, n), M.SCLinear) for layer in sc.layers for n in M.LINEARS)
    assert sc.layers[0].down_proj.sc_options["chunk_d"] == 32
    prompt = torch.arange(4)
    toks, ref_logits, _ = M.greedy_decode(ref, prompt, 3)
    _, logits, _ = M.greedy_decode(sc, prompt, 3, forced=toks)
    agree = M.agreement(ref_logits, logits)
    assert agree["cosine"] > 0.9, agree


def test_accelerate_dispatch_on_cpu_keeps_logits():
    m = M.build(M.TINY, seed=2, dtype=torch.float32)
    prompt = torch.arange(6)
    _, ref, _ = M.greedy_decode(m, prompt, 3)
    d, device_map = M.shard(M.build(M.TINY, seed=2, dtype=torch.float32), {"cpu": 10**9})
    assert set(device_map.values()) == {"cpu"}
    _, got, _ = M.greedy_decode(d, prompt, 3)
    assert torch.equal(ref, got)


def test_sc_model_benchmark_records_on_cpu(tmp_path):
    from labkit.app import benchmarks
    from labkit.workbench import results

    rs = results.load_results(benchmarks.run("wrong_device_sc_model", "cpu", out_dir=tmp_path))
    assert [r["config"] for r in rs.records] == ["bf16"] + list(M.SC_CONFIGS)
    assert all(r["ms_per_token"] > 0 and 0 <= r["top1_agreement"] <= 1 for r in rs.records)
    for r in rs.records:  # the spread beside the median: quartiles over every timed token, each pass's median
        assert r["ms_per_token_p25"] <= r["ms_per_token"] <= r["ms_per_token_p75"], r
        assert len(r["pass_ms_per_token"]) == 2 and all(ms > 0 for ms in r["pass_ms_per_token"]), r


def test_per_token_quartiles_and_bad_passes():
    q = M._per_token_ms([0.005, 0.001, 0.004, 0.002, 0.003])  # seconds, in no order
    assert (q["ms_per_token_p25"], q["ms_per_token"], q["ms_per_token_p75"]) == pytest.approx((2.0, 3.0, 4.0))
    q = M._per_token_ms([0.004, 0.001, 0.003, 0.002])  # an even count: the median between the middle two
    assert q["ms_per_token"] == pytest.approx(2.5)
    with pytest.raises(ValueError, match="passes=0"):
        M.decode_benchmark(M.TINY, gpus=0, passes=0)


def test_bad_sc_options_are_refused():
    with pytest.raises(ValueError, match="stoc_len"):
        M.use_sc(M.build(M.TINY), stoc_len=3)


@pytest.mark.multigpu
def test_sharded_sc_model_runs_guarded_and_layers_really_span_two_gpus():
    res = sandbox.run_isolated(M.unguarded_decode, M.TINY, True, timeout=300)
    assert res.ok, res.summary() + res.stderr[-2000:]
    assert res.value["layers_on"] == ["0", "1"] and res.value["finite"]


def test_weight_bytes_counts_every_linear_a_decode_step_reads():
    """The streaming floor's byte count equals the model's own Linear weights (TINY, built here)."""
    from torch import nn

    from labkit.labs.wrong_device import model as M

    m = M.build(M.TINY)
    linear = sum(mod.weight.numel() for mod in m.modules() if isinstance(mod, nn.Linear))
    assert M.weight_bytes(M.TINY) == 2 * linear
    assert M.streaming_floor_ms(M.TINY, 1000.0) == pytest.approx(2 * linear / 1e12 * 1e3)
