# "A race is a race, delay or not": at 0 ms the side write runs before the fresh tensor's zeros.
prediction = {"raw, 0 ms": "all", "raw, 5 ms": "all", "views, 5 ms": "all", "views+record_stream, 5 ms": "none"}
