#!/usr/bin/env bash
# Fills .device/ (ignored through .git/info/exclude) with what bench/openvino_cases.py needs on a machine that has
# Python 3.12, numpy, onnx, onnxruntime, h5py and pyyaml but no OpenVINO and no network (docs/benchmarks.md):
#   .device/wheels/  openvino 2026.4.1 for cp312 manylinux x86-64, slimmed to the CPU plugin and the ONNX and IR
#                    frontends (bench/slim_wheel.py: the whole wheel, 56 MiB, does not fit the carry), and its one
#                    dependency the machine lacks, openvino-telemetry (its Requires-Dist: numpy, openvino-telemetry)
#   .device/cases/   each case's model.onnx and samples/ (bench/openvino_cases.py --pack)
# and prints the total size, which must stay under 55 MiB. There, with .device carried:
#   python3 -m pip install --no-index --no-deps --target /tmp/site .device/wheels/*.whl
#   PYTHONPATH=src:/tmp/site python3 bench/openvino_cases.py --out /tmp/openvino_cases.json
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=.venv/bin/python
OPENVINO=openvino==2026.4.1
TELEMETRY=openvino-telemetry==2025.2.0
LIMIT_MIB=55

grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >>.git/info/exclude
rm -rf .device/wheels .device/cases
mkdir -p .device/wheels .device/cases
download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 -d "$download" "$OPENVINO" "$TELEMETRY"
"$PYTHON" bench/slim_wheel.py "$download"/openvino-*.whl .device/wheels
cp "$download"/openvino_telemetry-*.whl .device/wheels/
"$PYTHON" bench/openvino_cases.py --pack .device/cases

du -ah .device | sort -h | tail -n 12
total_kib=$(du -sk .device | cut -f1)
echo "total: $((total_kib / 1024)) MiB (limit ${LIMIT_MIB} MiB)"
if ((total_kib > LIMIT_MIB * 1024)); then
  echo "accubisect: .device is over ${LIMIT_MIB} MiB: leave a case's model out or slim the wheel further" >&2
  exit 1
fi
