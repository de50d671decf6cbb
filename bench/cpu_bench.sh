#!/usr/bin/env bash
# CPU training throughput of the guide's CNN on Fashion-MNIST, batch 64: tandem against PyTorch
# (bench/peers/pytorch_cpu_cnn.py), one epoch each, the same thread count, run one after the other.
# Prints one line per system and thread count.
#   bench/cpu_bench.sh [DATA_DIR] [THREADS...]      (default: /usr/share/datasets/fashion-mnist, 1 2)
# Environment: T (the tandem program, default build/bin/tandem), PY (a Python with torch, default
# /usr/bin/python3 with Debian's python3-torch).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-/usr/share/datasets/fashion-mnist}
[ $# -gt 0 ] && shift
THREADS=("$@")
[ ${#THREADS[@]} -gt 0 ] || THREADS=(1 2)
T=${T:-build/bin/tandem}
PY=${PY:-/usr/bin/python3}
[ -x "$T" ] || ./tandem.sh build
"$PY" -c "import torch" 2>/dev/null || { echo "cpu_bench.sh: $PY has no torch (apt-get install python3-torch)" >&2; exit 2; }
metrics=$(mktemp)
trap 'rm -f "$metrics"' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(nproc) cores, torch $("$PY" -c 'import torch; print(torch.__version__)')"
for th in "${THREADS[@]}"; do
  line=$(OMP_NUM_THREADS=$th "$PY" bench/peers/pytorch_cpu_cnn.py 1 64 "$DATA" "$th" | grep '^epoch')
  echo "pytorch threads=$th: $line"
  : >"$metrics"
  "$T" train --model cnn --dataset fashion-mnist --data-dir "$DATA" --epochs 1 --batch-size 64 --lr 0.005 \
    --momentum 0.9 --weight-decay 1e-5 --threads "$th" --progress off --metrics "$metrics" >/dev/null 2>&1
  "$PY" - "$metrics" "$th" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).readline())
print(f"tandem  threads={sys.argv[2]}: epoch 0 train_loss {j['train_loss']:.1f} train_acc {j['train_acc']:.4f} "
      f"eval_acc {j['eval_acc']:.4f} train_s {j['train_s']:.2f} imgs/s {j['train_images_per_s']:.0f}")
PY
done
