# Thinks gpu scope does not cover two CTAs, so MP and LB would be allowed too.
allowed = {"MP", "LB", "SB", "IRIW", "2+2W", "RWC"}
