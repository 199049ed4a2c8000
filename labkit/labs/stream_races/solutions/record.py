import torch

from labkit.kernels import alloc


def wgrad_buffers(shapes, device, side):
    """One buffer per shape, cut from one block; the side stream writes into them."""
    # Views of one torch.empty: the caching allocator owns their block, so record_stream reaches it
    # (on raw-pointer pieces it is a silent no-op).
    pieces = alloc.allocate_views(shapes, torch.float32, device).tensors
    for piece in pieces:
        # The block is then held back, once freed, until the side stream passes this point.
        piece.record_stream(side)
    return pieces
