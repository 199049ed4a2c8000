# Relaxed atomics with a CTA barrier around them: tl.debug_barrier orders the block's threads,
# nothing another GPU sees.
import triton
import triton.language as tl


@triton.jit
def signal_then_wait(peer_slot, my_slot):
    tl.debug_barrier()
    while tl.atomic_cas(peer_slot, 0, 1, sem="relaxed", scope="sys") != 0:
        pass
    while tl.atomic_cas(my_slot, 1, 0, sem="relaxed", scope="sys") != 1:
        pass
    tl.debug_barrier()
