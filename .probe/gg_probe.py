"""GPU probe for lab 04: correctness at lab shapes, labkit vs torch._grouped_mm, config sweep."""
import labkit, json, math, random, sys, time, os
import torch, triton
from labkit.kernels import grouped_gemm as gg
from labkit.workbench import bench
print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
OUT = os.environ.get("OUT", ".")
res = {"env": [torch.__version__, triton.__version__, torch.cuda.get_device_name()], "rows": []}

def zipf_counts(E, M, seed=0, s=1.2):
    rng = random.Random(seed)
    zeros = math.ceil(0.1 * E)
    live = E - zeros
    w = [1 / (r + 1) ** s for r in range(live)]
    tot = sum(w); raw = [M * x / tot for x in w]
    c = [int(x) for x in raw]
    rem = M - sum(c)
    for i in sorted(range(live), key=lambda i: raw[i] - c[i], reverse=True)[:rem]: c[i] += 1
    c += [0] * zeros
    rng.shuffle(c)
    return c

def uniform(E, M):
    return [M // E + (1 if i < M % E else 0) for i in range(E)]

SHAPES = [(8, 16384, 4096, 4096), (64, 16384, 2048, 1408), (128, 8192, 2048, 768)]
def make(E, M, K, N, counts):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(E, K, N, device="cuda", dtype=torch.bfloat16, generator=g) / K ** 0.5
    c = torch.tensor(counts, device="cuda", dtype=torch.int32)
    return x, w, c

def torch_gmm(x, w, c, wt):
    offs = torch.cumsum(c, 0, dtype=torch.int32)
    return torch._grouped_mm(x, wt, offs=offs)

class forced:
    def __init__(self, cfg): self.cfg = cfg
    def __enter__(self):
        self.old = gg.forward_config; gg.forward_config = lambda M, E, d: self.cfg
    def __exit__(self, *a): gg.forward_config = self.old

t0 = time.time()
for (E, M, K, N) in SHAPES:
    for skew in ("uniform", "skewed"):
        counts = uniform(E, M) if skew == "uniform" else zipf_counts(E, M)
        x, w, c = make(E, M, K, N, counts)
        wcm = w.transpose(1, 2).contiguous().transpose(1, 2)   # column-major per expert
        ours = gg.grouped_mm(x, w, c)
        row = {"E": E, "M": M, "K": K, "N": N, "skew": skew, "max_count": max(counts)}
        # correctness vs fp32 loop on 3 experts
        r0 = 0; err = 0
        for e, m in enumerate(counts):
            if m and e % max(1, E // 3) == 0:
                ref = x[r0:r0 + m].float() @ w[e].float()
                err = max(err, ((ours[r0:r0 + m].float() - ref).abs().max() / ref.abs().max()).item())
            r0 += m
        row["labkit_err"] = err
        cands = {"labkit": lambda: gg.grouped_mm(x, w, c)}
        for name, wt in (("torch", w),):
            try:
                y = torch_gmm(x, w, c, wt); torch.cuda.synchronize()
                row[name + "_err_vs_labkit"] = ((y.float() - ours.float()).abs().max() / ours.float().abs().max()).item()
                cands[name] = (lambda wt=wt: torch_gmm(x, w, c, wt))
            except Exception as ex:
                row[name] = f"ERR {type(ex).__name__}: {str(ex)[:200]}"
        fl = gg.flops(M, N, K)
        for method in ("cuda_events", "cuda_graph"):
            cmp = bench.compare(cands, baseline="labkit", device="cuda", warmup=3, reps=15, inner=10, method=method)
            for n, t in cmp.timings.items():
                row[f"{n}_{method}_tflops"] = round(fl / t.median_us / 1e6, 1)
        # config sweep (graph replay)
        sweep = {}
        for (bm, bn, bk, gm, wp, st, pp) in [(128,256,64,8,8,3,1),(128,256,64,8,8,4,1),(128,256,64,4,8,4,1),(128,256,64,16,8,4,1),(128,128,64,8,8,4,1),(128,128,64,8,8,5,1),(128,128,64,8,4,4,1),(64,256,64,8,8,3,1),(64,256,64,8,8,4,1),(64,128,64,8,4,4,1),(64,128,64,8,4,4,2),(128,128,64,8,4,3,2),(64,256,64,8,4,3,1)]:
            cfg = gg.GroupedConfig(bm, bn, bk, gm, wp, st, pp)
            try:
                with forced(cfg):
                    gg.grouped_mm(x, w, c); torch.cuda.synchronize()
                    tm = bench.time_fn(lambda: gg.grouped_mm(x, w, c), device="cuda", warmup=2, reps=10, inner=10, method="cuda_graph")
                sweep[str((bm, bn, bk, gm, wp, st, pp))] = round(fl / tm.median_us / 1e6, 1)
            except Exception as ex:
                sweep[str((bm, bn, bk, gm, wp, st, pp))] = f"ERR {type(ex).__name__}: {str(ex)[:120]}"
        row["sweep"] = sweep
        row["chosen"] = str(gg.forward_config(M, E, x.device)); row["tma"] = gg.tma_ok(x, w)
        print(json.dumps(row), flush=True)
        res["rows"].append(row)
        print("elapsed", round(time.time() - t0), flush=True)
json.dump(res, open(os.path.join(OUT, "gg_probe.json"), "w"), indent=1)
