# "Views are the fix": views without record_stream race exactly like raw pointers.
prediction = {"raw, 0 ms": "none", "raw, 5 ms": "all", "views, 5 ms": "none", "views+record_stream, 5 ms": "none"}
