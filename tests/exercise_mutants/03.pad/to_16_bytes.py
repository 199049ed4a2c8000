# Pads to 16 bytes (what vector loads need), not to the 256 bytes the raw allocator promised.
import math


def padded_numel(shape, dtype):
    nbytes = math.prod(shape) * dtype.itemsize
    return -(-nbytes // 16) * 16 // dtype.itemsize
