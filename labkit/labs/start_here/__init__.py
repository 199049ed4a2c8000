"""Lab 00, start here: the workbench toured (crash sandbox experiments, the copy kernel timed)."""
