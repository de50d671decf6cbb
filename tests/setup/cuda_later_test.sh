#!/usr/bin/env bash
# A build directory configured without CUDA and then with it (./tandem.sh run on a machine without a GPU,
# then ./tandem.sh test) compiles the GPU files and core/version.cpp anew and nothing else: every other
# source of the library and the program keeps its compile command. A build directory holding the file
# tandem-cuda-later is configured without CUDA.
#   cuda_later_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
rm -rf "$work"
mkdir -p "$work/b"
: > "$work/b/tandem-cuda-later"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
cmake -S "$src" -B "$work/b" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DTANDEM_TESTS=OFF -DTANDEM_BENCH=OFF \
  > "$work/without.log"
grep -q '^TANDEM_CUDA:STRING=OFF$' "$work/b/CMakeCache.txt" || {
  echo "FAILED: tandem-cuda-later did not make TANDEM_CUDA OFF"; exit 1; }
cp "$work/b/compile_commands.json" "$work/without.json"
rm "$work/b/tandem-cuda-later"
cmake -S "$src" -B "$work/b" -DTANDEM_CUDA=AUTO > "$work/with.log"
if ! grep -q 'tandem: CUDA=TRUE' "$work/with.log"; then
  echo "no CUDA toolkit with cuDNN here: nothing to add"
  exit 77
fi
python3 - "$work/without.json" "$work/b/compile_commands.json" "$src" <<'PY'
import json, os, sys
src = os.path.realpath(sys.argv[3])
def commands(path):
    return {os.path.relpath(os.path.realpath(e["file"]), src): e["command"] for e in json.load(open(path))}
without, with_cuda = commands(sys.argv[1]), commands(sys.argv[2])
gpu = ("src/backend/cuda/", "src/distributed/comm/nccl/")
stubs = ("src/backend/no_cuda/", "src/distributed/comm/no_nccl/")
changed = sorted(f for f in without if f in with_cuda and without[f] != with_cuda[f] and f != "src/core/version.cpp")
gone = sorted(f for f in without if f not in with_cuda and not f.startswith(stubs))
added = sorted(f for f in with_cuda if f not in without and not f.startswith(gpu))
kept = [f for f in without if f in with_cuda and f.startswith("src/")]
if changed or gone or added:
    sys.exit(f"FAILED: adding CUDA changes the compile commands of {changed}, drops {gone}, adds {added}")
if not any(f.startswith(gpu) for f in with_cuda) or len(kept) < 50:
    sys.exit(f"FAILED: {len(kept)} sources kept, GPU files {[f for f in with_cuda if f.startswith(gpu)]}")
print(f"adding CUDA keeps the compile commands of {len(kept)} sources; "
      f"{sum(f.startswith(gpu) for f in with_cuda)} GPU files and core/version.cpp compile anew")
PY
