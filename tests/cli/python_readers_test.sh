#!/usr/bin/env bash
# Trains briefly with --tensorboard and --checkpoint, exports the checkpoint to safetensors, and reads
# both back with TensorBoard's and safetensors' own Python readers, installed from PyPI into a virtual
# environment under the build directory. Exits 77 (reported as skipped) where PyPI or the
# Fashion-MNIST package is not available.
#   python_readers_test.sh TANDEM_BIN WORK_DIR VENV_DIR
set -euo pipefail
tandem=$1 work=$2 venv=$3
here=$(cd "$(dirname "$0")" && pwd)
data=/usr/share/datasets/fashion-mnist
[ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "skipped: Fashion-MNIST is not installed"; exit 77; }
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import tensorboard, safetensors, numpy" 2>/dev/null; then
  rm -rf "$venv"
  if ! { /usr/bin/python3 -m venv "$venv" &&
         "$venv/bin/pip" install --quiet --disable-pip-version-check tensorboard safetensors numpy; } >"$work.pip.log" 2>&1; then
    rm -rf "$venv"
    echo "skipped: could not install tensorboard and safetensors from PyPI (see $work.pip.log)"
    exit 77
  fi
fi
rm -rf "$work"
mkdir -p "$work"
"$tandem" train --model mlp --hidden 32 --epochs 2 --limit-train 512 --limit-test 256 --batch-size 64 --threads 1 \
  --progress off --tensorboard "$work/tb" --tensorboard-every 2 --checkpoint "$work/model.ckpt" >"$work/train.log" 2>&1 ||
  { cat "$work/train.log"; exit 1; }
"$tandem" export --checkpoint "$work/model.ckpt" --format safetensors -o "$work/model.safetensors"
"$venv/bin/python" "$here/read_outputs.py" "$work/tb" 2 "$work/model.ckpt" "$work/model.safetensors"
