# "A 64-word buffer is plenty": the global index is never reset, so it fills up.
calls_staged = {"global_index": 16, "resetting": 16, "owned": 16}
