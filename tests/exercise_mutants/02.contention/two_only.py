# Expects fewer, faster links to suffer most: the contention needs readers to share a GPU.
slower_at = {2}
