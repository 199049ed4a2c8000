"""The workbench: the tools every lab uses, and nothing lab-specific.

tier (interpreter or GPU), guard and checks (device guard, input checks), errors, sandbox (child
processes with a timeout), bench (timing), results and plot (result files, figures), gates and
hardware (what this machine can do), env (versions, commit), doctor, catalogue (the map of
labs), widgets (what every lab's panels share), runner (notebooks under papermill), benchmarks
(the ``labkit bench`` registry), gpu_tier (``labkit gpu-tier``: the GPU tier in parts) and cli.

Import direction: the workbench imports neither ``labkit.kernels`` nor ``labkit.labs``; only the
registry in ``benchmarks`` names lab modules, as strings it imports on demand."""
