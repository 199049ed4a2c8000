# The padded size in bytes, returned as if it were elements: itemsize times too much for wide dtypes.
import math


def padded_numel(shape, dtype):
    nbytes = math.prod(shape) * dtype.itemsize
    return -(-nbytes // 256) * 256
