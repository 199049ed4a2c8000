# Expects NVLink to absorb the contention at every world size.
slower_at = set()
