"""labkit's test-sharding plugin (loaded by ``conftest.py``: ``pytest_plugins = ["sharding"]``): the
options that split one test run over several pytest processes, for the GPU tier
(``labkit gpu-tier``), whose whole suite does not fit one 10-minute call of a GPU machine.

``--labkit-shard K/N`` runs the K-th of N shards (1-based) of the tests selected after ``-m`` and
``-k``: a test's shard is the CRC-32 of its node id mod N, so it depends on that test alone (adding
or removing another test moves no one; a round-robin deal shifted every later test, and shards run
at two commits missed some tests and ran others twice), and a parametrised group is spread over the
shards. ``labkit gpu-tier --shard K/N`` uses it.

``--labkit-skips-to FILE`` appends the node id of every skipped test to FILE, and
``--labkit-nodeids FILE`` runs only the tests whose node ids FILE lists. ``labkit gpu-tier
--split-gpus G`` uses them: one pytest per GPU at once, each seeing one GPU, then the tests they
skipped (those needing more GPUs among them) in one pytest seeing every GPU. A listed id that the
second pytest does not collect stops it with an error naming the id: it would otherwise run in
neither process and show in neither count (``handed_on`` says how an empty parametrisation is
listed)."""

import re
import zlib

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--labkit-shard",
        default=None,
        metavar="K/N",
        help="run only the K-th of N shards (by node id) of the selected tests (1 <= K <= N)",
    )
    parser.addoption(
        "--labkit-skips-to",
        default=None,
        metavar="FILE",
        help="append the node id of every skipped test to FILE, one a line",
    )
    parser.addoption(
        "--labkit-nodeids",
        default=None,
        metavar="FILE",
        help="run only the tests whose node ids FILE lists, one a line",
    )


def read_nodeids(path: str) -> set[str]:
    """The node ids FILE lists (blank lines ignored); a clear error if it cannot be read."""
    try:
        with open(path) as f:
            return {line.strip() for line in f if line.strip()}
    except OSError as e:
        raise pytest.UsageError(f"--labkit-nodeids: cannot read {path!r}: {e}") from None


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N), 1 <= K <= N; a clear error naming the option otherwise."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--labkit-shard: expected K/N with whole numbers, e.g. 1/3, got {text!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--labkit-shard: expected 1 <= K <= N, got {text!r}")
    return k, n


def shard_index(nodeid: str, n: int) -> int:
    """The shard (1..n) of the test ``nodeid``: its CRC-32 mod n, the same in every process and on
    every machine. Shard K of N is then shards K, K + N, ... of N G: ``labkit gpu-tier --split-gpus G``
    deals a shard over its GPUs so."""
    return zlib.crc32(nodeid.encode()) % n + 1


def shard_of(items: list, k: int, n: int, nodeid=lambda item: item.nodeid) -> tuple[list, list]:
    """(kept, deselected), each in collection order: the items of shard k of n."""
    kept = [it for it in items if shard_index(nodeid(it), n) == k]
    dropped = [it for it in items if shard_index(nodeid(it), n) != k]
    return kept, dropped


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs: shards split what would run
def pytest_collection_modifyitems(config, items):
    ids_file = config.getoption("--labkit-nodeids")
    if ids_file is not None:
        wanted = read_nodeids(ids_file)
        lost = unmatched([it.nodeid for it in items], wanted)
        if lost:
            # a test skipped in the per-GPU runs that the run on every GPU does not collect would
            # otherwise vanish from both runs' counts: refuse it, naming each
            raise pytest.UsageError(
                f"--labkit-nodeids: {len(lost)} listed test(s) match no collected test "
                f"(they would run nowhere): {', '.join(lost)}"
            )
        dropped = [it for it in items if not listed(it.nodeid, wanted)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = [it for it in items if listed(it.nodeid, wanted)]
    shard = config.getoption("--labkit-shard")
    if shard:
        kept, dropped = shard_of(items, *parse_shard(shard))
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept


class SkipRecorder:
    """``--labkit-skips-to FILE``: the node id of every skipped test, appended to FILE."""

    def __init__(self, path: str):
        self.path = path

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            with open(self.path, "a") as f:
                f.write(handed_on(report.nodeid) + "\n")


def handed_on(nodeid: str) -> str:
    """The id under which a skipped test is handed on. A parametrisation by the GPUs present that
    came out empty here ("got empty parameter set") reads ``NOTSET`` in its place of the id,
    alone (``test[NOTSET]``) or beside other parameters (``test[True-NOTSET]``); with more GPUs
    that place holds other values, so it is handed on as ``*``: ``test[*]``, ``test[True-*]``."""
    if "[" not in nodeid or not nodeid.endswith("]"):
        return nodeid
    base, params = nodeid[:-1].split("[", 1)
    return base + "[" + "-".join("*" if p == "NOTSET" else p for p in params.split("-")) + "]"


def _pattern(wanted_id: str) -> re.Pattern:
    """A handed-on id as a pattern: each ``*`` of its parameters stands for one or more
    characters (``test[*]`` every parametrisation, ``test[True-*]`` those starting ``True-``)."""
    return re.compile(".+".join(re.escape(part) for part in wanted_id.split("*")))


def listed(nodeid: str, wanted: set[str]) -> bool:
    """Whether ``--labkit-nodeids`` lists ``nodeid``, itself or by a handed-on pattern."""
    return nodeid in wanted or any(_pattern(w).fullmatch(nodeid) for w in wanted if "*" in w)


def unmatched(nodeids: list[str], wanted: set[str]) -> list[str]:
    """The listed ids that no collected test answers: tests that would be handed on and never run."""
    return sorted(w for w in wanted if not any(listed(n, {w}) for n in nodeids))


def pytest_configure(config):
    path = config.getoption("--labkit-skips-to")
    if path:
        config.pluginmanager.register(SkipRecorder(path), "labkit-skips-to")
