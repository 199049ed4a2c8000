"""The application: everything that knows every lab.

``labkit`` the command (cli), ``labkit run`` (runner), ``labkit report`` (report), the catalogue of
labs read from each lab's manifest (catalogue), the exercises' lookup behind
``labkit.exercises.check`` (exercises), the checkers' recorded verdicts (catch_record), the
``labkit bench`` registry (benchmarks), ``labkit gpu-tier`` (gpu_tier), ``labkit doctor`` (doctor)
and the workshop path (workshop).

The top floor: the app imports lab packages directly (``from labkit.labs import stream_races``);
nothing below imports the app. This package's ``__init__`` imports nothing, so that a notebook's
runner child (``app.runner.child``) starts without torch.
"""
