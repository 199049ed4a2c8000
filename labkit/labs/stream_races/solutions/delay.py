# At 0 ms the side write runs before the main stream's zeros: nothing is corrupted, whatever the
# allocator. With the side stream busy, the freed block is reused at once unless record_stream
# reached the allocator: raw pieces and views without it lose the whole fresh tensor every time.
prediction = {
    "raw, 0 ms": "none",
    "raw, 5 ms": "all",
    "views, 5 ms": "all",
    "views+record_stream, 5 ms": "none",
}
