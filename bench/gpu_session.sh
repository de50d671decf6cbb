#!/usr/bin/env bash
# Two-GPU session: builds tandem on a GPU machine, runs the GPU tests, then times and checks tandem
# next to PyTorch DDP (torchrun, the same number of processes) in the same call. Logs go to $OUT
# (default /tmp/tandem-gpu), a summary to stdout and $OUT/summary.txt.
#   bench/gpu_session.sh [build] [tests] [cnn] [resnet] [gpt] [shard] [accuracy] [commbound] [sanitize]
#   (default: all of them; each stage after tests wants 2 GPUs for its 2-GPU half)
#   cnn:       the guide's CNN, batch 64 per GPU, recorded steps, 1 and 2 GPUs; PyTorch DDP beside
#   resnet:    ResNet-50 3x224x224, 1000 classes: bf16 batch 256 and TF32 batch 128 per GPU, 1 and 2 GPUs
#   gpt:       GPT-2 124M, context 1024, bf16, batch 32 per GPU, random tokens, 1 and 2 GPUs, plain;
#              PyTorch DDP beside (bench/gpt2_ddp_peer.py, eager and torch.compile); and --shard optimizer
#   shard:     sharded state on 2 GPUs: GPT-2 b32 (plain and half) and ResNet-18 bf16 under --shard none,
#              optimizer, gradients; each RESULT carries the step time, state_bytes_per_rank (to set against
#              the formulas of docs/distributed.md) and bytes_sent_per_step
#   accuracy:  Fashion-MNIST, 10 epochs on 2 GPUs, every -d option and bf16, through tandem launch and
#              mpiexec --hostfile, with --check-consistency 200 (METHODS narrows the list)
#   commbound: NCCL on sockets only, the 36.8 M-parameter MLP: bytes and time per step per option
#   sanitize:  compute-sanitizer racecheck of two ranks replaying a recorded multi-bucket step
# COMMIT labels the figures. Expects Fashion-MNIST in .data/fashion-mnist and the peer scripts in .data/peer.
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
stages=${*:-build tests cnn resnet gpt shard accuracy commbound sanitize}
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
has() { [[ " $stages " == *" $1 "* ]]; }
say "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$NGPU commit ${COMMIT:-?}; stages: $stages"

if has build; then
  t0=$SECONDS
  # The cuDNN frontend's headers (fused attention) travel in .data/cudnn-frontend: the GPU machine has no PyPI.
  fe=$PWD/.data/cudnn-frontend/include extra=()
  [ -f "$fe/cudnn_frontend.h" ] && extra=(-DTANDEM_CUDNN_FRONTEND_INCLUDE="$fe")
  if ! { cmake -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON -DTANDEM_NCCL=ON -DTANDEM_MPI=ON \
           -DCMAKE_CUDA_ARCHITECTURES=90 "${extra[@]}" && cmake --build build-gpu -j"$(nproc)"; } >"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; exit 1
  fi
  say "build: $((SECONDS - t0)) s"
fi

if has tests; then
  t0=$SECONDS
  ctest --test-dir build-gpu -L gpu --output-on-failure -j4 >"$OUT/ctest_gpu.log" 2>&1
  say "ctest -L gpu ($((SECONDS - t0)) s): $(grep -E 'tests passed|tests failed' "$OUT/ctest_gpu.log")"
  grep -E '\(Failed\)|\(Timeout\)|\(SEGFAULT\)|\(Subprocess aborted\)' "$OUT/ctest_gpu.log" | head -20 | tee -a "$OUT/summary.txt"
fi

peer() {  # label, processes, then peer flags
  local label=$1 n=$2; shift 2
  python3 -m torch.distributed.run --standalone --nproc_per_node="$n" "$PEER/pytorch_ddp.py" "$@" 2>"$OUT/peer_err.log" \
    | grep RESULT | sed "s/^/$label: /" | tee -a "$OUT/summary.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || tail -3 "$OUT/peer_err.log" | tee -a "$OUT/summary.txt"
}
tan() {  # label, ranks, then tandem bench train flags
  local label=$1 n=$2; shift 2
  "$T" launch -n "$n" -- "$T" bench train --device cuda "$@" >"$OUT/tandem_run.log" 2>&1
  local rc=$?
  grep RESULT "$OUT/tandem_run.log" | sed "s/^/$label: /" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || { say "$label: rc $rc"; tail -5 "$OUT/tandem_run.log" | tee -a "$OUT/summary.txt"; }
}

if has cnn; then  # run 1: whole step recorded, NCCL all-reduces captured
  peer "peer ddp 2gpu cnn b64" 2 --model cnn --batch 64 --steps 1000
  peer "peer 1gpu cnn b64 graph" 1 --model cnn --batch 64 --cuda-graph --steps 3000
  tan "tandem 1gpu cnn b64 recorded" 1 --model cnn -b 64 --steps 3000
  [ "$NGPU" -ge 2 ] && tan "tandem 2gpu cnn b64 recorded" 2 --model cnn -b 64 --steps 3000
  [ "$NGPU" -ge 2 ] && tan "tandem 2gpu cnn b64 eager" 2 --model cnn -b 64 --steps 1000 --cuda-graph off
  peer "peer ddp 2gpu cnn b64 (again)" 2 --model cnn --batch 64 --steps 1000
fi

RN=(--model resnet50 --image 224 --channels 3 --classes 1000 --steps 40 --warmup 8)
if has resnet; then  # run 2
  peer "peer ddp 2gpu rn50 b256 bf16" 2 --model resnet50 --batch 256 --bf16 --steps 40
  peer "peer 1gpu rn50 b256 bf16" 1 --model resnet50 --batch 256 --bf16 --steps 40
  tan "tandem 1gpu rn50 b256 bf16" 1 "${RN[@]}" -b 256 --precision bf16
  [ "$NGPU" -ge 2 ] && tan "tandem 2gpu rn50 b256 bf16" 2 "${RN[@]}" -b 256 --precision bf16
  peer "peer ddp 2gpu rn50 b128 channels-last" 2 --model resnet50 --batch 128 --channels-last --steps 40
  peer "peer 1gpu rn50 b128 channels-last" 1 --model resnet50 --batch 128 --channels-last --steps 40
  tan "tandem 1gpu rn50 b128 tf32" 1 "${RN[@]}" -b 128 --precision tf32
  [ "$NGPU" -ge 2 ] && tan "tandem 2gpu rn50 b128 tf32" 2 "${RN[@]}" -b 128 --precision tf32
fi

gpt_peer() {  # label, processes, then gpt2_ddp_peer.py flags
  local label=$1 n=$2; shift 2
  python3 -m torch.distributed.run --standalone --nproc_per_node="$n" bench/gpt2_ddp_peer.py --peer-dir "$PEER" "$@" \
    2>"$OUT/peer_err.log" | grep RESULT | sed "s/^/$label: /" | tee -a "$OUT/summary.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || tail -3 "$OUT/peer_err.log" | tee -a "$OUT/summary.txt"
}
if has gpt; then  # GPT-2 124M, data-parallel
  tan "tandem 1gpu gpt2 b32 bf16" 1 --model gpt -b 32
  [ "$NGPU" -ge 2 ] && tan "tandem 2gpu gpt2 b32 bf16 plain" 2 --model gpt -b 32 -d plain
  [ "$NGPU" -ge 2 ] && gpt_peer "peer ddp 2gpu gpt2 b32 eager" 2 --batch 32
  [ "$NGPU" -ge 2 ] && gpt_peer "peer ddp 2gpu gpt2 b32 compile" 2 --batch 32 --compile
  [ "$NGPU" -ge 2 ] && tan "tandem 2gpu gpt2 b32 bf16 plain --shard optimizer" 2 --model gpt -b 32 -d plain --shard optimizer
fi

if has shard; then  # sharded state across 2 GPUs: time, bytes kept and bytes sent per rank against plain
  if [ "$NGPU" -ge 2 ]; then
    for sh in none optimizer gradients none optimizer; do
      tan "tandem 2gpu gpt2 b32 --shard $sh" 2 --model gpt -b 32 --shard "$sh"
    done
    for sh in none optimizer gradients; do
      tan "tandem 2gpu gpt2 b32 -d half --shard $sh" 2 --model gpt -b 32 -d half --shard "$sh"
      tan "tandem 2gpu resnet18 b128 bf16 --shard $sh" 2 --model resnet18 --image 28 --channels 1 --classes 10 -b 128 \
        --steps 200 --precision bf16 --shard "$sh"
    done
  else
    say "shard: one GPU here; the 2-GPU runs need two"
  fi
fi

run_acc() {  # name, then the command up to its train flags
  local name=$1; shift
  local t0=$SECONDS
  "$@" --dataset fashion-mnist --data-dir "$DATA" --epochs 10 --batch-size 64 --lr 0.005 --momentum 0.9 \
    --weight-decay 1e-5 --device cuda --check-consistency 200 --progress off --metrics "$OUT/acc_$name.jsonl" \
    >"$OUT/acc_$name.log" 2>&1
  local rc=$?
  say "accuracy $name (rc $rc, $((SECONDS - t0)) s): $(grep 'Evaluation accuracy' "$OUT/acc_$name.log" | tail -1)"
  say "  epoch times: $(grep -o 'Elapsed Time = [0-9.]*' "$OUT/acc_$name.log" | awk '{printf "%s ", $4}')"
  [ $rc -eq 0 ] || tail -5 "$OUT/acc_$name.log" | tee -a "$OUT/summary.txt"
}

if has accuracy && [ "$NGPU" -ge 2 ]; then  # run 3
  printf 'localhost slots=2\n' >"$OUT/hostfile"
  for m in ${METHODS:-plain half partialUpdate sparseTopK sparseThreshold powerSGD bf16}; do
    flags=(-d "$m")
    case $m in
      sparseTopK | sparseThreshold) flags+=(-s 0.05) ;;
      bf16) flags=(--precision bf16) ;;
    esac
    run_acc "launch2_$m" "$T" launch -n 2 -- "$T" train --model cnn "${flags[@]}" --report-comm
    run_acc "mpi2_$m" mpiexec --hostfile "$OUT/hostfile" -n 2 "$T" train --model cnn "${flags[@]}"
  done
fi

if has commbound && [ "$NGPU" -ge 2 ]; then  # run 4: NCCL forced onto sockets
  for cfg in "plain" "half" "sparseTopK -s 0.01" "powerSGD --rank 2"; do
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "$T" launch -n 2 -- "$T" bench train --model mlp \
      --hidden 4096,4096,4096 -b 64 --steps 30 --warmup 5 -d $cfg --device cuda 2>&1 \
      | grep -E 'RESULT|error' | sed "s/^/sockets $cfg: /" | tee -a "$OUT/summary.txt"
  done
fi

if has sanitize && [ "$NGPU" -ge 2 ]; then  # run 5: 1 MiB buckets, the step recorded after warm-up and replayed
  for d in plain half sparseTopK; do
    "$T" launch -n 2 -- compute-sanitizer --tool racecheck "$T" bench train --model mlp --hidden 1024,1024 -b 32 \
      --steps 4 --warmup 6 --bucket-mb 1 -d $d --device cuda >"$OUT/racecheck_$d.log" 2>&1
    say "racecheck $d, multi-bucket, replayed (rc $?): $(grep -o '"cuda_graph":[a-z]*' "$OUT/racecheck_$d.log" | head -1)" \
      "$(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck_$d.log" | sort | uniq -c | tr '\n' ' ')"
  done
fi
say "# done"
