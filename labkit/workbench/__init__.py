"""The workbench: the ground floor, the tools every floor above uses, and nothing lab-specific.

tier (interpreter or GPU), guard and checks (device guard, input checks), errors, sandbox (child
processes with a timeout), bench (timing), trace (profiler traces), results and plot (result files,
figures), gates and hardware (what this machine can do), env (versions, commit, the environment
stamp), interpreter (the CPU tier's health), widgets (what every lab's panels share); and what a lab
declares itself and its judges with: lab (the manifest type), exercises (the exercise decorator,
``Wrong``), findings (``Reference``, ``number``), parameters (the parameter rules).

Import direction: the workbench imports nothing above it (``labkit.kernels``, ``labkit.check``,
``labkit.labs``, ``labkit.app``), not even by a string naming a module (``tests/test_layout.py``)."""
