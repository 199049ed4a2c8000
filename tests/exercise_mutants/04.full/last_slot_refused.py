# Off by one: the eighth call ends exactly at word 64, which still fits (start + 8 <= 64).
calls_staged = {"global_index": 7, "resetting": 16, "owned": 16}
