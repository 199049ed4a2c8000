# 4 GEMMs x 2 words = 8 words a call. The global index never resets: 64 // 8 = 8 calls fit, then
# every call is refused. Resetting the index and an owned slot both stage every call (resetting
# is never full, but a graph replaying an earlier call reads a slot a later call rewrote).
calls_staged = {"global_index": 8, "resetting": 16, "owned": 16}
