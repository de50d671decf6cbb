#!/usr/bin/env bash
# Python's cost per training step: the guide's CNN at batch 64 stepped from Python
# (bench/python_step.py) against `tandem bench train` stepping the C++ model, alternately, ROUNDS
# times each, both at the device's default precision (tf32 on CUDA, f32 on the CPU); prints every
# run's ms/step, the medians, the fastest runs and their ratios.
#   bench/python_step.sh [cpu|cuda] [ROUNDS] [STEPS]
# Environment: BUILD_DIR (default build, or build-gpu for cuda), PY (an interpreter with tandem
# installed; default: BUILD_DIR/pyenv, made and filled here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=${1:-cpu}
ROUNDS=${2:-5}
STEPS=${3:-300}
if [ "$DEV" = cuda ]; then BUILD_DIR=${BUILD_DIR:-build-gpu}; else BUILD_DIR=${BUILD_DIR:-build}; fi
T="$BUILD_DIR/bin/tandem"
PY=${PY:-$BUILD_DIR/pyenv/bin/python}

if [ ! -x "$T" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_TESTS=OFF >&2
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target tandem_cli >&2
fi
if ! "$PY" -c "import tandem" 2>/dev/null; then
  # nanobind, scikit-build-core and numpy from the system's Python, from .data/whl, or from PyPI.
  [ -x "$BUILD_DIR/pyenv/bin/python" ] || python3 -m venv --system-site-packages "$BUILD_DIR/pyenv"
  PY=$BUILD_DIR/pyenv/bin/python
  # Wheels in .data/whl (pip download nanobind scikit-build-core) serve a machine without network.
  wheels=()
  [ -d .data/whl ] && wheels=(--no-index --find-links .data/whl)
  "$PY" -c "import nanobind, scikit_build_core, numpy" 2>/dev/null ||
    "$PY" -m pip install -q "${wheels[@]}" nanobind scikit-build-core numpy
  # Built in BUILD_DIR: only the module is compiled; the directory keeps its tests and benchmarks.
  cache="$BUILD_DIR/CMakeCache.txt"
  CMAKE_GENERATOR=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$cache") "$PY" -m pip install -q --no-build-isolation \
    --no-deps --config-settings=build-dir="$BUILD_DIR" \
    --config-settings=cmake.define.TANDEM_TESTS="$(sed -n 's/^TANDEM_TESTS:BOOL=//p' "$cache")" \
    --config-settings=cmake.define.TANDEM_BENCH="$(sed -n 's/^TANDEM_BENCH:BOOL=//p' "$cache")" . >&2
fi

ms() { sed -n 's/^RESULT .*"ms_per_step": *\([0-9.e+-]*\).*/\1/p'; }
cpp=() py=()
for i in $(seq "$ROUNDS"); do
  c=$("$T" bench train --model cnn -b 64 --steps "$STEPS" --device "$DEV" | ms)
  p=$("$PY" bench/python_step.py --device "$DEV" -b 64 --steps "$STEPS" | ms)
  echo "round $i: C++ $c ms/step, Python $p ms/step"
  cpp+=("$c") py+=("$p")
done
"$PY" - "${cpp[*]}" "${py[*]}" <<'PYEOF'
import statistics, sys
cpp, py = ([float(v) for v in a.split()] for a in sys.argv[1:3])
mc, mp = statistics.median(cpp), statistics.median(py)
print(f"median: C++ {mc:.4f} ms/step, Python {mp:.4f} ms/step, Python / C++ = {mp / mc:.4f}")
# On a busy machine the fastest run is the one least disturbed by other processes.
print(f"fastest: C++ {min(cpp):.4f} ms/step, Python {min(py):.4f} ms/step, Python / C++ = {min(py) / min(cpp):.4f}")
PYEOF
