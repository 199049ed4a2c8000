# Release/acquire at gpu scope: ordered for this GPU's threads only, not for the peer GPU.
import triton
import triton.language as tl


@triton.jit
def signal_then_wait(peer_slot, my_slot):
    while tl.atomic_cas(peer_slot, 0, 1, sem="release", scope="gpu") != 0:
        pass
    while tl.atomic_cas(my_slot, 1, 0, sem="acquire", scope="gpu") != 1:
        pass
