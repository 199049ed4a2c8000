#!/usr/bin/env bash
# The GPU tier: the same tests and notebooks as CI, at full size, plus the reference benchmarks.
# Run it on a GPU node from the repository root:
#
#   bash scripts/gpu_tier.sh --out DIR [--wheels WHEELDIR] [--python PY]
#
# --wheels: a folder of wheels made beforehand by scripts/prepare_wheels.sh on a machine with a
#           package registry, for nodes that lack papermill/nbclient/ipykernel/ipywidgets. They are
#           installed into DIR's own site folder (nothing on the node is changed).
# Writes into DIR: doctor.txt, pytest.log + pytest.xml, runs/ (executed notebooks, summary,
# index), reference/<machine>/<lab>.json (to be committed), and gpu_tier.json (each step's
# exit code and duration). Where the tree was copied without .git, set LABKIT_GIT_COMMIT so
# the results still name the commit they were made from. Every step runs even if an earlier one failed; the exit code is
# non-zero if any step failed.
set -uo pipefail
out="" wheels="" py=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --wheels) wheels=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    *) echo "gpu_tier.sh: unknown argument $1 (expected --out DIR [--wheels DIR] [--python PY])" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "gpu_tier.sh: --out DIR is required" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$root"
# Multicast stays off on shared multi-GPU hosts (labkit sets these too; children inherit them).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
unset TRITON_INTERPRET
if [ -n "$wheels" ]; then
  site="$out/.site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl \
    || { echo "gpu_tier.sh: installing wheels from $wheels failed" >&2; exit 1; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"  # labkit without installing it

steps=()
step() {  # step NAME COMMAND...: run, log, and remember exit code and seconds
  local name=$1; shift
  local t0=$SECONDS
  echo "=== gpu_tier: $name: $*"
  "$@"
  local rc=$?
  steps+=("{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}")
  echo "=== gpu_tier: $name: exit $rc after $((SECONDS - t0)) s"
}
step doctor bash -o pipefail -c "'$py' -m labkit doctor | tee '$out/doctor.txt'"
step tests bash -o pipefail -c "'$py' -m pytest -ra -p no:cacheprovider --junitxml='$out/pytest.xml' 2>&1 | tee '$out/pytest.log'"
step notebooks "$py" -m labkit run --profile gpu --runs-dir "$out/runs" --no-progress
step bench-doctor "$py" -m labkit bench doctor --profile gpu --reference --out "$out/reference"
step bench-workbench "$py" -m labkit bench workbench --profile gpu --reference --out "$out/reference"
step bench-sc-kernel "$py" -m labkit bench sc_kernel --profile gpu --reference --out "$out/reference"
step bench-sc-launch "$py" -m labkit bench sc_launch --profile gpu --reference --out "$out/reference"
step bench-device-guard "$py" -m labkit bench device_guard --profile gpu --reference --out "$out/reference"
step bench-sc-model "$py" -m labkit bench sc_model --profile gpu --reference --out "$out/reference"
step bench-streams "$py" -m labkit bench streams --profile gpu --reference --out "$out/reference"
step bench-collectives "$py" -m labkit bench collectives --profile gpu --reference --out "$out/reference"
step bench-collectives-tune "$py" -m labkit bench collectives_tune --profile gpu --reference --out "$out/reference"
step bench-links "$py" -m labkit bench links --profile gpu --reference --out "$out/reference"
rm -rf "$out/.site"
(IFS=,; echo "{\"steps\": [${steps[*]}]}") > "$out/gpu_tier.json"
cat "$out/gpu_tier.json"
grep -q '"rc": [1-9]' "$out/gpu_tier.json" && exit 1
exit 0
