import math


def padded_numel(shape, dtype):
    """Elements to reserve for one piece so that the next piece starts on a 256-byte boundary."""
    nbytes = math.prod(shape) * dtype.itemsize
    # Round the piece's bytes up to the next multiple of 256 (unchanged if already one), then
    # back to elements: every dtype's size divides 256, so the division is exact.
    return -(-nbytes // 256) * 256 // dtype.itemsize
