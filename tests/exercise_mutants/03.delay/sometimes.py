# "Races are random": once the side stream is busy, the reuse is deterministic (the best-fit block).
prediction = {"raw, 0 ms": "none", "raw, 5 ms": "some", "views, 5 ms": "some", "views+record_stream, 5 ms": "none"}
