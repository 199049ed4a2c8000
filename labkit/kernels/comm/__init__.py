"""Collectives over symmetric memory, and the rank launcher they are tested and measured with.

* ``symm``: symmetric buffers (torch symmetric memory on GPUs; processes over shared memory on
  the CPU tier), ``signals``: barriers with their memory ordering, ``ranks``: ``run_ranks``;
* the kernels, one module per algorithm: ``one_shot``, ``two_shot``, ``tree``,
  ``scatter_gather``; ``collectives``: the API that checks inputs and picks one (its parts:
  ``checks``, ``chooser``, ``tables``, ``plans``); ``plan``: the same calls with their checks and
  choices made once (``collectives.all_reduce_plan``), which the API keeps.

    from labkit.kernels.comm.ranks import run_ranks
    res = run_ranks(my_module.my_fn, 2)   # my_fn(ctx, ...) runs on rank 0 and rank 1
    res.unwrap()                          # [value of rank 0, value of rank 1], or RankFailure

Kept free of imports: ``labkit.kernels.comm`` must stay cheap to import.
"""
