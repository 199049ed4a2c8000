"""One package per lab, holding only its story code: experiments, plots, widgets and the
functions its ``labkit bench`` entries run. Notebooks import these; tests import them too.

start_here (lab 00), wrong_device (01), collectives (02), stream_races (03).

A lab imports ``labkit.kernels`` and ``labkit.workbench``; it may import a lab it builds on,
never in a cycle. What several labs use belongs in the workbench."""
