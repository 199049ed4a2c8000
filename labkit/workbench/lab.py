"""A lab's manifest: everything the application needs to know about one lab, declared once.

Each lab package ends its ``__init__.py`` with one ``LAB = Lab(...)``, keywords only::

    LAB = Lab(
        name="stream_races",            # the package, bench, reference files, report blocks, --set keys
        number="03",                    # the notebook's prefix, and the exercises' ("03.delay")
        package=__name__,
        title="Buffers that escape the allocator",
        ...
        benchmarks={"stream_races": "bench:benchmark"},
        exercises="exercises",
        catch="catch:CASES",
        report={"race": "findings:race_table"},
        parameters="parameters:PARAMETERS",
    )

The application (:mod:`labkit.app.catalogue`) imports the lab packages and reads their ``LAB``;
nothing below the application names a lab. A manifest names the lab's own modules relative to its
package (``"bench:benchmark"`` is ``<package>.bench.benchmark``), imported only when asked for
(:meth:`Lab.load`): importing a lab package imports none of its story code, so a child process
that imports one module of a lab by name pays for that module alone.

One name per lab: ``name`` is the package's last component; its benchmarks are ``name`` or
``name_<part>`` (their reference files ``reference/<machine>/<bench>.json``), its report blocks
``<name>.<block>``, its ``--set`` and ``profiles.yml`` key ``name``, its tests ``tests/labs/<name>/``.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Mapping
from types import MappingProxyType

from labkit.workbench.errors import UsageError

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
NUMBER = re.compile(r"^\d\d$")
STATUSES = ("ready", "draft", "planned")
#: a target inside the lab's package: ``module`` or ``module:attribute`` (module relative, dotted)
TARGET = re.compile(r"^[a-z_][a-z0-9_.]*(:[A-Za-z_]\w*)?$")
BLOCK = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Part:
    """A part of a lab that needs hardware: ``needs`` are keyword arguments of
    :func:`labkit.workbench.gates.requires` (``{"gpus": 2, "compiled": True}``)."""

    name: str
    needs: Mapping


@dataclasses.dataclass(frozen=True, kw_only=True)
class Benchmark:
    """A ``labkit bench`` entry: ``run`` is ``"module:function"`` in the lab's package, a function of
    the profile returning records; ``required`` names the module attribute listing the fields every
    record must carry."""

    run: str
    required: str = "REQUIRED"


def _frozen(mapping: Mapping | None) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lab:
    name: str  # "stream_races": the one name of the lab
    number: str  # "03": the notebook's prefix and the exercises' (03.delay)
    package: str  # the lab's package (``__name__`` in its __init__)
    title: str
    bug: str  # the bug in full: docs/labs.md's table
    short: str  # the bug in a few words: the README's table
    story: str  # the public report the lab starts from
    gpus: str  # what the full lab needs, in words
    gpu_count: str  # the same as a number or range: the README's table
    cpu_tier: str  # what the CPU tier shows
    status: str  # one of STATUSES
    parts: tuple[Part, ...] = ()
    benchmarks: Mapping[str, str | Benchmark] = dataclasses.field(default_factory=dict)
    exercises: str | None = None  # the module registering the lab's exercises
    catch: str | None = None  # "module:CASES": the "catch it in your code" cases
    report: Mapping[str, str] = dataclasses.field(default_factory=dict)  # block -> "module:function"
    figures: Mapping[str, str] = dataclasses.field(default_factory=dict)  # figure -> "module:function"
    parameters: str | None = None  # "module:PARAMETERS": the notebook's parameter rules

    def __post_init__(self):
        if not (isinstance(self.name, str) and NAME.match(self.name)):
            raise UsageError(f"Lab: name must be a lower-case Python name, got {self.name!r}")
        if not (isinstance(self.package, str) and self.package.rsplit(".", 1)[-1] == self.name):
            raise UsageError(f"Lab {self.name}: package {self.package!r} must end in the lab's name")
        if not (isinstance(self.number, str) and NUMBER.match(self.number)):
            raise UsageError(f"Lab {self.name}: number must be two digits as a string, got {self.number!r}")
        if self.status not in STATUSES:
            raise UsageError(f"Lab {self.name}: status {self.status!r} is not one of {STATUSES}")
        benches = {k: v if isinstance(v, Benchmark) else Benchmark(run=v) for k, v in dict(self.benchmarks).items()}
        for bench in benches:
            if bench != self.name and not bench.startswith(self.name + "_"):
                raise UsageError(f"Lab {self.name}: benchmark {bench!r} must be {self.name!r} or {self.name}_<part>")
        for block in list(self.report) + list(self.figures):
            if not BLOCK.match(block):
                raise UsageError(f"Lab {self.name}: block {block!r} must be lower-case words joined by - or _")
        targets = [b.run for b in benches.values()] + list(self.report.values()) + list(self.figures.values())
        targets += [t for t in (self.exercises, self.catch, self.parameters) if t is not None]
        for target in targets:
            if not (isinstance(target, str) and TARGET.match(target)):
                raise UsageError(f"Lab {self.name}: target {target!r} must be 'module' or 'module:name' in the lab")
        object.__setattr__(self, "parts", tuple(self.parts))
        object.__setattr__(self, "benchmarks", _frozen(benches))
        object.__setattr__(self, "report", _frozen(self.report))
        object.__setattr__(self, "figures", _frozen(self.figures))

    @property
    def notebook(self) -> str:
        """The notebook's path from the repository root: ``notebooks/<number>_<name>.ipynb``."""
        return f"notebooks/{self.number}_{self.name}.ipynb"

    @property
    def notebook_stem(self) -> str:
        return f"{self.number}_{self.name}"

    def load(self, target: str):
        """The module (``"bench"``) or the attribute (``"bench:benchmark"``) a target names, from the
        lab's own package."""
        module, _, attr = target.partition(":")
        loaded = importlib.import_module(f"{self.package}.{module}")
        return getattr(loaded, attr) if attr else loaded

    def blocks(self) -> dict[str, str]:
        """The lab's report blocks by their document name, ``<name>.<block>``."""
        return {f"{self.name}.{block}": target for block, target in self.report.items()}
