# Every boundary, 0 included: E + 1 numbers (the offsets torch's grouped_mm takes), not E starts.
import torch


def row_starts(m_splits):
    return torch.nn.functional.pad(torch.cumsum(m_splits, 0), (1, 0))
