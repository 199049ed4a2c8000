# A zero prepended with torch.zeros: float32 by default, so the row numbers become floats.
import torch


def row_starts(m_splits):
    return torch.cat([torch.zeros(1, device=m_splits.device), torch.cumsum(m_splits, 0)[:-1]])
