"""labkit.kernels.fp8.recipe: delayed scaling's rules against hand-computed values: the amax from
the history (both algorithms), the scale (margin, 0 / inf / NaN keep the old one, overflow to the
largest fp32), the history roll, the window, and the recipe's refusals."""

import math

import pytest
import torch

import labkit  # noqa: F401  (picks the tier before the kernels are imported)
from labkit.kernels.fp8.recipe import (
    FP32_MAX,
    DelayedScaling,
    FP8Meta,
    amax_from_history,
    rolled_history,
    scale_from_amax,
    updated,
)

INF, NAN = math.inf, math.nan

# Five tensors (columns), a history of four steps (rows; row 0 = this step's amax).
HISTORY = torch.tensor(
    [
        # ordinary  never ran  inf now  NaN now  tiny
        [2.0, 0.0, INF, NAN, 1e-38],
        [1.0, 0.0, 1.0, 0.0, 0.0],
        [4.0, 0.0, 1.0, 0.0, 0.0],
        [0.5, 0.0, 1.0, 0.0, 0.0],
    ]
)
OLD_SCALE = torch.tensor([7.0, 3.0, 5.0, 6.0, 2.0])


def test_amax_max_is_the_column_max_and_most_recent_is_row_0():
    amax = amax_from_history(HISTORY, "max")
    assert amax[0] == 4.0 and amax[1] == 0.0 and amax[2] == INF and amax[4] == 1e-38
    assert math.isnan(amax[3])
    recent = amax_from_history(HISTORY, "most_recent")
    assert recent[0] == 2.0 and recent[2] == INF and recent[4] == 1e-38


@pytest.mark.parametrize(
    "algo, margin, expected0",
    [
        ("max", 0, 448 / 4.0),  # 112
        ("max", 1, 448 / 4.0 / 2),  # 56: a margin of 1 halves the scale
        ("most_recent", 0, 448 / 2.0),  # 224
        ("most_recent", 2, 448 / 2.0 / 4),
    ],
)
def test_scale_by_hand(algo, margin, expected0):
    _, scale, scale_inv = updated(HISTORY, OLD_SCALE, 448.0, margin, algo)
    assert scale[0].item() == expected0
    assert scale[1].item() == 3.0  # amax 0: the previous scale is kept
    assert scale[2].item() == 5.0  # amax inf: kept
    assert scale[3].item() == 6.0  # amax NaN: kept
    assert scale[4].item() == FP32_MAX  # 448 / 1e-38 overflows fp32: the largest fp32
    assert torch.equal(scale_inv, torch.reciprocal(scale))


def test_e5m2_scale_uses_its_own_max():
    scale = scale_from_amax(torch.tensor([4.0]), torch.tensor([1.0]), 57344.0, 0)
    assert scale.item() == 14336.0


def test_roll_puts_the_newest_amax_last_and_clears_row_0():
    rolled = rolled_history(HISTORY)
    # roll(-1): row i <- old row i + 1, last row <- old row 0 (the newest); row 0 (old row 1, the
    # oldest) cleared for the next step's amax
    assert rolled[:, 0].tolist() == [0.0, 4.0, 0.5, 2.0]
    assert rolled[:, 2].tolist() == [0.0, 1.0, 1.0, INF]
    assert rolled[0].eq(0).all()


def test_a_history_of_one_keeps_only_this_step():
    h = torch.tensor([[3.0, 0.0]])
    new_h, scale, _ = updated(h, torch.tensor([1.0, 9.0]), 448.0, 0, "max")
    assert new_h.tolist() == [[0.0, 0.0]]
    assert scale[0].item() == torch.tensor(448.0).div(torch.tensor(3.0)).item() and scale[1].item() == 9.0


def test_window_forgets_after_history_len_steps():
    meta = FP8Meta.create(1, 3, "cpu")
    recipe = DelayedScaling(amax_history_len=3)
    scales = []
    for amax in (8.0, 1.0, 1.0, 1.0, 1.0):
        meta.amax_history[0, 0] = amax
        meta.update_(448.0, recipe)
        scales.append(meta.scale.item())
    # the 8 stays in the max for 3 steps (this one and two more), then drops out
    assert scales == [56.0, 56.0, 56.0, 448.0, 448.0]


def test_stacked_update_equals_one_at_a_time():
    g = torch.Generator().manual_seed(0)
    hist = torch.rand(3, 5, 2, generator=g) * 10
    hist[1, :, 1] = 0
    scale = torch.rand(3, 2, generator=g) + 0.5
    stacked = updated(hist, scale, 448.0, 0, "max")
    for i in range(3):
        one = updated(hist[i], scale[i], 448.0, 0, "max")
        for a, b in zip(stacked, one):
            assert torch.equal(a[i], b)


def test_meta_update_is_in_place():
    meta = FP8Meta.create(2, 4, "cpu")
    views = (meta.scale, meta.scale_inv, meta.amax_history)
    meta.amax_history[0] = torch.tensor([2.0, 0.0])
    meta.update_(448.0, DelayedScaling())
    assert meta.scale.tolist() == [224.0, 1.0] and meta.scale_inv[0].item() == pytest.approx(1 / 224.0, rel=2**-24)
    assert all(a is b for a, b in zip(views, (meta.scale, meta.scale_inv, meta.amax_history)))


def test_recipe_dtypes():
    assert DelayedScaling().bwd_dtype == torch.float8_e5m2
    assert DelayedScaling(fp8_format="E4M3").bwd_dtype == torch.float8_e4m3fn
    assert DelayedScaling().fp8_max("forward") == 448.0 and DelayedScaling().fp8_max("backward") == 57344.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"amax_history_len": 0}, "amax_history_len: expected an int >= 1, got 0"),
        ({"amax_history_len": 2.0}, "amax_history_len"),
        ({"amax_compute_algo": "mean"}, "amax_compute_algo: 'mean' is not one of 'max', 'most_recent'"),
        ({"fp8_format": "E5M2"}, "fp8_format: 'E5M2' is not one of 'HYBRID', 'E4M3'"),
        ({"margin": -1}, "margin: expected a finite number >= 0"),
        ({"margin": True}, "margin"),
    ],
)
def test_recipe_refuses_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DelayedScaling(**kwargs)


def test_meta_refuses_bad_state():
    with pytest.raises(ValueError, match="history_len: expected an int >= 1"):
        FP8Meta.create(2, 0, "cpu")
    with pytest.raises(TypeError, match="scale: expected an fp32 tensor"):
        FP8Meta(torch.ones(2, dtype=torch.float64), torch.ones(2), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="amax_history"):
        FP8Meta(torch.ones(2), torch.ones(2), torch.zeros(3, 1))
    with pytest.raises(ValueError, match="must share one device"):
        FP8Meta(torch.ones(2), torch.ones(2), torch.zeros(3, 2, device="meta"))
    with pytest.raises(ValueError, match="algo: 'mean'"):
        amax_from_history(HISTORY, "mean")
