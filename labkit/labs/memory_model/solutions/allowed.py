# Release/acquire at gpu scope covers two CTAs of one GPU, so MP, LB and CoRR are forbidden. SB
# needs a store kept before a later load, which release/acquire never promises; IRIW and 2+2W
# need every thread to see a store at once, which PTX promises only with fence.sc; RWC needs both.
allowed = {"SB", "IRIW", "2+2W", "RWC"}
