# Counts GPU 0's own read of its shard as a reader: the naive order still has three peers on it.
readers = {"naive": 4, "rotated": 1}
