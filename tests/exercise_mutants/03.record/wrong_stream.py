# record_stream on the current (main) stream: the block is already that stream's; the side stream is not named.
import torch

from labkit.kernels import alloc


def wgrad_buffers(shapes, device, side):
    pieces = alloc.allocate_views(shapes, torch.float32, device).tensors
    for piece in pieces:
        piece.record_stream(torch.cuda.current_stream())
    return pieces
