#!/usr/bin/env bash
# Builds tandem on a GPU machine and runs the GPU tests, the benchmarks against the PyTorch peer,
# and the accuracy runs, in one go. Logs go to $OUT (default /tmp/tandem-gpu), a summary to stdout.
#   bench/gpu_session.sh [build] [tests] [bench] [accuracy] [sanitize]   (default: all)
# Expects Fashion-MNIST in .data/fashion-mnist and the peer scripts in .data/peer.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tandem-gpu}
mkdir -p "$OUT"
DATA=$PWD/.data/fashion-mnist
PEER=$PWD/.data/peer
T=$PWD/build-gpu/bin/tandem
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
stages=${*:-build tests bench accuracy}
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
has() { [[ " $stages " == *" $1 "* ]]; }
say "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$NGPU; stages: $stages"

if has build; then
  t0=$SECONDS
  if ! { cmake -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON -DTANDEM_NCCL=ON -DTANDEM_MPI=ON && cmake --build build-gpu -j32; } \
      >"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; exit 1
  fi
  say "build: $((SECONDS - t0)) s"
fi

if has tests; then
  ctest --test-dir build-gpu -L gpu --output-on-failure -j4 >"$OUT/ctest_gpu.log" 2>&1
  say "ctest -L gpu: $(grep -E 'tests passed|tests failed|Errors while' "$OUT/ctest_gpu.log")"
  grep -E '\(Failed\)|\(Timeout\)' "$OUT/ctest_gpu.log" | head -20 | tee -a "$OUT/summary.txt"
  ctest --test-dir build-gpu -R 'Nccl|DistOpt|Cuda' -LE gpu --output-on-failure >"$OUT/ctest_nccl.log" 2>&1
  say "ctest nccl/distopt: $(grep -E 'tests passed|tests failed' "$OUT/ctest_nccl.log")"
  grep -E '\(Failed\)|\(Timeout\)' "$OUT/ctest_nccl.log" | head -20 | tee -a "$OUT/summary.txt"
fi

if has quickbench; then
  for w in 1 2; do
    $T launch -n $w -- $T bench train --model cnn -b 64 --steps 500 --device cuda 2>&1 | grep -E 'RESULT|error' \
      | sed "s/^/tandem ${w}gpu b64: /" | tee -a "$OUT/summary.txt"
  done
  $T launch -n 2 -- $T bench allreduce --min 1K --max 64M --no-raw 2>&1 | tee -a "$OUT/summary.txt"
fi

if has bench; then
  for b in 64 512; do
    python3 -m torch.distributed.run --standalone --nproc_per_node=1 "$PEER/pytorch_ddp.py" --model cnn --batch $b \
      2>&1 | grep RESULT | sed "s/^/peer 1gpu b$b: /" | tee -a "$OUT/summary.txt"
    $T bench train --model cnn -b $b --steps 500 --device cuda 2>&1 | grep -E 'RESULT|error' | sed "s/^/tandem 1gpu b$b: /" \
      | tee -a "$OUT/summary.txt"
    $T launch -n 1 -- $T bench train --model cnn -b $b --steps 500 --device cuda 2>&1 | grep -E 'RESULT|error' \
      | sed "s/^/tandem launch-n1 b$b: /" | tee -a "$OUT/summary.txt"
    if [ "$NGPU" -ge 2 ]; then
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$PEER/pytorch_ddp.py" --model cnn --batch $b \
        2>&1 | grep RESULT | sed "s/^/peer 2gpu b$b: /" | tee -a "$OUT/summary.txt"
      $T launch -n 2 -- $T bench train --model cnn -b $b --steps 500 --device cuda 2>&1 | grep -E 'RESULT|error' \
        | sed "s/^/tandem 2gpu b$b: /" | tee -a "$OUT/summary.txt"
    fi
  done
  if [ "$NGPU" -ge 2 ]; then
    $T launch -n 2 -- $T bench allreduce --min 1K --max 1G --json "$OUT/allreduce.jsonl" >"$OUT/allreduce.txt" 2>&1
    cat "$OUT/allreduce.txt" | tee -a "$OUT/summary.txt"
  fi
fi

run_acc() {  # name, then the command
  local name=$1; shift
  local t0=$SECONDS
  "$@" --dataset fashion-mnist --data-dir "$DATA" --epochs 10 --batch-size 64 --lr 0.005 --momentum 0.9 \
    --weight-decay 1e-5 --device cuda --metrics "$OUT/acc_$name.jsonl" >"$OUT/acc_$name.log" 2>&1
  local rc=$?
  say "accuracy $name (rc $rc, $((SECONDS - t0)) s): $(grep 'Evaluation accuracy' "$OUT/acc_$name.log" | tail -1)"
  [ $rc -eq 0 ] || tail -5 "$OUT/acc_$name.log" | tee -a "$OUT/summary.txt"
}

if has accuracy; then
  run_acc 1gpu "$T" train --model cnn
  if [ "$NGPU" -ge 2 ]; then
    run_acc launch2_plain "$T" launch -n 2 -- "$T" train --model cnn --check-consistency 200 --report-comm
    printf 'localhost slots=2\n' >"$OUT/hostfile"
    run_acc mpi2_plain mpiexec --hostfile "$OUT/hostfile" -n 2 "$T" train --model cnn --check-consistency 200
    for d in half sparseTopK sparseThreshold partialUpdate; do
      run_acc "launch2_$d" "$T" launch -n 2 -- "$T" train --model cnn -d $d -s 0.05 --check-consistency 200 --report-comm
    done
  fi
fi

if has commbound && [ "$NGPU" -ge 2 ]; then
  # NCCL forced onto sockets: a commodity-network setting where gradient compression can pay.
  for d in plain half sparseTopK sparseThreshold; do
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "$T" launch -n 2 -- "$T" bench train --model mlp \
      --hidden 4096,4096,4096 -b 64 --steps 30 --warmup 5 -d $d -s 0.01 --device cuda 2>&1 \
      | grep -E 'RESULT|error' | sed "s/^/sockets $d: /" | tee -a "$OUT/summary.txt"
  done
fi

if has sanitize && [ "$NGPU" -ge 2 ]; then
  for d in half sparseTopK; do  # several buckets (1 MiB each), two ranks, every rank under racecheck
    "$T" launch -n 2 -- compute-sanitizer --tool racecheck "$T" bench train --model mlp --hidden 1024,1024 -b 32 \
      --steps 3 --warmup 1 --bucket-mb 1 -d $d --device cuda >"$OUT/racecheck_$d.log" 2>&1
    say "racecheck $d, multi-bucket: rc $? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck_$d.log" | tr '\n' ' ')"
  done
fi
say "# done"
