"""labkit's Triton kernels. Each module holds a kernel, its guarded and checked launcher, and a
reference; tests import every launcher from here (``LAUNCHERS``) to apply shared checks, such as
the wrong-current-device regression, to all of them."""
from labkit.kernels.copy import copy
from labkit.kernels.fault import write_out_of_bounds

#: Every public kernel launcher, for tests that apply one check to all of them.
LAUNCHERS = {"copy": copy}

__all__ = ["copy", "write_out_of_bounds", "LAUNCHERS"]
