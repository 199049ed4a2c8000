"""torch.ops.labkit (labkit.kernels.ops): the registrations, opcheck, fake implementations, and
torch.compile over the ops. Copy and sc_matmul run on the CPU under the interpreter (on the GPU
tier, on the GPU); the collectives on an emulated world of 2 processes (GPUs on the GPU tier).
torch.compile on the CPU tier uses backend "aot_eager" (and "eager"): Inductor needs a C++
toolchain there, which CI machines may lack; the GPU tests compile with Inductor."""

import plan_fns
import pytest
import torch
from worlds import skip_without_a_world

import labkit  # noqa: F401  (picks the tier first)
import labkit.kernels.ops as ops
from labkit.kernels.comm.ranks import run_ranks
from labkit.workbench import tier

DEV = tier.kernel_device()


def test_every_op_is_registered_in_the_labkit_namespace():
    for name in ops.OPS:
        op = getattr(torch.ops.labkit, name)
        assert op.default._schema.name == f"labkit::{name}"
    schema = str(torch.ops.labkit.sc_matmul.default._schema)
    for arg in (
        "int sc_prec=8",
        "int stoc_len=256",
        'str granularity="per_row"',
        "int chunk_d=0",
        'str a_seq="bitrev"',
        'str b_seq="counter_alt"',
        "bool halve=False",
    ):
        assert arg in schema, schema
    assert 'str algorithm="auto"' in str(torch.ops.labkit.all_reduce.default._schema)


def test_copy_passes_opcheck_and_copies():
    x = torch.randn(3000, device=DEV)
    assert torch.equal(torch.ops.labkit.copy(x), x)
    result = torch.library.opcheck(torch.ops.labkit.copy.default, (x,))
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize(
    "shape,options",
    [
        (((6, 64), (64, 16)), {"stoc_len": 16}),
        (((2, 3, 32), (2, 32, 8)), {"granularity": "per_head", "stoc_len": 32}),
        (((1, 40), (40, 24)), {"chunk_d": 16, "sc_prec": 6, "halve": True}),
    ],
)
def test_sc_matmul_passes_opcheck_and_matches_the_launcher(shape, options):
    from labkit.kernels.sc import sc_matmul

    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(*s, generator=g).to(DEV) for s in shape)
    assert torch.equal(torch.ops.labkit.sc_matmul(a, b, **options), sc_matmul(a, b, **options))
    result = torch.library.opcheck(torch.ops.labkit.sc_matmul.default, (a, b), options)
    assert set(result.values()) == {"SUCCESS"}, result


def test_the_fake_sc_matmul_checks_like_the_launcher():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    a, b, bad = (mode.from_tensor(torch.zeros(*s, device=DEV)) for s in ((5, 64), (64, 7), (63, 7)))
    with mode:
        y = torch.ops.labkit.sc_matmul(a, b)
        assert tuple(y.shape) == (5, 7) and y.dtype == torch.float32
        with pytest.raises(ValueError, match="K mismatch"):
            torch.ops.labkit.sc_matmul(a, bad)
        with pytest.raises(ValueError, match="stoc_len"):
            torch.ops.labkit.sc_matmul(a, b, stoc_len=3)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_over_copy(backend):
    torch._dynamo.reset()

    def f(x):
        return torch.ops.labkit.copy(x * 2) + 1

    x = torch.randn(5000, device=DEV)
    assert torch.equal(torch.compile(f, fullgraph=True, backend=backend)(x), x * 2 + 1)


def test_collectives_as_ops_in_an_emulated_world():
    skip_without_a_world()
    for found in run_ranks(plan_fns.ops_in_the_world, 2, timeout=300).unwrap():
        for k in (
            "lookup",
            "all_reduce",
            "all_reduce one_shot",
            "all_reduce from the buffer itself",
            "reduce_scatter",
            "default name",
            "all_gather",
            "compiled",
        ):
            assert found[k] is True, (k, found)
        assert found["fake"] == {
            "all_reduce": ((2048,), "torch.float32"),
            "reduce_scatter": ((1024,), "torch.float32"),
            "all_gather": ((2048,), "torch.float32"),
        }
        assert isinstance(found["opcheck"], dict) and set(found["opcheck"].values()) == {"SUCCESS"}, found["opcheck"]
        assert found["wrong shape"].startswith("UsageError: input: (2047,) torch.float32")
        assert found["unknown handle"].startswith("UsageError: handle: 'nobody' names no symmetric buffer")
        assert found["unregistered"].startswith("UsageError: handle: 'ops_test' names no symmetric buffer")


def test_a_name_names_one_buffer():
    from labkit.kernels.comm import symm

    with pytest.raises(TypeError, match="plain tensor"):
        symm.register(torch.zeros(4))

    def lone(n):  # a one-rank buffer by hand: enough for the registry, which only holds it
        t, pad = torch.zeros(n), torch.zeros(symm.CHANNELS, 1, 1, dtype=torch.int32)
        return symm.SymmBuffer(
            t, [t], torch.tensor([t.data_ptr()]), [pad], torch.tensor([pad.data_ptr()]), 0, 1, 1, True
        )

    fake, other = lone(4), lone(4)
    try:
        assert symm.register(fake, "taken") == "taken" and symm.register(fake, "taken") == "taken"
        with pytest.raises(ValueError, match="'taken' already names another symmetric buffer"):
            symm.register(other, "taken")
    finally:
        symm.unregister("taken")
    symm.unregister("never registered")  # no error


# ---- GPU tier


@pytest.mark.gpu
def test_compiled_and_graphed_ops_on_a_gpu():
    """Inductor with fullgraph=True over copy and sc_matmul, and both captured in a CUDA graph."""
    torch._dynamo.reset()
    x = torch.randn(1 << 20, device="cuda")
    a, b = torch.randn(16, 256, device="cuda"), torch.randn(256, 64, device="cuda")

    def f(x, a, b):
        return torch.ops.labkit.copy(x) + 1, torch.ops.labkit.sc_matmul(a, b)

    from labkit.kernels.sc import sc_matmul

    y, z = torch.compile(f, fullgraph=True)(x, a, b)
    assert torch.equal(y, x + 1) and torch.equal(z, sc_matmul(a, b))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f(x, a, b)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            y, z = f(x, a, b)
    torch.cuda.current_stream().wait_stream(s)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, x + 1) and torch.equal(z, sc_matmul(a, b))
    compiled = torch.compile(f, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        y, z = compiled(x, a, b)
    assert torch.equal(y, x + 1)


@pytest.mark.multigpu
def test_collective_ops_on_gpus():
    for found in run_ranks(plan_fns.ops_in_the_world, 2, timeout=600).unwrap():
        for k in ("all_reduce", "reduce_scatter", "all_gather", "compiled"):
            assert found[k] is True, (k, found)
        assert set(found["opcheck"].values()) == {"SUCCESS"}, found["opcheck"]
    for found in run_ranks(plan_fns.ops_under_graphs_on_gpu, 2, timeout=600).unwrap():
        assert found == {"graph": True, "inductor": True}, found
