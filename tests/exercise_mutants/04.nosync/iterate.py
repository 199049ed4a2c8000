# No .tolist(), but iterating the tensor: every element read is its own device-to-host copy.
import torch


def experts_forward(x, w, m_splits):
    out = torch.empty(x.shape[0], w.shape[2], dtype=x.dtype, device=x.device)
    row = 0
    for e, m in enumerate(m_splits):
        out[row : row + m] = x[row : row + m] @ w[e]
        row += int(m)
    return out
