# The running sum alone: each expert's END row (the first row after it), not its first row.
import torch


def row_starts(m_splits):
    return torch.cumsum(m_splits, 0)
