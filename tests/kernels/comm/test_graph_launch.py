"""labkit.kernels.comm.graph_launch: a repeated call's settled launches captured once into a CUDA
graph and replayed. On the CPU tier the rules of steps 2 and 3 with the CUDA work stood in for
(when a replay may run, what a failed capture leaves); on GPUs the eager calls of every protocol
against fp64 on fresh inputs every call, with a late rank, and the cases that must launch the
normal way."""

import types

import plan_fns
import pytest
import torch

import labkit  # noqa: F401  (picks the tier first)
from labkit.kernels.comm import graph_launch as G
from labkit.kernels.comm.ranks import run_ranks
from labkit.workbench import tier

CUDA0 = torch.device("cuda", 0)


class _Graph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


@pytest.fixture
def stand_in(monkeypatch):
    """The CUDA work of steps 2 and 3 stood in for: what the device and capture state read, and
    a capture that records the launch it was given and hands back a graph that counts replays."""
    state = types.SimpleNamespace(device=0, capturing=False, hooks=False, captured=[], fail=None)

    def capture(device, launch, no_hooks):
        if state.capturing or not no_hooks():
            return None
        if state.fail:
            raise state.fail
        launch()
        state.captured.append(device)
        return _Graph()

    monkeypatch.setattr(G, "GRAPH_LAUNCH", True)
    monkeypatch.setattr(G, "_capture", capture)
    monkeypatch.setattr(G, "_current_device", lambda: state.device)
    monkeypatch.setattr(G, "_capturing", lambda: state.capturing)
    state.replay = G.GraphReplay(CUDA0, lambda: not state.hooks)
    return state


def test_a_graph_replays_only_the_calls_it_was_captured_for(stand_in):
    r, launched = stand_in.replay, []
    assert r.open and r.reason == "not captured yet" and not r.replay((1, 2))
    assert r.capture((1, 2), lambda: launched.append("sequence"))
    assert launched == ["sequence"] and stand_in.captured == [CUDA0]  # captured once
    assert r.reason is None and not r.open and r.key == (1, 2)
    assert not r.capture((1, 2), lambda: launched.append("again")) and launched == ["sequence"]
    assert r.replay((1, 2)) and r.graph.replays == 1
    assert not r.replay((1, 3))  # another output address: the normal launch
    assert r.graph.replays == 1


@pytest.mark.parametrize(
    "why", ["another device current", "the current stream is being captured", "a launch hook registered"]
)
def test_no_replay_where_the_normal_launch_must_run(stand_in, why):
    r = stand_in.replay
    assert r.capture((7,), lambda: None)
    if why == "another device current":
        stand_in.device = 1
    elif why == "the current stream is being captured":
        stand_in.capturing = True
    else:
        stand_in.hooks = True
    assert not r.replay((7,)) and r.graph.replays == 0
    stand_in.device, stand_in.capturing, stand_in.hooks = 0, False, False
    assert r.replay((7,)) and r.graph.replays == 1


def test_no_capture_inside_a_users_capture_or_with_a_hook(stand_in):
    r = stand_in.replay
    stand_in.capturing = True
    assert not r.capture((1,), lambda: None) and r.open  # tried again later
    stand_in.capturing, stand_in.hooks = False, True
    assert not r.capture((1,), lambda: None) and r.open
    stand_in.hooks = False
    assert r.capture((1,), lambda: None)


def test_a_failed_capture_keeps_the_normal_launch_for_good_and_says_why(stand_in):
    r = stand_in.replay
    stand_in.fail = RuntimeError("operation not permitted when stream is capturing")
    assert not r.capture((1,), lambda: None)
    assert r.reason.startswith("capture failed: RuntimeError: operation not permitted") and not r.open
    stand_in.fail = None
    assert not r.capture((1,), lambda: None) and not r.replay((1,)) and r.graph is None


def test_switched_off_and_cpu_devices_never_capture(monkeypatch):
    monkeypatch.setattr(G, "GRAPH_LAUNCH", False)
    off = G.GraphReplay(CUDA0, lambda: True)
    assert off.reason == "switched off (LABKIT_GRAPH_LAUNCH=0)" and not off.open
    monkeypatch.setattr(G, "GRAPH_LAUNCH", True)
    cpu = G.GraphReplay(torch.device("cpu"), lambda: True)
    assert cpu.reason == "not a CUDA device with an index" and not cpu.open and not cpu.capture((1,), lambda: None)
    assert not G.GraphReplay(torch.device("cuda"), lambda: True).open  # no index: which device replays is unknown


def _world_sizes():
    if not torch.cuda.is_available():
        return [2]
    return [w for w in (2, 4) if w <= torch.cuda.device_count()]


@pytest.mark.multigpu
@pytest.mark.parametrize("w", _world_sizes())
def test_repeated_eager_calls_replay_a_graph_and_stay_right_on_gpus(w):
    """Every eager protocol into a fixed output: right against fp64 on every call of fresh inputs
    with a rotating late rank, its launches replayed from a graph after the first calls; a user's
    capture of the call, another device current and a new output per call launch the normal way
    and stay right."""
    if tier.interpreted() or torch.cuda.device_count() < w:
        pytest.skip(f"needs {w} CUDA GPUs")
    for found in run_ranks(plan_fns.graph_launch_on_gpu, w, timeout=600).unwrap():
        for name in (
            "all_reduce out",
            "all_reduce in place",
            "all_reduce flag_in_data",
            "fid.all_reduce",
            "push.all_reduce",
        ):
            assert found[name] == [], (name, "wrong at calls", found[name])
        replaying = [p for p in found["plan paths"] if p.endswith(", replayed from a CUDA graph")]
        assert len(replaying) >= 3, found["plan paths"]
        assert found["inbox graphs"] and all(found["inbox graphs"]), found["inbox graphs"]
        assert found["user capture"] is True
        assert found.get("other device current", True) is True
        assert found["new out"] is True and found["new out reason"] == "a new output per call"


def test_nothing_is_captured_or_replayed_while_launches_are_watched(stand_in):
    """``labkit.check.watch_launches`` sees every launch: within it a repeated call launches its
    kernels one by one instead of replaying (and captures nothing), and after it replays again."""
    from labkit import check

    r = stand_in.replay
    with G.launches_watched():
        assert not r.capture((1,), lambda: None) and r.open  # captured later
    assert r.capture((1,), lambda: None)
    with check.watch_launches():
        assert G._watching == 1 and not r.replay((1,))
        with G.launches_watched():
            assert G._watching == 2
    assert G._watching == 0 and r.replay((1,)) and r.graph.replays == 1
