# No sem or scope given: Triton's defaults are acq_rel at gpu scope, too narrow for a peer GPU.
import triton
import triton.language as tl


@triton.jit
def signal_then_wait(peer_slot, my_slot):
    while tl.atomic_cas(peer_slot, 0, 1) != 0:
        pass
    while tl.atomic_cas(my_slot, 1, 0) != 1:
        pass
