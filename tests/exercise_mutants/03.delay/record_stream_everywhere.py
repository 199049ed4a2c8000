# "record_stream fixes raw pieces too": it is a no-op on them.
prediction = {"raw, 0 ms": "none", "raw, 5 ms": "none", "views, 5 ms": "all", "views+record_stream, 5 ms": "none"}
