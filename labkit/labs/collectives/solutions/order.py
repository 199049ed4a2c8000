# W = 4. Naive: at step 0 every rank reads rank 0's shard, so ranks 1, 2 and 3 (three peers)
# read GPU 0 at once. Rotated: rank r reads (r + k) mod 4 at step k; step 0 is each rank's own
# shard and at every later step each GPU's shard is read by exactly one peer.
readers = {"naive": 3, "rotated": 1}
