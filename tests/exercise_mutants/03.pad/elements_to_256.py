# Rounds the element count up to a multiple of 256 elements: aligned, but up to 256 * itemsize bytes of padding.
import math


def padded_numel(shape, dtype):
    numel = math.prod(shape)
    return -(-numel // 256) * 256
