# "Resetting is just as bounded": but a reset index never runs past the buffer.
calls_staged = {"global_index": 8, "resetting": 8, "owned": 16}
