"""Digest every labkit Triton kernel's sm_90 PTX, to show a refactor left them byte-identical.

    python scripts/ptx_digest.py --tree PATH --out FILE.json   # digest the labkit under PATH
    python scripts/ptx_digest.py --compare A.json B.json       # identical / different / missing

``--tree`` works in fresh processes that put PATH first on ``sys.path`` (the recorder without
PYTHONPATH) and stop unless ``labkit`` is imported from PATH, so it digests that tree only:

1. Record (``TRITON_INTERPRET=1``). Import every module under ``PATH/labkit``; every module-level
   ``@triton.jit`` function defined there is a JIT function. The *kernels* are those no other JIT
   function refers to (helpers are covered through the kernels that inline them). Then
   ``InterpretedFunction.run`` is replaced by a recorder, which binds a launch's arguments
   exactly as ``JITFunction.run`` would for ``GPUTarget("cuda", 90, 32)`` (Triton's own binder:
   argument types, constexprs with their defaults, 16-divisible ints and pointers) and does NOT
   run the kernel. ``_drive_kernels`` and ``_drive_labs`` call labkit's public launchers with
   small CPU tensors;
   ``TABLE`` gives hand-written signatures for the kernels that only a multi-rank world
   launches (the collectives, the barriers, the lab kernels; as ``labs/collectives/ptx.py``).
2. Compile (``TRITON_INTERPRET=0``, a pool of 2 spawned processes, a fresh Triton cache):
   ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` per recorded
   specialisation, no GPU needed.
3. Write ``{"<kernel>[<specialisation>]": sha256 of the normalised PTX}``, sorted.

A kernel is keyed by its function name (``<module's last component>.<name>`` only when two
kernels share a name), never by its file, so moving or splitting modules keeps the keys. The
specialisation label lists every argument in order: ``name=value`` for a constexpr,
``name:type`` for the rest, with ``/16`` where Triton specialises it as 16-divisible.

Normalisation, before hashing (everything else is hashed byte for byte):

* ``.file`` and ``.loc`` directives (source paths and line numbers);
* ``.section .debug_*`` blocks, from the directive to the line holding only its closing ``}``
  (or the directive line alone, when it holds its ``{ }``): DWARF, with paths and lines;
* ``$L__tmp<N>:``, ``$L__func_begin<N>:``, ``$L__func_end<N>:`` labels (the debug sections'
  anchors; no instruction branches to them);
* every ``//`` comment (to the end of the line; inline-asm markers, LLVM's banner; PTX has
  no string literals), trailing whitespace, and the lines that become empty.

Exit status 1 when a kernel was found but never launched by a driver nor listed in ``TABLE``
(unless ``UNCOVERED_OK`` gives the reason) or when a specialisation fails to compile.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

#: kernel name -> why it has no specialisation (none: every kernel is covered)
UNCOVERED_OK: dict[str, str] = {}

#: constexpr values the TABLE kernels share (a parameter's own default wins over these)
_TABLE_CONSTEXPRS = {"WORLD": 4, "MAX_BLOCKS": 128, "BLOCK": 2048, "SEM": 0, "END_BARRIER": True}

#: kernel -> variants (constexpr overrides, plus "_dtype" for the *T pointers); pointer params
#: named *_ptrs are int64 address tables, *_ptr the element type, every other param an int32
TABLE: dict[str, list[dict]] = {
    "one_shot_all_reduce_kernel": [{}, {"SEM": 1}, {"WORLD": 8, "_dtype": "fp32"}, {"END_BARRIER": False}],
    "two_shot_all_reduce_kernel": [{}, {"SEM": 1}, {"WORLD": 8, "_dtype": "fp32"}],
    "two_shot_all_reduce_in_place_kernel": [{}, {"SEM": 1}, {"WORLD": 8}],
    "two_shot_push_into_kernel": [{}, {"SEM": 1}, {"WORLD": 8}],
    "two_shot_ce_kernel": [{"UNIT": 64}, {"UNIT": 64, "WORLD": 8}],
    "reduce_scatter_kernel": [{}, {"SEM": 1}, {"WORLD": 8}],
    "all_gather_kernel": [{}, {"ROTATE": False}, {"WORLD": 8, "SEM": 1}],
    "tree_all_reduce_kernel": [{"GUARD_LEAF": True}, {"GUARD_LEAF": False}, {"GUARD_LEAF": True, "WORLD": 8}],
    "barrier_kernel": [{}, {"SEM": 1}, {"SEM": 2, "WORLD": 8}],
    "push_one_shot_kernel": [{"MAX_BLOCKS": 264, "BLOCK": 1024}, {"MAX_BLOCKS": 264, "BLOCK": 1024, "COUNTS": False}],
    "fid_one_shot_kernel": [
        {"MAX_BLOCKS": 132, "BLOCK": 1024, "BITS": "dtype:int16", "SENTINEL": -32768},
        {"MAX_BLOCKS": 132, "BLOCK": 1024, "BITS": "dtype:int32", "SENTINEL": -(2**31), "_dtype": "fp32"},
    ],
    "_pair_barrier_kernel": [{"MAX_BLOCKS": 128, "BARRIER": "jit:signal_then_wait"}],
    "link_copy_kernel": [{"BLOCK": 4096, "_dtype": "fp32"}],
    "_grid_stride_probe": [{"BLOCK": 16, "_dtype": "fp32"}],
}


# --- the recording process --------------------------------------------------------------------


def _isolate(tree: str) -> None:
    """Import labkit from ``tree`` only."""
    sys.path[:] = [tree] + [p for p in sys.path if p and Path(p).resolve() != Path.cwd().resolve()]
    import labkit

    if not Path(labkit.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"labkit imported from {labkit.__file__}, not from {tree}")


def _jit_functions(tree: str) -> tuple[dict, list[str]]:
    """(module, name) -> JIT object for every module-level ``@triton.jit`` under tree/labkit,
    and the modules that failed to import."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    found, failed = {}, []
    root = Path(tree)
    for path in sorted((root / "labkit").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__main__":  # a command line: importing it runs it
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        try:
            module = importlib.import_module(name)
        except Exception as e:  # reported, never fatal: its kernels show up as uncovered
            failed.append(f"{name}: {type(e).__name__}: {e}")
            continue
        for attr, obj in sorted(vars(module).items()):
            if isinstance(obj, (JITFunction, InterpretedFunction)) and obj.fn.__module__ == name:
                if obj.fn.__name__ == attr:
                    found[(name, attr)] = obj
    return found, failed


def _referenced(jit_objects: dict) -> set[int]:
    """ids of the JIT objects some JIT function's body names (a call or a reference)."""
    import ast
    import inspect
    import textwrap

    ids = {id(o) for o in jit_objects.values()}
    used = set()
    for obj in jit_objects.values():
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj.fn)))
        scope = obj.fn.__globals__
        for node in ast.walk(tree):
            target = None
            if isinstance(node, ast.Name):
                target = scope.get(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                target = getattr(scope.get(node.value.id), node.attr, None)
            if target is not obj and id(target) in ids:
                used.add(id(target))
    return used


def _keys(jit_objects: dict) -> dict[tuple, str]:
    """(module, name) -> key: the function name, with the module's last component on a clash."""
    names = [n for _, n in jit_objects]
    return {(m, n): (n if names.count(n) == 1 else f"{m.rsplit('.', 1)[-1]}.{n}") for m, n in jit_objects}


def _encode(value, key_of_id: dict):
    """A constexpr value as JSON: plain values as they are, dtypes and JIT functions tagged."""
    import triton.language as tl

    if isinstance(value, tl.constexpr):
        value = value.value
    if isinstance(value, tl.dtype):
        return f"dtype:{value.name}"
    if id(value) in key_of_id:
        return f"jit:{key_of_id[id(value)]}"
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, key_of_id) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"constexpr value {value!r} of type {type(value).__name__} has no encoding")


def _spec(signature: dict, constexprs: dict, attrs: dict, options: dict, key_of_id: dict) -> dict:
    return {
        "signature": [[name, ty] for name, ty in signature.items()],  # in parameter order
        "constexprs": sorted([list(p), _encode(v, key_of_id)] for p, v in constexprs.items()),
        "attrs": sorted([list(p), a] for p, a in attrs.items()),
        "options": dict(sorted(options.items())),
    }


class Recorder:
    """Replaces ``InterpretedFunction.run``: binds a launch for sm_90 and keeps its spec."""

    def __init__(self, kernels: dict, key_of_id: dict):
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        self.kernels = {id(o): k for k, o in kernels.items()}
        self.key_of_id = key_of_id
        self.backend = make_backend(GPUTarget("cuda", 90, 32))
        self.binders: dict[int, tuple] = {}
        self.specs: dict[str, set[str]] = {}
        self.foreign: set[str] = set()

    def _binder(self, fn):
        from triton.runtime.jit import JITFunction, create_function_from_signature

        if id(fn) not in self.binders:
            options = {
                k: v for k, v in fn.kwargs.items() if k in ("do_not_specialize", "do_not_specialize_on_alignment")
            }
            jf = JITFunction(fn.fn, **options)
            self.binders[id(fn)] = (jf, create_function_from_signature(jf.signature, jf.params, self.backend))
        return self.binders[id(fn)]

    def run(self, fn, args, kwargs) -> None:
        key = self.kernels.get(id(fn))
        if key is None:
            self.foreign.add(f"{fn.fn.__module__}.{fn.fn.__name__}")
            return
        jf, binder = self._binder(fn)
        bound, specialization, options = binder(*args, **kwargs)
        _, signature, constexprs, attrs = jf._pack_args(self.backend, kwargs, bound, specialization, options)
        picked = {k: v for k, v in kwargs.items() if k not in jf.arg_names}  # compile options
        spec = _spec(signature, constexprs, attrs, picked, self.key_of_id)
        self.specs.setdefault(key, set()).add(json.dumps(spec))

    def install(self) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        recorder = self

        def run(self, *args, grid, warmup, **kwargs):
            recorder.run(self, args, kwargs)

        InterpretedFunction.run = run


def _table_spec(obj, variant: dict, key_of_name: dict) -> dict:
    """A spec from the parameters' names: *_ptrs int64 tables, *_ptr the element type, else i32."""
    import inspect

    params = inspect.signature(obj.fn).parameters
    dtype = variant.get("_dtype", "bf16")
    signature, constexprs = {}, {}
    for i, (name, p) in enumerate(params.items()):
        if "constexpr" in str(p.annotation):
            signature[name] = "constexpr"
            value = variant.get(name, p.default if p.default is not p.empty else _TABLE_CONSTEXPRS.get(name))
            if value is None:
                raise KeyError(f"TABLE: {obj.fn.__name__}: no value for constexpr {name}")
            if isinstance(value, str) and value.startswith("jit:"):
                value = f"jit:{key_of_name[value[4:]]}"
            constexprs[(i,)] = value
        else:
            signature[name] = "*i64" if name.endswith("_ptrs") else f"*{dtype}" if name.endswith("_ptr") else "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(params) if signature[n].startswith("*")}
    return _spec(signature, constexprs, attrs, {}, {})


def _drive_kernels() -> None:
    """Small launches through the public launchers (each one's kernels are recorded, not run)."""
    import torch

    import labkit.kernels as k
    from labkit.kernels.fp8 import cast as fp8_cast
    from labkit.labs.wrong_device import experiments

    g = torch.Generator().manual_seed(0)
    for _, (launch, make) in sorted(k.LAUNCHERS.items()):
        _try(launch, *make(g))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        _try(k.copy, torch.randn(1 << 20).to(dtype))
        _try(k.copy, torch.randn(1000).to(dtype))
        _try(k.triton_matmul, torch.randn(96, 64).to(dtype), torch.randn(64, 80).to(dtype))
        x, w = torch.randn(70, 64).to(dtype), torch.randn(3, 64, 48).to(dtype)
        _try(k.grouped_mm, x, w, torch.tensor([20, 0, 50]))
        _try(k.grouped_mm, x, w.transpose(1, 2).contiguous().transpose(1, 2), [20, 0, 50])
        _try(k.grouped_mm, x, w, [20, 0, 50], bias=torch.randn(3, 48).to(dtype))
        _try(k.grouped_mm_wgrad, x, torch.randn(70, 48).to(dtype), [20, 0, 50])
        _try(fp8_cast.quantize, torch.randn(4096).to(dtype), torch.ones(1), torch.zeros(1))
        _try(k.sc_matmul, torch.randn(48, 256).to(dtype), torch.randn(256, 80).to(dtype))
    out, dy = torch.zeros(3, 64, 48), torch.randn(70, 48)
    _try(k.grouped_mm_wgrad, torch.randn(70, 64), dy, [20, 0, 50], out=out, accumulate=True)
    _try(k.grouped_mm_wgrad, torch.randn(70, 64), dy, [20, 0, 50], out=out, accumulate=torch.ones(3) > 0)
    _try(fp8_cast.quantize, torch.randn(4096), torch.ones(1), torch.zeros(1), torch.float8_e5m2)
    _try(experiments.add_one, torch.randn(1000))
    _try(k.write_out_of_bounds)
    a, b = torch.randn(48, 256), torch.randn(256, 80)
    _try(k.sc_matmul, a, b, granularity="per_tensor")
    _try(k.sc_matmul, a, b, halve=True)
    _try(k.sc_matmul, torch.randn(2, 48, 256), torch.randn(2, 256, 80))
    _try(k.sc_matmul, torch.randn(1, 256), b)  # one row: K split over programs, then the finalize


def _drive_labs() -> None:
    import torch

    from labkit.kernels.fp8.recipe import FP8Meta
    from labkit.kernels.litmus import run_litmus
    from labkit.labs.collectives import links
    from labkit.labs.fp8_dispatch.bulk_update import bulk_update

    metas = [FP8Meta.create(4, 16, "cpu") for _ in range(3)]
    for algo in ("max", "most_recent"):
        _try(bulk_update, torch.ones(12), metas, 448.0, 0.0, algo)
    _try(links.link_copy, torch.randn(1 << 16), torch.empty(1 << 16))
    for test, semantics, scope, placement in (
        ("MP", "plain", None, "cross_cta"),
        ("SB", "volatile", None, "same_cta"),
        ("MP", "acq_rel", "gpu", "cross_cta"),
        ("IRIW", "relaxed", "sys", "cross_cta"),
        ("SB", "fence_sc", "gpu", "cross_cta"),
    ):
        _try(_litmus_as, run_litmus, test, semantics, scope, placement)


def _litmus_as(run_litmus, test: str, semantics: str, scope, placement: str) -> None:
    """A litmus launch with ``semantics``' inline PTX: the interpreter refuses those, so the
    launch goes through as "plain" with ``ptx_for`` answering for ``semantics``, in every litmus
    module that holds the name (wherever the launch looks it up: the tree's layout may differ)."""
    from labkit.kernels.litmus import run

    ptx_for = run.ptx_for
    holders = [
        m for n, m in list(sys.modules.items()) if n.startswith("labkit.kernels.litmus") and hasattr(m, "ptx_for")
    ]
    for m in holders:
        m.ptx_for = lambda *_: ptx_for(semantics, scope)
    try:
        run_litmus(test, "plain", None, placement, instances=256)
        run_litmus(test, "plain", None, placement, instances=256, stress=run.Stress(barrier=True))
    finally:
        for m in holders:
            m.ptx_for = ptx_for


_FAILED_DRIVES: list[str] = []


def _try(fn, *args, **kwargs) -> None:
    """One driver call; a failure is reported (its kernels then show up as uncovered)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:
        _FAILED_DRIVES.append(f"{getattr(fn, '__name__', fn)}: {type(e).__name__}: {str(e)[:160]}")


def record(tree: str) -> dict:
    """Every kernel of the tree and its specs (the recording process's whole job)."""
    _isolate(tree)
    jit_objects, failed_imports = _jit_functions(tree)
    keys = _keys(jit_objects)
    key_of_id = {id(o): keys[mk] for mk, o in jit_objects.items()}
    used = _referenced(jit_objects)
    kernels = {keys[mk]: o for mk, o in jit_objects.items() if id(o) not in used}
    recorder = Recorder({keys[mk]: o for mk, o in jit_objects.items()}, key_of_id)
    recorder.install()
    _drive_kernels()
    _drive_labs()
    key_of_name = {n: keys[(m, n)] for m, n in jit_objects}
    for name, variants in sorted(TABLE.items()):
        obj = next((o for (_, n), o in jit_objects.items() if n == name), None)
        if obj is None:
            _FAILED_DRIVES.append(f"TABLE: no JIT function named {name}")
            continue
        for variant in variants:
            spec = _table_spec(obj, variant, key_of_name)
            recorder.specs.setdefault(key_of_id[id(obj)], set()).add(json.dumps(spec))
    values = [v for s in recorder.specs.values() for j in s for _, v in json.loads(j)["constexprs"]]
    as_constexpr = {v[4:] for v in values if isinstance(v, str) and v.startswith("jit:")}
    return {
        "kernels": sorted(k for k in kernels if k not in as_constexpr),
        "modules": {keys[mk]: list(mk) for mk in jit_objects},
        "specs": {k: sorted(v) for k, v in sorted(recorder.specs.items())},
        "notes": sorted(failed_imports) + list(dict.fromkeys(_FAILED_DRIVES)),
        "foreign": sorted(recorder.foreign),
    }


# --- the compiling processes ------------------------------------------------------------------

_MODULES: dict = {}


def _compiler_init(tree: str, modules: dict) -> None:
    os.environ["TRITON_INTERPRET"] = "0"
    _isolate(tree)
    _MODULES.update(modules)


def _decode(value):
    import triton.language as tl

    if isinstance(value, dict):
        return tuple(_decode(v) for v in value["tuple"])
    if isinstance(value, str) and value.startswith("dtype:"):
        return tl.dtype(value[6:])
    if isinstance(value, str) and value.startswith("jit:"):
        module, name = _MODULES[value[4:]]
        return getattr(importlib.import_module(module), name)
    return value


def compile_spec(key: str, spec: dict) -> tuple[str, str, str]:
    """(key, label, sha256 of the normalised PTX, or "error: ...")."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    label = spec_label(spec)
    try:
        module, name = _MODULES[key]
        fn = getattr(importlib.import_module(module), name)
        constexprs = {tuple(p): _decode(v) for p, v in spec["constexprs"]}
        attrs = {tuple(p): [list(a) for a in v] for p, v in spec["attrs"]}
        source = ASTSource(fn=fn, signature=dict(spec["signature"]), constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=spec["options"])
        return key, label, hashlib.sha256(normalise_ptx(compiled.asm["ptx"]).encode()).hexdigest()
    except Exception as e:
        return key, label, f"error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def spec_label(spec: dict) -> str:
    """Every argument in order: ``name=value`` (constexpr) or ``name:type`` (``/16``: divisible)."""
    constexprs = {p[0]: v for p, v in spec["constexprs"] if len(p) == 1}
    divisible = {p[0] for p, a in spec["attrs"] if len(p) == 1 and ["tt.divisibility", 16] in a}
    parts = []
    for i, (name, ty) in enumerate(spec["signature"]):
        if ty == "constexpr":
            parts.append(f"{name}={constexprs.get(i)}")
        else:
            parts.append(f"{name}:{ty}{'/16' if i in divisible else ''}")
    parts += [f"{k}={v}" for k, v in spec["options"].items()]
    return ",".join(parts)


_DEBUG_SECTION = re.compile(r"^\s*\.section\s+\.debug_")
_DROPPED_LINE = re.compile(r"^\s*(\.file\b|\.loc\b|\$L__(tmp|func_begin|func_end)\d+:)")


def normalise_ptx(ptx: str) -> str:
    """The PTX without what depends on file paths or line numbers (module docstring)."""
    lines, in_debug = [], False
    for line in ptx.splitlines():
        line = line.split("//", 1)[0].rstrip()
        if _DEBUG_SECTION.match(line):
            in_debug = "}" not in line  # a one-line section ``{ }`` ends where it starts
            continue
        if in_debug:
            in_debug = line.strip() != "}"
            continue
        if line and not _DROPPED_LINE.match(line):
            lines.append(line)
    return "\n".join(lines) + "\n"


# --- the driver -------------------------------------------------------------------------------


def _run_recorder(tree: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRITON_INTERPRET"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import ptx_digest as d; "
        code += f"open({str(out)!r}, 'w').write(__import__('json').dumps(d.record({tree!r})))"
        subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp, check=True, timeout=600)
        return json.loads(out.read_text())


def digest(tree: str, out: str) -> int:
    start = time.monotonic()
    tree = str(Path(tree).resolve())
    recorded = _run_recorder(tree)
    jobs = [(k, json.loads(s)) for k, specs in recorded["specs"].items() for s in specs]
    os.environ.pop("PYTHONPATH", None)
    os.environ["TRITON_INTERPRET"] = "0"
    results = {}
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TRITON_CACHE_DIR"] = cache
        context = multiprocessing.get_context("spawn")
        init = (tree, recorded["modules"])
        with ProcessPoolExecutor(2, mp_context=context, initializer=_compiler_init, initargs=init) as pool:
            for key, label, digest_ in pool.map(compile_spec, *zip(*jobs)):
                results[f"{key}[{label}]"] = digest_
    errors = sorted(k for k, v in results.items() if v.startswith("error"))
    compiled = {k for k, v in results.items() if not v.startswith("error")}
    covered = {k.split("[", 1)[0] for k in compiled}
    uncovered = [k for k in recorded["kernels"] if k not in covered and k not in UNCOVERED_OK]
    Path(out).write_text(json.dumps(dict(sorted(results.items())), indent=1) + "\n")
    per_kernel = {k: sum(1 for c in compiled if c.split("[", 1)[0] == k) for k in recorded["kernels"]}
    for k, n in per_kernel.items():
        print(f"{n:3d}  {k}" + (f"  (uncovered: {UNCOVERED_OK[k]})" if k in UNCOVERED_OK else ""))
    helpers_compiled = sorted(covered - set(recorded["kernels"]))
    print(
        f"{len(covered & set(recorded['kernels']))}/{len(recorded['kernels'])} kernels, {len(compiled)} specialisations"
    )
    for title, items in (
        ("also compiled (helpers launched directly)", helpers_compiled),
        ("notes", recorded["notes"]),
        ("launched, not module-level JIT functions", recorded["foreign"]),
        ("compile errors", [f"{k}: {results[k]}" for k in errors]),
        ("UNCOVERED kernels", uncovered),
    ):
        for item in items:
            print(f"{title}: {item}")
    print(f"wrote {out} in {time.monotonic() - start:.0f} s")
    return 1 if uncovered or errors else 0


def compare(a: str, b: str) -> int:
    """identical / different / missing per key; non-zero unless every key is identical."""
    old, new = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    bad = 0
    for key in sorted(set(old) | set(new)):
        if key not in new or key not in old:
            state = f"missing in {b if key not in new else a}"
        else:
            state = "identical" if old[key] == new[key] else "different"
        bad += state != "identical"
        print(f"{state:10s}  {key}")
    print(f"{len(set(old) | set(new)) - bad} identical, {bad} different or missing")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", help="a checkout whose labkit/ to digest")
    parser.add_argument("--out", help="where --tree writes its digests (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two digest files")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not (args.tree and args.out):
        parser.error("give --tree PATH --out FILE.json, or --compare A.json B.json")
    return digest(args.tree, args.out)


if __name__ == "__main__":
    sys.exit(main())
