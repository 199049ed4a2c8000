# Takes release/acquire at a scope that covers both threads to mean sequential consistency.
allowed = set()
