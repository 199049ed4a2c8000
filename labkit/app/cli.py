"""The ``labkit`` command: doctor, run, bench, gpu-tier, labs, report, lab.

Errors in what was asked (unknown notebook, unknown parameter, wrong value type, ...) print
one line, ``labkit <command>: error: ...``, and exit with status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

EPILOG = """examples:
  labkit doctor --json
  labkit run                                  # every notebook, profile from the hardware
  labkit run --only start_here --set start_here.REPS=10
  labkit run --profile cpu --params my_overrides.yml
  labkit bench start_here --reference          # GPU tier: write reference/<machine>/start_here.json
  labkit gpu-tier --out gpu-tier-out --part tests --shard 1/4 --split-gpus 2   # the GPU tier, in parts
  labkit labs --markdown
  labkit report --check                       # exit 1 naming each docs block stale against reference/
  labkit lab --port=8899 --no-browser         # JupyterLab on notebooks/ (what `make lab` runs)"""

#: Options of ``jupyter lab`` that choose the folder it serves; given one, ``labkit lab`` adds none.
_ROOT_OPTIONS = ("root_dir", "notebook_dir", "notebook-dir", "preferred_dir")
#: ``jupyter lab``'s options that take NO value (jupyter_server's and jupyterlab's flags, and
#: traitlets' own): after any other ``--option`` without ``=`` the next argument is its value
#: (``--port 8899``), not a folder to serve.
_JUPYTER_FLAGS = frozenset(
    (
        "allow-root autoreload collaborative core-mode custom-css debug dev-mode expose-app-in-browser "
        "extensions-in-dev-mode generate-config no-browser no-script script show-config show-config-json "
        "skip-dev-build splice-source watch y help help-all version"
    ).split()
)


def names_root(extra: list[str]) -> bool:
    """Whether ``jupyter lab EXTRA...`` is told what to serve: a root_dir-like option, or a bare
    argument (a folder or file) that is not the value of the option before it."""
    value_next = False
    for a in extra:
        if value_next:  # the value of the option before (``--port 8899``)
            value_next = False
            continue
        if any(o in a for o in _ROOT_OPTIONS):
            return True
        if a.startswith("-"):
            name = a.lstrip("-")
            value_next = "=" not in name and name not in _JUPYTER_FLAGS
            continue
        return True
    return False


def lab_argv(extra: list[str], euid: int | None = None) -> list[str]:
    """The command ``labkit lab EXTRA...`` runs: JupyterLab from this Python on the workbook.

    It serves notebooks/ unless ``extra`` names a folder (a path, or a root_dir/notebook_dir option;
    an option's value counts as one whether given with ``=`` or after a space: ``--port 8899``).
    As root (the usual user in containers on GPU clouds) it adds ``--allow-root``: without it
    jupyter exits at once with "Running as root is not recommended". ``extra`` comes last, so a
    reader's options (port, token, ip, --no-browser, ...) are passed through as given."""
    from labkit.app.runner.notebooks import NOTEBOOKS_DIR

    euid = os.geteuid() if euid is None and hasattr(os, "geteuid") else euid
    argv = [sys.executable, "-m", "jupyterlab"]
    if euid == 0 and "--allow-root" not in extra:
        argv.append("--allow-root")
    if not names_root(extra):
        argv.append(f"--ServerApp.root_dir={NOTEBOOKS_DIR}")
    return argv + list(extra)


#: ``labkit check --checker`` choices: the keys of ``labkit.check.CHECKERS`` (named here so that
#: ``labkit --help`` stays instant; tests/check/test_check_cli.py compares the two)
CHECKER_NAMES = ("device_independence", "stream_safety", "no_host_sync", "graph_safe", "collective")


def _parser() -> argparse.ArgumentParser:
    """The ``labkit`` parser: one subcommand each, in the order ``labkit --help`` lists them."""
    p = argparse.ArgumentParser(
        prog="labkit",
        description="A workbook of multi-GPU bugs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    _add_doctor(sub)
    _add_run(sub)
    _add_bench(sub)
    _add_gpu_tier(sub)
    _add_labs(sub)
    _add_report(sub)
    _add_check(sub)
    _add_lab(sub)
    return p


def _add_doctor(sub) -> None:
    d = sub.add_parser("doctor", help="versions, GPUs, peer access, topology, and what each lab can do here")
    d.add_argument("--json", action="store_true", help="print the report as JSON")


def _add_run(sub) -> None:
    r = sub.add_parser("run", help="execute notebooks with papermill into runs/<timestamp>_<profile>/")
    r.add_argument(
        "--only",
        nargs="+",
        action="extend",
        metavar="LAB",
        help="the notebooks to run, by their lab's name (notebooks/03_stream_races.ipynb is stream_races; repeatable)",
    )
    r.add_argument("--profile", default="auto", help="auto (from the hardware), cpu or gpu")
    r.add_argument("--params", metavar="FILE", help="YAML {lab: {NAME: value}} overrides")
    r.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="LAB.NAME=VALUE",
        help="one override, value read as YAML; may be repeated",
    )
    r.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="limit per notebook in seconds, whole notebook (default: the profile's timeout_s)",
    )
    r.add_argument("--runs-dir", metavar="DIR", help="where run folders go (default: runs/)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument(
        "--solutions",
        action="store_true",
        help="run each exercise's solution in place of its starter (the notebooks on disk are not changed)",
    )
    r.add_argument(
        "--exercises-only",
        action="store_true",
        help="run only each notebook's exercise cells (parameters, import labkit, statements, answers, checks)",
    )


def _add_bench(sub) -> None:
    b = sub.add_parser("bench", help="run a lab's benchmark and write its results JSON")
    b.add_argument("lab", help="the benchmark to run: a lab's (e.g. start_here, collectives_tune), doctor or checkers")
    b.add_argument("--profile", default="auto", help="auto, cpu or gpu (sizes)")
    b.add_argument("--reference", action="store_true", help="write as reference/<machine>/<lab>.json")
    b.add_argument("--out", metavar="DIR", help="folder instead of the default")


def _add_gpu_tier(sub) -> None:
    from labkit.app import gpu_tier

    g = sub.add_parser(
        "gpu-tier",
        help="the GPU tier: tests, notebooks and reference benchmarks at full size, in parts (gpu_tier.json)",
        description=gpu_tier.description(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gpu_tier.add_arguments(g)


def _add_labs(sub) -> None:
    lb = sub.add_parser("labs", help="the map of labs")
    lb.add_argument("--markdown", action="store_true", help="print the README's lab table")
    lb.add_argument("--wide", action="store_true", help="with --markdown: the table of docs/labs.md")


def _add_report(sub) -> None:
    rp = sub.add_parser(
        "report",
        help="the measured numbers of README.md and docs/*.md, rendered from reference/*.json",
        description="Render every <!-- report:NAME --> block of README.md and docs/*.md from the reference files.",
    )
    rp_mode = rp.add_mutually_exclusive_group()
    rp_mode.add_argument("--write", action="store_true", help="rewrite every block in place")
    rp_mode.add_argument("--check", action="store_true", help="exit 1 naming each block that differs from its renderer")
    rp.add_argument("--figures", action="store_true", help="also draw the figures into docs/figures/")
    rp.add_argument("--block", metavar="NAME", help="print one block's Markdown")


def _add_check(sub) -> None:
    ck = sub.add_parser(
        "check",
        help="point one of labkit.check's checkers at your own function",
        description="Run a checker (docs/checkers.md) on FUNCTION, whose inputs FACTORY builds: "
        "FACTORY(device) -> (args, kwargs). Both are MODULE:NAME, imported from the current folder "
        "and the Python path. Exit status: 0 passed or skipped (the line says why), 1 found the bug "
        "or could not tell, 2 bad input.",
    )
    ck.add_argument("function", metavar="MODULE:FUNCTION", help="the function to check")
    ck.add_argument("--inputs", required=True, metavar="MODULE:FACTORY", help="make_inputs(device) -> (args, kwargs)")
    ck.add_argument("--checker", required=True, choices=CHECKER_NAMES, help="which checker")
    ck.add_argument("--world-size", type=int, default=2, metavar="N", help="collective: ranks (default 2)")
    ck.add_argument("--reference", default="all_reduce", help="collective: all_reduce, all_gather or reduce_scatter")
    ck.add_argument("--vary", metavar="MODULE:FUNCTION", help="graph_safe: vary(args, kwargs, step)")
    ck.add_argument("--timeout", type=float, metavar="SECONDS", help="device_independence, collective: time limit")


def _add_lab(sub) -> None:
    sub.add_parser(
        "lab",
        help="start JupyterLab on notebooks/ (adds --allow-root as root); "
        "other arguments go to jupyter lab, e.g. --port=8899 --IdentityProvider.token=abc",
        usage="labkit lab [JUPYTER LAB ARGUMENTS ...]",
        description="JupyterLab from this Python, serving notebooks/. Every argument goes to "
        "jupyter lab (its own options: jupyter lab --help-all).",
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "lab":
        return _lab(extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    # Imported here so that `labkit --help` is instant and tier set-up happens once.
    import labkit  # noqa: F401
    from labkit.workbench.errors import UsageError

    try:
        return _dispatch(args)
    except UsageError as e:  # one line, as promised, whatever the message holds
        print(f"labkit {args.command}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


def _lab(extra: list[str]) -> int:
    """Replace this process by JupyterLab: signals (Ctrl+C, a test's kill) reach the server itself."""
    argv = lab_argv(extra)
    print("labkit lab: " + " ".join(argv), file=sys.stderr, flush=True)
    os.execv(argv[0], argv)
    return 1  # not reached


def _dispatch(args) -> int:
    if args.command == "doctor":
        from labkit.app import doctor

        rep = doctor.collect()
        print(doctor.to_json(rep) if args.json else doctor.format_text(rep))
        return 0
    if args.command == "run":
        from labkit.app.runner import execute, run
        from labkit.workbench.sandbox import signals_raise

        # SIGINT and SIGTERM raise, so the run's cleanup and summary happen; then one line
        with signals_raise():
            try:
                report = run(
                    only=args.only,
                    profile=args.profile,
                    params_file=args.params,
                    sets=args.sets,
                    runs_dir=args.runs_dir,
                    timeout_s=args.timeout,
                    progress=not args.no_progress,
                    solutions=args.solutions,
                    exercises_only=args.exercises_only,
                )
                print(report.table())
                print(f"index: {report.run_dir / 'index.html'}")
            except (KeyboardInterrupt, SystemExit) as e:
                why = execute.stopped_by(e)
                if not why.startswith(("interrupted (", "terminated (")):
                    raise
                where = f"; the run folder holds what finished: {e.run_dir}" if hasattr(e, "run_dir") else ""
                print(f"labkit run: {why}{where}", file=sys.stderr)
                return 130 if isinstance(e, KeyboardInterrupt) else e.code
        return report.exit_code
    if args.command == "bench":
        from labkit.app import benchmarks
        from labkit.app.runner.execute import choose_profile
        from labkit.workbench.gates import HardwareUnavailable

        try:
            path = benchmarks.run(args.lab, choose_profile(args.profile), args.out, args.reference)
        except HardwareUnavailable as e:  # a skip, said in one line, is not a failure
            print(f"labkit bench {args.lab}: skipped: {e}")
            return 0
        print(f"wrote {path}")
        return 0
    if args.command == "gpu-tier":
        from labkit.app import gpu_tier

        if args.list_parts:
            print("\n".join(gpu_tier.parts()))
            return 0
        return gpu_tier.run(gpu_tier.options(args))
    if args.command == "labs":
        from labkit.app import catalogue

        if args.markdown:
            print(catalogue.markdown_table(wide=args.wide))
        else:
            for lab in catalogue.LABS:
                print(f"{lab.name:<18} {lab.status:<8} {lab.title}")
        return 0
    if args.command == "report":
        return _report(args)
    if args.command == "check":
        return _check(args)
    raise AssertionError(args.command)


def _check(args) -> int:
    """``labkit check``: one checker's report, its exit status 0 (passed, skipped) or 1."""
    import labkit

    here = os.getcwd()  # the user's modules, as `python -m` finds them; children inherit the path
    if here not in sys.path:
        sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    checker = labkit.check.CHECKERS[args.checker]
    kwargs = {}
    if args.timeout is not None:
        kwargs["timeout"] = args.timeout
    if args.checker == "collective":
        rep = checker(args.function, args.world_size, args.inputs, reference=args.reference, **kwargs)
    elif args.checker == "graph_safe":
        vary = labkit.check.report.resolve("graph_safe", "--vary", args.vary) if args.vary else None
        rep = checker(args.function, args.inputs, vary)
    elif args.checker == "device_independence":
        rep = checker(args.function, args.inputs, **kwargs)
    else:
        rep = checker(args.function, args.inputs)
    print(rep.text())
    return 0 if rep.status in ("passed", "skipped") else 1


def _report(args) -> int:
    from labkit.app import report

    if args.block:
        print(report.render(args.block), end="")
        return 0
    if args.figures:
        for path in report.draw_figures():
            print(f"drew {path}")
    if args.write:
        for path in report.write():
            print(f"rewrote {path}")
        return 0
    stale = report.stale()
    for line in stale:
        print(f"stale: {line} (labkit report --write renders it)")
    if not stale:
        print("every report block matches the reference files")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
