"""labkit's pytest plugin: the ``labkit_check`` fixture, which points ``labkit.check``'s checkers at
your functions from your own test suite.

Installed with labkit (entry point ``pytest11``), so pytest loads it in every suite of that
environment. Loading it imports nothing from labkit: ``import labkit`` picks the execution tier
(it sets TRITON_INTERPRET=1 on a machine without a GPU), which must never happen to a suite that
does not ask for it. The fixture imports ``labkit.check`` on first use.

    def test_my_kernel_is_device_independent(labkit_check):
        labkit_check.device_independence("mypkg.ops:fused_add", "mypkg.ops:inputs")

Each call runs the checker and returns its report when it passed; a report that found the bug
fails the test with the report's text; one that cannot run here (a GPU missing) skips the test
with its one-line reason.
"""

from __future__ import annotations

import pytest

__all__ = ["LabkitCheck", "labkit_check"]


class LabkitCheck:
    """The fixture's value: every checker of ``labkit.check``, by name, as a method."""

    def __getattr__(self, name: str):
        import labkit  # first use: labkit picks its tier now, not when pytest loads

        check = labkit.check

        if name not in check.CHECKERS:
            raise AttributeError(f"labkit_check.{name}: no such checker; known: {', '.join(sorted(check.CHECKERS))}")
        checker = check.CHECKERS[name]

        def run(*args, **kwargs):
            report = checker(*args, **kwargs)
            if report.skipped:
                pytest.skip(report.summary())
            return report.raise_for_status()

        run.__name__ = name
        run.__doc__ = checker.__doc__
        return run

    def watch_launches(self, **kwargs):
        import labkit

        check = labkit.check

        return check.watch_launches(**kwargs)


@pytest.fixture
def labkit_check() -> LabkitCheck:
    """``labkit_check.<checker>(fn, make_inputs, ...)``: run one of ``labkit.check``'s checkers;
    fail the test with its report if it found the bug, skip it if this machine cannot check."""
    return LabkitCheck()
