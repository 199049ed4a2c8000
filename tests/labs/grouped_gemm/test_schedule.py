"""Lab 04's drawn schedule: the Python replay of the kernel's persistent tile order."""

import matplotlib

import labkit  # noqa: F401

matplotlib.use("Agg")

import pytest
import torch

from labkit.labs.grouped_gemm import schedule


@pytest.mark.parametrize(
    "counts, N, bm, bn, programs",
    [
        ([5, 0, 37, 1, 0, 20], 33, 16, 16, 4),
        ([2048] * 8, 4096, 128, 256, 132),
        ([0, 0, 300, 1], 768, 64, 256, 7),
    ],
)
def test_every_output_element_is_computed_exactly_once(counts, N, bm, bn, programs):
    tiles = schedule.tile_schedule(counts, N, bm, bn, programs)
    covered = torch.zeros(sum(counts), N, dtype=torch.int32)
    for t in tiles:
        covered[t.row0 : t.row0 + t.rows, t.tile_n * bn : (t.tile_n + 1) * bn] += 1
    assert covered.min().item() == 1 and covered.max().item() == 1
    # round-robin: program p's turns are 0, 1, 2, ... in order
    for p in range(programs):
        turns = [t.turn for t in tiles if t.program == p]
        assert turns == list(range(len(turns)))
    assert all(0 < t.rows <= bm for t in tiles)


def test_zero_token_experts_have_no_tiles_and_summary_counts_idle_rows():
    tiles = schedule.tile_schedule([0, 3, 0], 8, 4, 8, 2)
    assert [(t.expert, t.rows) for t in tiles] == [(1, 3)]
    s = schedule.summary(tiles, 2, 4)
    assert s == {"tiles": 1, "programs": 2, "busiest_program": 1, "mean_per_program": 0.5, "idle_row_fraction": 0.25}


def test_plot_draws_one_rectangle_per_tile():
    ax = schedule.plot_schedule([5, 0, 9], 32, 4, 16, 3)
    assert len(ax.patches) == len(schedule.tile_schedule([5, 0, 9], 32, 4, 16, 3))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"counts": [1, -1]}, "counts: expected non-negative ints"),
        ({"N": 0}, "N: expected a positive int"),
        ({"programs": 1.5}, "programs: expected a positive int"),
    ],
)
def test_bad_input(kwargs, match):
    args = {"counts": [1, 2], "N": 8, "block_m": 4, "block_n": 4, "programs": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        schedule.tile_schedule(**args)
