"""The litmus tests as data: threads, their accesses, and the one outcome each test looks for.

A litmus test is a tiny concurrent program over shared locations ``x`` and ``y`` (both 0 at the
start). Each thread is a list of at most two accesses; a load writes a register. An *outcome*
is the tuple of the test's ``observed`` values in order: registers (``r0``, ``r1``, ...) and,
for tests that look at memory after the threads are done (2+2W), a location's final value.
The *weak* outcome is the one a sequentially consistent machine never produces; whether a GPU
may produce it is what the test asks (``labkit.kernels.litmus.model`` answers per semantics,
scope and placement; ``labkit.kernels.litmus.kernels`` runs it).

    MP     T0: x=1; y=1           T1: r0=y; r1=x                 weak r0=1, r1=0
    SB     T0: x=1; r0=y          T1: y=1; r1=x                  weak r0=0, r1=0
    LB     T0: r0=x; y=1          T1: r1=y; x=1                  weak r0=1, r1=1
    CoRR   T0: x=1                T1: r0=x; r1=x                 weak r0=1, r1=0
    IRIW   T0: x=1   T1: r0=x; r1=y   T2: y=1   T3: r2=y; r3=x   weak r0=1 r1=0 r2=1 r3=0
    2+2W   T0: x=1; y=2           T1: y=1; x=2                   weak final x=1, y=1
    RWC    T0: x=1   T1: r0=x; r1=y   T2: y=1; r2=x              weak r0=1 r1=0 r2=0

The names follow the usual litmus vocabulary (Alglave et al.; reeselevine/cuda-litmus uses the
same tests with the same weak outcomes: kernels/mp.cu, iriw.cu, 2+2w.cu, rwc.cu).
"""

from __future__ import annotations

import dataclasses

from labkit.workbench.errors import UsageError

#: the shared locations every test uses, in the order the kernels lay them out per instance
LOCATIONS = ("x", "y")


@dataclasses.dataclass(frozen=True)
class Access:
    """One memory access of one thread: a store of ``value``, or a load into ``reg``."""

    kind: str  # "st" or "ld"
    loc: str  # "x" or "y"
    value: int = 0  # what a store writes (loads: unused)
    reg: str = ""  # the register a load writes, "r0".."r3" (stores: unused)

    def __str__(self) -> str:
        return f"{self.loc}={self.value}" if self.kind == "st" else f"{self.reg}={self.loc}"


def st(loc: str, value: int) -> Access:
    return Access("st", loc, value=value)


def ld(loc: str, reg: str) -> Access:
    return Access("ld", loc, reg=reg)


@dataclasses.dataclass(frozen=True)
class LitmusTest:
    name: str
    threads: tuple[tuple[Access, ...], ...]
    observed: tuple[str, ...]  # registers, then locations read after the run (final values)
    weak: tuple[int, ...]  # the outcome of interest, one value per ``observed`` entry
    question: str  # what the weak outcome would mean, in one line

    @property
    def registers(self) -> tuple[str, ...]:
        return tuple(o for o in self.observed if o.startswith("r"))

    @property
    def finals(self) -> tuple[str, ...]:
        """Locations whose value after the run is part of the outcome (2+2W)."""
        return tuple(o for o in self.observed if o in LOCATIONS)

    def owner(self, reg: str) -> int:
        """The thread whose load writes ``reg``."""
        for t, accesses in enumerate(self.threads):
            if any(a.reg == reg for a in accesses):
                return t
        raise KeyError(reg)

    def describe(self) -> str:
        """One line: the threads, then the weak outcome."""
        threads = "  |  ".join(f"T{t}: " + "; ".join(map(str, acc)) for t, acc in enumerate(self.threads))
        weak = ", ".join(f"{o}={v}" for o, v in zip(self.observed, self.weak))
        return f"{self.name}: {threads}   weak: {weak}"


TESTS: dict[str, LitmusTest] = {
    t.name: t
    for t in (
        LitmusTest(
            "MP",
            ((st("x", 1), st("y", 1)), (ld("y", "r0"), ld("x", "r1"))),
            ("r0", "r1"),
            (1, 0),
            "the flag is seen set but the data it guards is not (message passing)",
        ),
        LitmusTest(
            "SB",
            ((st("x", 1), ld("y", "r0")), (st("y", 1), ld("x", "r1"))),
            ("r0", "r1"),
            (0, 0),
            "each thread's load passes its own earlier store (store buffering)",
        ),
        LitmusTest(
            "LB",
            ((ld("x", "r0"), st("y", 1)), (ld("y", "r1"), st("x", 1))),
            ("r0", "r1"),
            (1, 1),
            "each load sees the other thread's later store (load buffering)",
        ),
        LitmusTest(
            "CoRR",
            ((st("x", 1),), (ld("x", "r0"), ld("x", "r1"))),
            ("r0", "r1"),
            (1, 0),
            "a location seen updated, then seen old again (read-read coherence)",
        ),
        LitmusTest(
            "IRIW",
            ((st("x", 1),), (ld("x", "r0"), ld("y", "r1")), (st("y", 1),), (ld("y", "r2"), ld("x", "r3"))),
            ("r0", "r1", "r2", "r3"),
            (1, 0, 1, 0),
            "two readers see two independent writes in opposite orders (multi-copy atomicity)",
        ),
        LitmusTest(
            "2+2W",
            ((st("x", 1), st("y", 2)), (st("y", 1), st("x", 2))),
            ("x", "y"),
            (1, 1),
            "both threads' first stores land last (write-write order)",
        ),
        LitmusTest(
            "RWC",
            ((st("x", 1),), (ld("x", "r0"), ld("y", "r1")), (st("y", 1), ld("x", "r2"))),
            ("r0", "r1", "r2"),
            (1, 0, 0),
            "a write seen by one thread is missed by a third that stored after it (read-to-write causality)",
        ),
    )
}


def get_test(test: str | LitmusTest) -> LitmusTest:
    """``test`` by name (or as given), or a UsageError listing the names there are."""
    if isinstance(test, LitmusTest):
        return test
    if not isinstance(test, str) or test not in TESTS:
        raise UsageError(f"test: {test!r} is not a litmus test; expected one of {list(TESTS)}")
    return TESTS[test]
