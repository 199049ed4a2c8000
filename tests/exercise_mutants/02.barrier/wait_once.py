# The wait is one compare-and-swap, not a loop: it consumes a signal that has arrived, and walks on when none has.
import triton
import triton.language as tl


@triton.jit
def signal_then_wait(peer_slot, my_slot):
    while tl.atomic_cas(peer_slot, 0, 1, sem="release", scope="sys") != 0:
        pass
    tl.atomic_cas(my_slot, 1, 0, sem="acquire", scope="sys")
