#!/usr/bin/env bash
# What ./tandem.sh builds for each command, with cmake, dpkg-query and nvcc replaced by stubs that record
# their calls (a machine with the CUDA toolkit and no GPU, as CI's): `run` builds the program's target only
# and leaves the CUDA backend out of a new build directory; `build` adds it; `run` afterwards builds the
# program again without configuring anew; CMAKE_ARGS naming TANDEM_CUDA decide for themselves.
#   tandem_sh_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1 work=$2
if compgen -G '/proc/driver/nvidia/gpus/*' >/dev/null; then
  echo "a GPU is present: tandem.sh builds the CUDA backend from the start here"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work/stubs"
log="$work/calls.log"
cat > "$work/stubs/cmake" <<STUB
#!/usr/bin/env bash
echo "cmake \$*" >> "$log"
if [ "\$1" = --build ]; then
  mkdir -p "\$2/bin"
  printf '#!/usr/bin/env bash\ncase "\$1" in info) echo "gpus: 0"; echo "gloo: yes";; *) echo "tandem \$*";; esac\n' > "\$2/bin/tandem"
  chmod +x "\$2/bin/tandem"
else
  while [ \$# -gt 0 ]; do [ "\$1" = -B ] && { mkdir -p "\$2"; touch "\$2/CMakeCache.txt"; }; shift; done
fi
STUB
printf '#!/bin/sh\necho "install ok installed"\n' > "$work/stubs/dpkg-query"
printf '#!/bin/sh\nexit 0\n' > "$work/stubs/nvcc"
printf '#!/bin/sh\nexit 9\n' > "$work/stubs/nvidia-smi"
chmod +x "$work/stubs/"*
export PATH="$work/stubs:$PATH"
unset CMAKE_ARGS
b="$work/build"
# The cuDNN frontend's headers are there already: nothing is fetched.
mkdir -p "$b/cudnn-frontend/include" && touch "$b/cudnn-frontend/include/cudnn_frontend.h"

fail() { echo "FAILED: $*"; echo "--- calls:"; cat "$log"; exit 1; }
calls() { : > "$log"; BUILD_DIR="$b" "$src/tandem.sh" "$@" > "$work/out.log" 2>&1 || fail "./tandem.sh $* exited $?: $(cat "$work/out.log")"; }

calls run --epochs 1
grep -q "^cmake --build $b -j [0-9]* --target tandem_cli$" "$log" || fail "run did not build the tandem_cli target alone"
[ -f "$b/tandem-cuda-later" ] || fail "run did not leave the CUDA backend for later"
grep -q "TANDEM_CUDA" "$log" && fail "run named TANDEM_CUDA (CMakeLists.txt takes it from tandem-cuda-later)"
grep -q "^tandem launch -n 2 -- $b/bin/tandem train --model cnn .* --device cpu --epochs 1$" "$work/out.log" ||
  fail "run did not start the job: $(cat "$work/out.log")"

calls run
grep -q "^cmake -S" "$log" && fail "a second run configured again"
grep -q "^cmake --build $b -j [0-9]* --target tandem_cli$" "$log" || fail "a second run did not build tandem_cli"

calls build
grep -q "^cmake -S . -B $b -DTANDEM_CUDA=AUTO$" "$log" || fail "build did not add the CUDA backend"
grep -q "^cmake --build $b -j [0-9]*$" "$log" || fail "build did not build every target"
[ -f "$b/tandem-cuda-later" ] && fail "build left tandem-cuda-later behind"

calls run
grep -q "TANDEM_CUDA" "$log" && fail "run after build changed TANDEM_CUDA"

# pip built the Python module here last, with nanobind from its temporary environment, now gone: build
# configures once, with the CUDA backend added and the module left out (a configure that still looked for
# the module would fail).
rm -rf "$b" && mkdir -p "$b/cudnn-frontend/include" && touch "$b/cudnn-frontend/include/cudnn_frontend.h"
calls run
printf '#!/bin/sh\nexit 1\n' > "$work/stubs/python-without-nanobind" && chmod +x "$work/stubs/python-without-nanobind"
printf 'TANDEM_PYTHON:BOOL=ON\nPython_EXECUTABLE:FILEPATH=%s\n' "$work/stubs/python-without-nanobind" >> "$b/CMakeCache.txt"
calls build
[ "$(grep -c '^cmake -S' "$log")" = 1 ] || fail "build configured more than once"
grep -q "^cmake -S . -B $b -DTANDEM_CUDA=AUTO -DTANDEM_PYTHON=OFF$" "$log" ||
  fail "build did not add CUDA and leave the module out in one configure"

rm -rf "$b" && mkdir -p "$b/cudnn-frontend/include" && touch "$b/cudnn-frontend/include/cudnn_frontend.h"
CMAKE_ARGS=-DTANDEM_CUDA=ON calls run
[ -f "$b/tandem-cuda-later" ] && fail "run left the CUDA backend out though CMAKE_ARGS asked for it"
grep -q "^cmake -S . -B $b .*-DTANDEM_CUDA=ON" "$log" || fail "CMAKE_ARGS did not reach the configure"
echo "tandem.sh: run builds the program alone and leaves CUDA for later; build adds it"
