#!/usr/bin/env bash
# Before and after in one GPU call: builds the tandem in .data/old (an older commit's sources, from
# `git archive COMMIT | tar -x -C .data/old`) beside this one, then runs the same commands on both.
#   bench/before_after.sh [r18] [f16]     (default: both); logs and a summary in $OUT
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/tandem-before-after}
mkdir -p "$OUT"
stages=${*:-f16 r18}
has() { [[ " $stages " == *" $1 "* ]]; }
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON -DTANDEM_NCCL=ON -DCMAKE_CUDA_ARCHITECTURES=90
       -DTANDEM_TESTS=OFF -DTANDEM_BENCH=OFF -DTANDEM_PYTHON=OFF)
for side in old new; do
  src=$PWD; [ $side = old ] && src=$PWD/.data/old
  t0=$SECONDS
  { cmake -S "$src" -B "build-$side" "${flags[@]}" && cmake --build "build-$side" -j16 --target tandem_cli; } \
    >"$OUT/build_$side.log" 2>&1 || { tail -30 "$OUT/build_$side.log"; exit 1; }
  say "build $side: $((SECONDS - t0)) s"
done
D=$PWD/.data/fashion-mnist
epochs() { grep -o 'Elapsed Time = [0-9.]*' "$1" | awk '{printf "%s ", $4}'; }
if has f16; then
  for side in old new; do
    log="$OUT/f16_$side.log"
    "build-$side/bin/tandem" train --model cnn --dataset fashion-mnist --data-dir "$D" --epochs 10 --batch-size 64 \
      --lr 0.005 --momentum 0.9 --weight-decay 1e-5 --device cuda --precision f16 --progress off >"$log" 2>&1
    say "fashion-mnist f16 $side (rc $?): epoch times $(epochs "$log"); $(grep 'Evaluation accuracy' "$log" | tail -1 | cut -d, -f1); $(grep -o 'steps run eagerly.*' "$log" | head -1)"
  done
fi
if has r18; then
  for run in "old bf16" "new bf16" "old tf32" "new tf32"; do
    set -- $run
    log="$OUT/r18_$1_$2_$SECONDS.log"
    "build-$1/bin/tandem" train --model resnet18 --dataset fashion-mnist --data-dir "$D" --epochs 2 --batch-size 128 \
      --lr 0.05 --device cuda --precision "$2" --progress off >"$log" 2>&1
    say "resnet18 $1 $2 (rc $?): epoch times $(epochs "$log"); $(grep 'Evaluation accuracy' "$log" | tail -1 | cut -d, -f1)"
  done
fi
say "# done"
