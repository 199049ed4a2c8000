#!/usr/bin/env bash
# The GPU tier: the same tests and notebooks as CI, at full size, plus the reference benchmarks.
# Run it on a GPU node from the repository root:
#
#   bash scripts/gpu_tier.sh --out DIR [--part PART]... [--only NOTEBOOK]... [-k EXPR] [--shard K/N] [--split-gpus G]
#                            [--wheels WHEELDIR] [--python PY] [--dry-run]
#   bash scripts/gpu_tier.sh --list-parts      # the valid parts, one a line
#
# --part: what to run (default: all). Give it several times for several parts; they run in the
#         order of this list, each once. Parts that fit one call of a few minutes each:
#   all              everything below (the whole tier, as one long call)
#   doctor           labkit doctor                                  -> doctor.txt
#   tests            pytest without the notebook tests (-m "not notebook"; the notebooks run in
#                    the part 'notebooks' instead, once)            -> pytest.log, pytest.xml
#                    (with --shard K/N: pytest-K-of-N.log, .xml)
#   notebooks        every notebook with the gpu profile (labkit run) -> runs/
#   bench            every reference benchmark below
#   bench:LAB        one reference benchmark, labkit bench LAB --profile gpu --reference, LAB one of
#                    doctor workbench sc_kernel sc_launch device_guard sc_model streams
#                    collectives collectives_tune links grouped_gemm grouped_gemm_tune fp8 litmus
#                    litmus_two_gpus broken_barriers
#                                                                -> reference/<machine>/LAB.json
#                    (litmus and litmus_two_gpus stop starting rows after LABKIT_LITMUS_BUDGET_S,
#                    default 480 s, and record the rest as pending; run again with
#                    LABKIT_LITMUS_RESUME=DIR/reference/<machine>/LAB.json to finish them;
#                    litmus runs its one-GPU rows on every GPU at once, a worker per GPU, and
#                    the tests in LABKIT_LITMUS_FIRST, e.g. IRIW,2+2W, before the others;
#                    broken_barriers starts no spawn after LABKIT_BARRIERS_BUDGET_S, default
#                    480 s, and records the rows left as "not started"; run again with
#                    LABKIT_BARRIERS_RESUME=DIR/reference/<machine>/broken_barriers.json to finish them)
# --only NOTEBOOK: the part 'notebooks' runs only these notebooks (repeatable; labkit run --only).
# -k EXPR:  the part 'tests' runs only the tests pytest -k EXPR selects.
# --shard K/N: the part 'tests' runs only the K-th of N shards (a test's shard is its node id's
#           CRC-32 mod N, so adding a test moves no other; the
#           whole suite takes longer than one 10-minute call on 2 GPUs). The step is named
#           tests-K-of-N in gpu_tier.json, so the shards of several calls add up there.
# --split-gpus G: the part 'tests' runs as G pytest processes at once, process i seeing GPU i alone
#           (CUDA_VISIBLE_DEVICES=i; the tests, or the shard's, dealt by node id), then one pytest
#           seeing every GPU runs the tests they skipped (the multi-GPU ones among them). Steps
#           tests[-K-of-N]-gpuI and tests[-K-of-N]-all-gpus; logs pytest[-K-of-N]-gpuI.log,
#           pytest[-K-of-N]-all-gpus.log, and .skipped (the node ids handed on).
# --wheels: a folder of wheels made beforehand by scripts/prepare_wheels.sh on a machine with a
#           package registry, for nodes that lack papermill/nbclient/ipykernel/ipywidgets. They are
#           installed into DIR's own site folder (nothing on the node is changed).
# --dry-run: print the steps the parts select, one a line, and run nothing.
# Writes into DIR: doctor.txt, pytest.log + pytest.xml, runs/ (executed notebooks, summary,
# index), reference/<machine>/<lab>.json (to be committed), and gpu_tier.json (each step's
# part, exit code and duration). Calls with the same DIR add to gpu_tier.json: a step run again
# replaces its earlier entry. Where the tree was copied without .git, set LABKIT_GIT_COMMIT so
# the results still name the commit they were made from. Every step runs even if an earlier one
# failed; the exit code is non-zero if any step of this call failed (2: the arguments are wrong).
set -uo pipefail
# The benchmarks, in the order they run: the registry labkit.workbench.benchmarks.BENCHMARKS (a test
# checks the two agree).
labs=(doctor workbench sc_kernel sc_launch device_guard sc_model streams collectives collectives_tune links grouped_gemm grouped_gemm_tune fp8 litmus litmus_two_gpus broken_barriers)
valid=(all doctor tests notebooks bench "${labs[@]/#/bench:}")
usage_line="usage: gpu_tier.sh --out DIR [--part PART]... [--only NOTEBOOK]... [-k EXPR] [--shard K/N] [--split-gpus G] [--wheels DIR] [--python PY] [--dry-run] | --list-parts"
out="" wheels="" py=${PYTHON:-python3} kexpr="" shard="" split="" dry=0
parts=() only=()
value() {  # value OPTION ARGS...: the value after OPTION, or exit 2
  [ $# -ge 2 ] && [ -n "$2" ] || { echo "gpu_tier.sh: $1 needs a value ($usage_line)" >&2; exit 2; }
}
while [ $# -gt 0 ]; do
  case "$1" in
    --out) value "$@"; out=$2; shift 2 ;;
    --wheels) value "$@"; wheels=$2; shift 2 ;;
    --python) value "$@"; py=$2; shift 2 ;;
    --part) value "$@"; parts+=("$2"); shift 2 ;;
    --only) value "$@"; only+=("$2"); shift 2 ;;
    -k) value "$@"; kexpr=$2; shift 2 ;;
    --shard) value "$@"; shard=$2; shift 2 ;;
    --split-gpus) value "$@"; split=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --list-parts) printf '%s\n' "${valid[@]}"; exit 0 ;;
    -h|--help) sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "gpu_tier.sh: unknown argument $1 ($usage_line)" >&2; exit 2 ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || parts=(all)
for p in "${parts[@]}"; do
  [[ " ${valid[*]} " == *" $p "* ]] || {
    echo "gpu_tier.sh: unknown part '$p'; valid parts: ${valid[*]}" >&2; exit 2; }
done
[ -n "$out" ] || { echo "gpu_tier.sh: --out DIR is required" >&2; exit 2; }
if [ -n "$shard" ]; then
  [[ $shard =~ ^([0-9]+)/([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1 ] && [ "${BASH_REMATCH[1]}" -le "${BASH_REMATCH[2]}" ] || {
    echo "gpu_tier.sh: --shard needs K/N with 1 <= K <= N, e.g. 1/3 (got '$shard'; $usage_line)" >&2; exit 2; }
fi
if [ -n "$split" ]; then
  [[ $split =~ ^[0-9]+$ ]] && [ "$split" -ge 2 ] || {
    echo "gpu_tier.sh: --split-gpus needs a number of GPUs G >= 2 (got '$split'; $usage_line)" >&2; exit 2; }
fi
wanted() {  # wanted PART: was PART asked for, itself or through 'all' or 'bench'?
  local p
  for p in "${parts[@]}"; do
    [ "$p" = all ] || [ "$p" = "$1" ] || { [ "$p" = bench ] && [[ $1 == bench:* ]]; } && return 0
  done
  return 1
}
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "$dry" = 0 ]; then mkdir -p "$out" && out=$(cd "$out" && pwd); fi
cd "$root"
# Multicast stays off on shared multi-GPU hosts (labkit sets these too; children inherit them).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# No MPLBACKEND here: `labkit run` gives each notebook's kernel the inline backend itself (so
# figures appear in the executed notebooks), and the tests that draw choose Agg themselves.
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
if [ -n "$wheels" ] && [ "$dry" = 0 ]; then
  site="$out/.site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl \
    || { echo "gpu_tier.sh: installing wheels from $wheels failed" >&2; exit 1; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"  # labkit without installing it

steps=()
step() {  # step PART NAME COMMAND...: run, log, and remember part, exit code and seconds
  local part=$1 name=$2; shift 2
  local shown
  shown=$(printf '%q ' "$@")
  if [ "$dry" = 1 ]; then echo "$part $name: ${shown% }"; return; fi
  local t0=$SECONDS
  echo "=== gpu_tier: $name: ${shown% }"
  "$@"
  local rc=$?
  steps+=("{\"part\": \"$part\", \"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}")
  echo "=== gpu_tier: $name: exit $rc after $((SECONDS - t0)) s"
}
tee_out() { local log=$1; shift; "$@" | tee "$log"; }         # stdout into LOG as well
tee_all() { local log=$1; shift; "$@" 2>&1 | tee "$log"; }    # stdout and stderr into LOG as well
pytest_args=(-ra -p no:cacheprovider -m "not notebook")
[ -z "$kexpr" ] || pytest_args+=(-k "$kexpr")
tests_step=tests tests_log=pytest shard_k=1 shard_n=1
if [ -n "$shard" ]; then
  shard_k=${shard%/*} shard_n=${shard#*/}
  tests_step="tests-$shard_k-of-$shard_n" tests_log="pytest-$shard_k-of-$shard_n"
fi

tests_split() {  # --split-gpus G: one pytest per GPU at once, then the tests they skipped on every GPU
  local i sub pids=() names=() t0=$SECONDS rc secs
  local skipped="$out/$tests_log.skipped"
  [ "$dry" = 1 ] || rm -f "$skipped" "$skipped".gpu*
  for ((i = 0; i < split; i++)); do
    # the shard dealt again over the GPUs: shard K of N, GPU i of G is shard K + N i of N G
    # (a test's shard is its node id's CRC-32 mod N G: the G of them together are shard K of N)
    sub="$((shard_k + shard_n * i))/$((shard_n * split))"
    local cmd=("$py" -m pytest "${pytest_args[@]}" --labkit-shard "$sub" --labkit-skips-to="$skipped.gpu$i"
               --junitxml="$out/$tests_log-gpu$i.xml")
    if [ "$dry" = 1 ]; then
      echo "tests $tests_step-gpu$i: CUDA_VISIBLE_DEVICES=$i $(printf '%q ' "${cmd[@]}") (at once)"; continue
    fi
    echo "=== gpu_tier: $tests_step-gpu$i: CUDA_VISIBLE_DEVICES=$i $(printf '%q ' "${cmd[@]}")> $out/$tests_log-gpu$i.log"
    (CUDA_VISIBLE_DEVICES=$i "${cmd[@]}" > "$out/$tests_log-gpu$i.log" 2>&1
     echo "$? $((SECONDS - t0))" > "$out/.rc-gpu$i") &  # its own exit code and seconds
    pids+=($!) names+=("$tests_step-gpu$i")
  done
  for ((i = 0; i < ${#pids[@]}; i++)); do
    wait "${pids[$i]}"
    read -r rc secs < "$out/.rc-gpu$i" || { rc=1 secs=$((SECONDS - t0)); }
    rm -f "$out/.rc-gpu$i"
    steps+=("{\"part\": \"tests\", \"step\": \"${names[$i]}\", \"rc\": $rc, \"seconds\": $secs}")
    echo "=== gpu_tier: ${names[$i]}: exit $rc after $secs s; its summary:"
    tail -n 3 "$out/$tests_log-gpu$i.log"
  done
  local cmd=("$py" -m pytest "${pytest_args[@]}" --labkit-nodeids="$skipped" --junitxml="$out/$tests_log-all-gpus.xml")
  if [ "$dry" = 1 ]; then
    echo "tests $tests_step-all-gpus: $(printf '%q ' "${cmd[@]}") (after them: the tests they skipped)"; return
  fi
  cat "$skipped".gpu* > "$skipped" 2>/dev/null
  if [ ! -s "$skipped" ]; then echo "=== gpu_tier: $tests_step-all-gpus: no test was skipped, nothing to run"; return; fi
  echo "=== gpu_tier: the per-GPU runs skipped $(wc -l < "$skipped") tests; now on every GPU"
  step tests "$tests_step-all-gpus" tee_all "$out/$tests_log-all-gpus.log" "${cmd[@]}"
}
run_args=(--profile gpu --runs-dir "$out/runs" --no-progress)
[ ${#only[@]} -eq 0 ] || run_args+=(--only "${only[@]}")

wanted doctor && step doctor doctor tee_out "$out/doctor.txt" "$py" -m labkit doctor
if wanted tests && [ -n "$split" ]; then
  tests_split
elif wanted tests; then
  [ -z "$shard" ] || pytest_args+=(--labkit-shard "$shard")
  step tests "$tests_step" tee_all "$out/$tests_log.log" "$py" -m pytest "${pytest_args[@]}" --junitxml="$out/$tests_log.xml"
fi
wanted notebooks && step notebooks notebooks "$py" -m labkit run "${run_args[@]}"
for lab in "${labs[@]}"; do
  wanted "bench:$lab" && step "bench:$lab" "bench-${lab//_/-}" "$py" -m labkit bench "$lab" --profile gpu --reference --out "$out/reference"
done
[ "$dry" = 0 ] || exit 0
rm -rf "$out/.site"

# gpu_tier.json: this call's steps, added to those of earlier calls with the same DIR.
this=$(IFS=,; echo "{\"parts\": [$(printf '"%s",' "${parts[@]}" | sed 's/,$//')], \"steps\": [${steps[*]}]}")
"$py" - "$out/gpu_tier.json" "$this" <<'EOF' || { echo "gpu_tier.sh: could not merge with the earlier gpu_tier.json; it now holds this call only" >&2; echo "$this" > "$out/gpu_tier.json"; }
import json, os, sys
path, new = sys.argv[1], json.loads(sys.argv[2])
old = {"parts": [], "steps": []}
if os.path.exists(path):
    with open(path) as f:
        old = json.load(f)
ran = {s["step"] for s in new["steps"]}
doc = {"parts": list(dict.fromkeys(old.get("parts", []) + new["parts"])),
       "steps": [s for s in old.get("steps", []) if s["step"] not in ran] + new["steps"]}
with open(path + ".tmp", "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
os.replace(path + ".tmp", path)
EOF
cat "$out/gpu_tier.json"
echo "=== gpu_tier: this call: $this"
grep -q '"rc": [1-9]' <<<"$this" && exit 1
exit 0
