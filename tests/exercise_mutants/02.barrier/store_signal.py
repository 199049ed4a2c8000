# The signal set by a plain store (no atomic, no release), the wait kept as an acquire.
import triton
import triton.language as tl


@triton.jit
def signal_then_wait(peer_slot, my_slot):
    tl.store(peer_slot, 1)
    while tl.atomic_cas(my_slot, 1, 0, sem="acquire", scope="sys") != 1:
        pass
