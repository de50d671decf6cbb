#!/usr/bin/env bash
# tandem.sh: set up, build and run tandem.
#   ./tandem.sh run    install what is missing, build, run the main job
#   ./tandem.sh test   install what is missing, build, run the whole test suite (C++, then Python)
#   ./tandem.sh build  install what is missing, build
# Environment: BUILD_DIR (default build), JOBS (default: all cores), CMAKE_ARGS (extra configure flags).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
PACKAGES=(cmake ninja-build g++ pkg-config zlib1g-dev libopenblas-dev libcli11-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libgloo-dev libopenmpi-dev openmpi-bin libssl-dev iproute2
          dataset-fashion-mnist python3-venv python3-dev)
# From PyPI into the virtual environment of the Python tests ($BUILD_DIR/pyenv).
PY_PACKAGES=(nanobind scikit-build-core numpy pytest)

log() { printf 'tandem.sh: %s\n' "$*" >&2; }

install_missing() {
  command -v dpkg-query >/dev/null 2>&1 || { log "no dpkg: skipping package installation"; return 0; }
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  log "installing ${missing[*]}"
  if ! { "${sudo[@]}" apt-get update -qq && \
         DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2; then
    log "could not install ${missing[*]}; continuing with what is present (optional parts are skipped)"
  fi
}

build() {
  install_missing
  local gen=()
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    # shellcheck disable=SC2086
    cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >&2
  fi
  # pip may have built the Python module in this directory with an interpreter that is gone since
  # (build/pyenv removed): then the C++ parts are built alone, until pip builds the module again.
  local cache="$BUILD_DIR/CMakeCache.txt" py
  if grep -q '^TANDEM_PYTHON:BOOL=ON' "$cache" 2>/dev/null; then
    py=$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' "$cache")
    "${py:-false}" -c "import nanobind" 2>/dev/null || cmake -S . -B "$BUILD_DIR" -DTANDEM_PYTHON=OFF >&2
  fi
  cmake --build "$BUILD_DIR" -j "$JOBS" >&2
}

# The virtual environment of the Python tests, $BUILD_DIR/pyenv (kept between runs), with the build
# tools from PyPI. Returns 1 when it cannot be set up (no python3-venv, PyPI unreachable).
python_env() {
  local py=python3 venv="$BUILD_DIR/pyenv"
  [ -x /usr/bin/python3 ] && py=/usr/bin/python3  # Debian's, which python3-venv and python3-dev serve
  if [ ! -x "$venv/bin/python" ]; then
    # System packages stay visible: Debian's python3-torch, where installed, joins the DLPack tests.
    "$py" -m venv --system-site-packages "$venv" >&2 || return 1
  fi
  if ! "$venv/bin/python" -c "import nanobind, scikit_build_core, numpy, pytest" 2>/dev/null; then
    log "installing ${PY_PACKAGES[*]} from PyPI into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}" >&2 || return 1
  fi
}

# Builds and installs the Python package with pip, in the C++ build directory: only the Python module
# is compiled anew.
python_install() {
  local cache="$BUILD_DIR/CMakeCache.txt" gen tests bench
  gen=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$cache")
  tests=$(sed -n 's/^TANDEM_TESTS:BOOL=//p' "$cache")
  bench=$(sed -n 's/^TANDEM_BENCH:BOOL=//p' "$cache")
  log "building and installing the Python package into $BUILD_DIR/pyenv"
  CMAKE_GENERATOR="$gen" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$BUILD_DIR/pyenv/bin/python" -m pip install -q \
    --disable-pip-version-check --no-build-isolation --no-deps --config-settings=build-dir="$BUILD_DIR" \
    --config-settings=cmake.define.TANDEM_TESTS="${tests:-ON}" \
    --config-settings=cmake.define.TANDEM_BENCH="${bench:-ON}" . >&2
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build)
    build
    ;;
  run)
    build
    # The guide's job: two workers through tandem launch, on two GPUs when the machine has them,
    # otherwise two CPU ranks over Gloo (or one process when tandem was built without Gloo).
    T="$BUILD_DIR/bin/tandem"
    gpus=$("$T" info | sed -n 's/^gpus: //p')
    job=(train --model cnn --dataset fashion-mnist --epochs 10 --batch-size 64 --lr 0.005 --momentum 0.9
         --weight-decay 1e-5)
    if [ "${gpus:-0}" -ge 2 ]; then
      log "2 workers on 2 GPUs"
      exec "$T" launch -n 2 -- "$T" "${job[@]}" --device cuda "$@"
    elif "$T" info | grep -q '^gloo: yes'; then
      log "2 workers on the CPU (Gloo)"
      exec "$T" launch -n 2 -- "$T" "${job[@]}" --device cpu "$@"
    else
      log "built without Gloo: one process"
      exec "$T" "${job[@]}" "$@"
    fi
    ;;
  test)
    build
    rc=0 python=0
    if ! python_env; then
      log "SKIPPED the Python tests: their virtual environment could not be set up (is PyPI reachable? see above)"
    elif python_install; then
      python=1
    else
      rc=1
      log "the Python package failed to build"
    fi
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" "$@" || rc=$?
    if [ $python -eq 1 ]; then
      "$BUILD_DIR/pyenv/bin/python" -m pytest -q tests/python || rc=$?
    fi
    exit $rc
    ;;
  *)
    echo "usage: ./tandem.sh run|test|build [extra arguments]" >&2
    exit 2
    ;;
esac
