"""This lab's exercises, registered with :mod:`labkit.workbench.exercises`; solutions in ``solutions/``."""
