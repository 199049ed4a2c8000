# Expects the naive order to lose wherever there is more than one rank.
slower_at = {2, 4}
