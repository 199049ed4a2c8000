# Reads the rotated order's first step (each rank its own shard) as the whole story.
readers = {"naive": 3, "rotated": 0}
