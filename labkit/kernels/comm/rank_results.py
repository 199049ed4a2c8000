"""What ``ranks.run_ranks`` reports: a rank's outcome (``RankResult``) and the world's
(``RanksResult``), decided by the launcher from what each rank left in its folder: its result file
(``_result_path``), its stdout and stderr, and its where-file (``note_call``: what the rank was
doing, for the line of a rank killed at the timeout). Also which rank failed first, and the
ranks that only followed it ("aborted", naming its error).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
from pathlib import Path
from typing import Any

from labkit.workbench.sandbox import classify

STATUSES = ("ok", "exception", "illegal_memory_access", "cuda_error", "signal", "exit", "timeout", "aborted")
_HANG_HINT = "(hung? e.g. a spin barrier waiting for a peer that died)"
_TAIL = 20_000  # characters of each rank's stdout/stderr kept in its result


class RankFailure(RuntimeError):
    """At least one rank did not return; ``.result`` holds every rank's outcome."""

    def __init__(self, message: str, result: RanksResult | None = None):
        super().__init__(message)
        self.result = result


@dataclasses.dataclass
class RankResult:
    rank: int
    status: str
    value: Any = None
    error_type: str | None = None
    message: str | None = None
    traceback: str | None = dataclasses.field(default=None, repr=False)
    seconds: float = 0.0  # from the launch until the rank exited or was killed
    signal: str | None = None  # "SIGSEGV", ... when status is "signal"
    returncode: int | None = None
    #: what the rank was doing when it ended or was killed (``note_call``): "starting",
    #: "init_process_group", "fn", or the collective call it was in; None: no word from it
    where: str | None = None
    stdout: str = dataclasses.field(default="", repr=False)  # tails of what the rank printed
    stderr: str = dataclasses.field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def summary(self) -> str:
        """One line: the rank, its outcome and the most telling detail."""
        t = f"({self.seconds:.1f} s)"
        if self.status == "ok":
            return f"rank {self.rank} ok {t}"
        if self.status == "timeout":
            return f"rank {self.rank} {self.message}"
        if self.status == "signal":
            return f"rank {self.rank} signal: killed by {self.signal} {t}"
        lines = (self.message or "").strip().splitlines()
        first = lines[0] if lines else ""
        if self.status == "exit":
            detail = f"code {self.returncode} and no result" + (f"; {first}" if first else "")
        else:
            detail = f"{self.error_type}: {first}" if self.error_type else first
        return f"rank {self.rank} {self.status}: {detail} {t}"


@dataclasses.dataclass
class RanksResult:
    results: list[RankResult]
    seconds: float
    world_size: int
    backend: str = ""
    timeout: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def values(self) -> list:
        """Every rank's return value in rank order (None where a rank did not return)."""
        return [r.value for r in self.results]

    @property
    def failed(self) -> list[RankResult]:
        return [r for r in self.results if not r.ok]

    @property
    def first_failure(self) -> RankResult | None:
        """The likeliest root cause: the first rank to fail on its own (the ranks aborted because
        of it come last), or None if every rank returned."""
        return min(self.failed, key=lambda r: (r.status == "aborted", r.seconds), default=None)

    def summary(self) -> str:
        return "\n".join(r.summary() for r in self.results)

    def unwrap(self) -> list:
        """The values if every rank returned, else raise RankFailure naming each failed rank."""
        if self.ok:
            return self.values
        head = f"{len(self.failed)} of {self.world_size} ranks failed (backend {self.backend}, {self.seconds:.1f} s):"
        lines = [head]
        lines += [f"  {r.summary()}" for r in self.failed]
        # The root cause is the first rank to fail on its own; the aborted ones only followed.
        causes = sorted((r for r in self.failed if r.traceback), key=lambda r: r.seconds)
        if causes:
            lines.append(f"--- rank {causes[0].rank} traceback ---\n{causes[0].traceback}")
        raise RankFailure("\n".join(lines), self)


#: this rank's where-file (``note_call``), set by ``rank_main.rank_main`` in a rank of ``run_ranks``
_where_file: str | None = None


def _where_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"rank{rank}.where")


def note_call(text: str) -> None:
    """Say what this rank is doing now ("all_reduce (one_shot)"), for the line the launcher writes
    when the timeout passes (``RankResult.where``): one small file write, so the callers use it
    once per plan on GPUs and once per call in the emulated world. Nothing outside a rank."""
    if _where_file is None:
        return
    try:
        with open(_where_file, "w") as f:
            f.write(text)
    except OSError:
        pass


def _read_where(run_dir: str, rank: int) -> str | None:
    try:
        return Path(_where_path(run_dir, rank)).read_text(errors="replace").strip() or None
    except OSError:
        return None


def _timeout_message(where: str | None, timeout: float) -> str:
    """The timeout line of a rank the launcher killed, by what it was doing then."""
    if where in (None, "starting"):
        return f"did not start within {timeout:g} s (still importing torch and labkit)"
    if where == "init_process_group":
        return f"did not start within {timeout:g} s: still in init_process_group, waiting for its peers"
    if where == "fn":
        return f"did not finish within {timeout:g} s, in fn {_HANG_HINT}"
    return f"did not finish within {timeout:g} s, in {where} {_HANG_HINT}"


def _result_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"rank{rank}.pkl")


def _load_payload(run_dir: str, rank: int) -> dict | None:
    """The outcome rank left in its file, or None when it left none (yet)."""
    path = _result_path(run_dir, rank)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception as e:
        return {"status": "exception", "type": type(e).__name__, "message": f"could not read rank {rank}'s result: {e}"}


#: a rank's own error when what failed is a peer gone (gloo's and NCCL's words for it): the
#: rank was a victim of the first failure, not its cause
_PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|Failed to recv, got 0 bytes"
    r"|remote process exited|Connection refused"
)


def _peer_lost(payload: dict | None) -> bool:
    return (
        bool(payload) and payload.get("status") == "exception" and bool(_PEER_LOST.search(payload.get("message") or ""))
    )


def _first_failed(procs: list, ended: dict, payloads: dict) -> int | None:
    """The rank whose failure the launcher acts on: the first (in rank order) that left a result
    that is not "ok" or exited without one, preferring a rank that failed on its own to one that
    lost a peer (``_peer_lost``: its error only follows the other's)."""
    failed = [
        rank
        for rank in range(len(procs))
        if (rank in payloads and payloads[rank].get("status") != "ok") or (rank in ended and rank not in payloads)
    ]
    own = [rank for rank in failed if not _peer_lost(payloads.get(rank))]
    return (own or failed or [None])[0]


def _never_started(rank: int, seconds: float, timeout: float) -> RankResult:
    """A rank the launcher had not started when the timeout passed (``_run_world``)."""
    return RankResult(
        rank,
        "timeout",
        seconds=seconds,
        message=f"never started: starting the ranks before it took the whole timeout ({timeout:g} s)",
    )


def _name_the_first_failure(results: list[RankResult], first: int) -> list[RankResult]:
    """Every rank that was killed, or failed only because a peer was gone (``_peer_lost``), is
    marked "aborted", naming the rank that failed first and its error."""
    cause = results[first]
    # its summary without "rank k " and the seconds: "exception: builtins.TypeError: ..."
    what = cause.summary().split(" ", 2)[-1].rsplit(" (", 1)[0]
    for r in results:
        if r.rank == first:
            continue
        if r.status == "aborted":
            r.message = f"killed because rank {first} failed first ({what})"
        elif r.status == "exception" and _PEER_LOST.search(r.message or ""):
            own = f"{r.error_type}: {(r.message or '').strip().splitlines()[0]}"
            r.status, r.error_type, r.traceback = "aborted", None, None
            r.message = f"aborted because rank {first} failed first ({what}); its own error, a peer gone: {own}"
    return results


def _rank_result(
    rank: int, proc, run_dir: str, seconds: float, exited: bool, first_failed: int | None, timeout: float
) -> RankResult:
    """Decide one rank's status from its result file, its exit, and why the launcher stopped."""
    out, err = (_tail(os.path.join(run_dir, f"rank{rank}.{ext}")) for ext in ("out", "err"))
    where = _read_where(run_dir, rank)
    common = {"rank": rank, "seconds": seconds, "returncode": proc.exitcode, "stdout": out or "", "stderr": err or ""}
    common["where"] = where
    payload = _load_payload(run_dir, rank)
    if payload is None and not exited:  # the launcher killed it
        if first_failed is not None:
            return RankResult(status="aborted", **common, message=f"killed because rank {first_failed} failed first")
        return RankResult(status="timeout", **common, message=_timeout_message(where, timeout))
    fields = classify(proc.exitcode, payload, err or "", timed_out=False)
    if payload is None and err is None:  # no output file: it died before rank_main began
        fields["message"] = (
            "died while starting, before its rank code ran (see the launcher's "
            "stderr; a script must guard its top-level code with "
            "`if __name__ == '__main__':`)"
        )
    return RankResult(**common, **fields)


def _tail(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")[-_TAIL:]
    except FileNotFoundError:
        return None
