# Thinks the naive order spreads the readers too, since every rank reads every shard once.
readers = {"naive": 1, "rotated": 1}
