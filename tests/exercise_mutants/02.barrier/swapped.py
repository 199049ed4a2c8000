# Acquire and release swapped: the signal publishes nothing, the wait guards nothing after it.
import triton
import triton.language as tl


@triton.jit
def signal_then_wait(peer_slot, my_slot):
    while tl.atomic_cas(peer_slot, 0, 1, sem="acquire", scope="sys") != 0:
        pass
    while tl.atomic_cas(my_slot, 1, 0, sem="release", scope="sys") != 1:
        pass
