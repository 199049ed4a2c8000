"""Multi-process (multi-rank) helpers: run a function on W ranks with torch.distributed set up.

    from labkit.dist.ranks import run_ranks
    res = run_ranks(my_module.my_fn, 2)   # my_fn(ctx, ...) runs on rank 0 and rank 1
    res.unwrap()                          # [value of rank 0, value of rank 1], or RankFailure

Kept free of imports: ``labkit.dist`` must stay cheap to import.
"""
