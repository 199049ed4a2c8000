#!/usr/bin/env bash
# Download, on a machine with a package registry, the wheels that the GPU tier needs on a GPU
# node that has none (the device tool's machines lack papermill, nbclient, ipykernel,
# ipywidgets, ...). Only packages missing from the GPU image (gpu_image_packages.txt) are kept.
#
#   bash scripts/prepare_wheels.sh [DIR] [PYTHON_VERSION]      # default: .whl 3.12
#
# Then carry DIR to the GPU node and run: bash scripts/gpu_tier.sh --wheels DIR --out OUT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-.whl}
pyver=${2:-3.12}
# What the GPU tier executes that the GPU image may lack: the notebook runner and its kernel,
# with the version limits pyproject.toml gives them (e.g. ipykernel <7), the rest unpinned.
mapfile -t wanted < <(python3 - "$here/../pyproject.toml" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
spec = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower().replace("_", "-"): d for d in deps}
for name in ("papermill", "nbclient", "nbformat", "jupyter-client", "ipykernel", "ipywidgets"):
    print(spec.get(name, name))
PY
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
  "${platforms[@]}" -d "$tmp" "${wanted[@]}" 2> >(grep -v "is ignored: it is neither" >&2)
mkdir -p "$dest"
skip=$(grep -v '^#' "$here/gpu_image_packages.txt" | tr ' ' '\n' | sed '/^$/d' | tr 'A-Z_.' 'a-z--')
kept=0
for whl in "$tmp"/*.whl; do
  name=$(basename "$whl" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')
  if grep -qx "$name" <<<"$skip"; then continue; fi
  cp "$whl" "$dest/"; kept=$((kept + 1))
done
echo "prepare_wheels: kept $kept wheels in $dest ($(du -sh "$dest" | cut -f1)) for Python $pyver"
