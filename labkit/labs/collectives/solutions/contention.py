# On 4 GPUs the naive order puts three readers on one GPU's links at each step and was slower at
# every size recorded; on 2 GPUs each rank has one peer either way, and nothing contends.
slower_at = {4}
