"""Lab 06: the GPU memory model, seen: litmus tests swept over semantics, scope, placement and
stress (``sweep``), lab 02's broken barriers made to break (``broken_barriers``), their plots and
panels."""
