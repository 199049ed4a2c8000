import triton
import triton.language as tl


@triton.jit
def signal_then_wait(peer_slot, my_slot):
    # The signal is a release: every write this program made before it (the data the peer will
    # read) is visible to whoever acquires the slot. System scope: the peer is another GPU; gpu
    # scope would order memory for this GPU's threads only.
    while tl.atomic_cas(peer_slot, 0, 1, sem="release", scope="sys") != 0:
        pass
    # The wait is an acquire: once it sees the peer's 1, every write the peer made before its
    # release is visible to the reads that follow. It resets the slot to 0 for the next barrier.
    while tl.atomic_cas(my_slot, 1, 0, sem="acquire", scope="sys") != 1:
        pass
