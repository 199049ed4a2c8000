#!/usr/bin/env bash
# The GPU tier: `labkit gpu-tier` (labkit/app/gpu_tier.py) with the same arguments. Run it
# on a GPU node from a checkout of the repository; every option is in
#
#   bash scripts/gpu_tier.sh --help
#   bash scripts/gpu_tier.sh --out DIR [--part PART]... [--only NOTEBOOK]... [-k EXPR] [--shard K/N]
#                            [--split-gpus G] [--wheels WHEELDIR] [--python PY] [--dry-run]
#   bash scripts/gpu_tier.sh --list-parts      # the valid parts, one a line
#
# The command runs in the Python that runs the steps: --python PY, else $PYTHON, else python3.
# labkit comes from this checkout (PYTHONPATH), installed or not.
set -uo pipefail
py=${PYTHON:-python3}
prev=""
for arg in "$@"; do
  case "$prev/$arg" in
    --python/*) py=$arg ;;
    */--python=*) py=${arg#--python=} ;;
  esac
  prev=$arg
done
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m labkit gpu-tier "$@"
