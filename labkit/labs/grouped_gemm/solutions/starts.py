import torch


def row_starts(m_splits):
    # A running sum on the counts' device (no host read), minus each expert's own count:
    # expert e starts where the experts before it end.
    return torch.cumsum(m_splits, 0) - m_splits
