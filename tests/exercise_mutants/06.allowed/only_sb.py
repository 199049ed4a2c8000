# Reasons from release/acquire alone and forgets that PTX is not multi-copy atomic (IRIW, 2+2W).
allowed = {"SB"}
