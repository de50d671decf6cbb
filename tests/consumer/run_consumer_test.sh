#!/usr/bin/env bash
# Installs the build into a fresh prefix, then builds and runs a program against it twice: through
# find_package(tandem) and through pkg-config; then docs/cpp.md's program, taken from the page, which must
# print what the page says it prints.
#   run_consumer_test.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
test -f "$work/prefix/include/tandem/tandem.h"
test -x "$work/prefix/bin/tandem"
"$work/prefix/bin/tandem" --version

gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
cmake -S "$here" -B "$work/cmake-build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log"
cmake --build "$work/cmake-build" >"$work/build.log"
"$work/cmake-build/consumer" "$work/cmake.ckpt"

pc_dir=$(dirname "$(find "$work/prefix" -name tandem.pc | head -n1)")
flags=$(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs tandem)
# shellcheck disable=SC2086
${CXX:-c++} ${CXXFLAGS:-} -O1 "$here/consumer.cpp" -o "$work/consumer-pc" $flags ${LDFLAGS:-}
"$work/consumer-pc" "$work/pc.ckpt"

doc="$work/doc-program"
python3 "$here/doc_program.py" "$here/../../docs/cpp.md" "$doc"
cmake -S "$doc" -B "$doc/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" \
  >"$work/doc-configure.log"
cmake --build "$doc/build" >"$work/doc-build.log"
for expected in "$doc"/*.expected; do
  program=$(basename "$expected" .expected)
  "$doc/build/$program" >"$doc/$program.out"
  diff -u "$expected" "$doc/$program.out" || { echo "docs/cpp.md: $program prints other lines than the page shows" >&2; exit 1; }
done
echo "consumer test: find_package and pkg-config builds ran, and docs/cpp.md's program prints what the page shows"
