"""Functions the checker tests point ``labkit.check`` at: seed variants, correct functions, bad
ones, and their ``make_inputs``. Module-level, so that a child process or a rank imports them."""

import time

import numpy as np
import torch
import triton

from labkit.kernels import grouped_gemm as gg
from labkit.kernels.comm import collectives as C
from labkit.labs.wrong_device.experiments import _add_one_kernel, add_one


def vec(device):
    return (torch.randn(1 << 10, device=device),), {}


def pair(device):
    return (torch.randn(32, 48, device=device), torch.randn(48, 16, device=device)), {}


def x_out(device):
    x = torch.randn(1 << 10, device=device)
    return (x, torch.empty_like(x)), {}


# --- correct functions: no checker may flag them --------------------------------------------


def torch_add(x):
    return x + 1.5


def torch_matmul(a, b):
    return a @ b


def torch_softmax(x):
    return torch.softmax(x.view(32, -1), dim=-1)


def labkit_add_one(x):
    return add_one(x)


def in_place(x, out):
    torch.mul(x, 2.0, out=out)


def labkit_grouped(x, w, m_splits):
    return gg.grouped_mm(x, w, m_splits)


CORRECT = [
    ("torch_add", "vec"),
    ("torch_matmul", "pair"),
    ("torch_softmax", "vec"),
    ("labkit_add_one", "vec"),
    ("in_place", "x_out"),
]


# --- lab 01 variants: a launch on the current device ------------------------------------------


def launch_with_kwargs(x, out):
    """The seed's launch, arguments by keyword."""
    n = x.numel()
    _add_one_kernel[(triton.cdiv(n, 1 << 16),)](x_ptr=x, out_ptr=out, numel=n, BLOCK=1 << 16)


# --- lab 04 variants: host reads; host values baked into a graph -------------------------------


def sync_item(x):
    return x * float(x.abs().max().item())


def sync_bool_mask(x):
    return x[x > 0].sum().expand(4)


def sync_nonzero(x):
    return torch.nonzero(x > 0).float().sum().expand(4)


def sync_if(x):
    return x * 2 if bool((x > 100).any()) else x * 3


_EPOCH = [0]


def epoch_on_host(x):
    """A step counter kept on the host: a graph keeps the captured step for good."""
    _EPOCH[0] += 1
    return x * _EPOCH[0]


def count_baked(x, counts):
    """The number of rows read on the host with int(): baked into the graph (and a sync)."""
    n = int(counts[0])
    return x[:n].sum().expand(4)


def counts_inputs(device):
    return (torch.randn(16, device=device), torch.randint(1, 16, (1,), device=device)), {}


def random_dropout(x):
    return torch.nn.functional.dropout(x, 0.5, training=True)


def keep_inputs(args, kwargs, step):
    """A ``vary`` for graph_safe that changes nothing: the replays prove nothing."""


def capture_here_then_draw(fn_spec, inputs_spec):
    """graph_safe with ``isolate=False`` (the capture in this process), then what this process can
    still do on its GPU: run in a child by the test, so that a broken process is the child's."""
    from labkit import check

    r = check.graph_safe(fn_spec, inputs_spec, isolate=False)
    after = {"outcome": r.outcome, "capturing": torch.cuda.is_current_stream_capturing()}
    after["default_stream"] = torch.cuda.current_stream() == torch.cuda.default_stream()
    try:
        torch.randn(16, device="cuda").sum().item()
        after["randn"] = "ok"
    except RuntimeError as e:
        after["randn"] = str(e).splitlines()[0]
    return after


def capture_with_a_host_read():
    """replay_with_fresh_inputs on work that reads a tensor's value on the host while captured: what
    it raised. The test runs it in a child: a failed CUDA capture can leave the process's CUDA
    random generator unusable (test_a_failed_capture_in_process_ends_the_capture_and_restores_the_stream)."""
    from labkit import check
    from labkit.workbench import tier

    dev = "cuda" if tier.TIER == "gpu" and torch.cuda.is_available() else "cpu"
    x = torch.randn(64, device=dev)
    try:
        check.replay_with_fresh_inputs(lambda: x * x.sum().item(), lambda step: x.double(), lambda step, y, want: None)
    except check.CaptureFailed as e:
        reads = getattr(e.graph, "host_reads", None)
        return {"raised": "CaptureFailed", "host_reads": bool(reads), "cause": str(e.__cause__)}
    return {"raised": None}


# --- lab 03 variants: outputs whose memory torch's allocator does not own ----------------------


def dlpack_output(x):
    return torch.from_dlpack((x * 2).__dlpack__())


_KEEP = []


def numpy_output(x):
    a = (x * 2).cpu().numpy()
    _KEEP.append(a)
    return torch.from_numpy(a)


# --- bad functions ---------------------------------------------------------------------------


def raises(x):
    raise ValueError("planted failure")


def returns_string(x):
    return "not a tensor"


def no_tensor(device):
    return (3,), {}


def bad_pair(device):
    return torch.zeros(3, device=device)


def sleeps(x):
    time.sleep(600)
    return x


def nondeterministic(x):
    return x + float(np.random.rand())


# --- collectives --------------------------------------------------------------------------


def coll_inputs(device):
    return (torch.randn(1024, device=device),), {}


def lonely_barrier(buf):
    """Only rank 0 enters the barrier: it waits for ever."""
    if buf.rank == 0:
        C.barrier(buf)
    return buf.tensor.clone()


def via_process_group(buf):
    """A right sum that reads no peer's buffer: the process group's all-reduce of a copy (the held
    rounds have nothing to hold)."""
    import torch.distributed as dist

    out = buf.tensor.clone()
    dist.all_reduce(out)
    return out


def wrong_sum(buf):
    return C.all_reduce(buf, algorithm="one_shot") * 1.01
