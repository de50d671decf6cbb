#!/usr/bin/env bash
# One GPU, --shard none against optimizer and gradients: the same language-model run under settings that
# each take one suspect out (clipping, recorded steps, the 16-bit weight copies, the bias gradients from the
# products), so that the settings under which the runs agree bit for bit name where they part. Prints each
# run's final validation loss and the largest difference of its parameters from --shard none's.
#   bench/shard_bits.sh [TANDEM] (default build-gpu/bin/tandem); OUT (default /tmp/shard-bits)
set -uo pipefail
cd "$(dirname "$0")/.."
T=${1:-build-gpu/bin/tandem}
OUT=${OUT:-/tmp/shard-bits}
mkdir -p "$OUT"
D=$OUT/data
if [ ! -f "$D/meta.json" ]; then
  python3 -c "
import random
random.seed(1)
words = 'the king and queen of a fair night to be or not that is question sweet rose by any other name'.split()
open('$OUT/text.txt', 'w').write(' '.join(random.choice(words) for _ in range(400000)))
open('$OUT/val.txt', 'w').write(' '.join(random.choice(words) for _ in range(40000)))"
  "$T" data text "$OUT/text.txt" "$OUT/val.txt" -o "$D" --val 0.1 >/dev/null 2>&1 || { echo "data text failed"; exit 1; }
fi
run="train --model gpt --data $D --steps 240 --batch-size 16 --context 128 --layers 2 --width 128 --heads 4 --device cuda --eval-every 0 --seed 1"
last_val() { grep -oE 'validation loss [0-9.]+' "$1" | tail -1 | awk '{print $3}'; }
for setting in "default:" "noclip:--clip-norm 0" "eager:--cuda-graph off" "nocopies:TANDEM_PARAM_COPIES=0" \
               "biasred:TANDEM_BIAS_FROM_PRODUCT=0" "det:--deterministic"; do
  name=${setting%%:*}; extra=${setting#*:}
  envs=(); flags=()
  for w in $extra; do case $w in *=*) envs+=("$w");; *) flags+=("$w");; esac; done
  for shard in none optimizer gradients; do
    env "${envs[@]}" "$T" $run "${flags[@]}" --shard $shard --checkpoint "$OUT/$name-$shard.ck" >"$OUT/$name-$shard.log" 2>&1
    "$T" export --checkpoint "$OUT/$name-$shard.ck" -o "$OUT/$name-$shard.safetensors" >/dev/null 2>&1
  done
  python3 - "$OUT" "$name" <<'PY'
import sys, re
from safetensors.numpy import load_file
import numpy as np
out, name = sys.argv[1], sys.argv[2]
def val(shard):
    m = re.findall(r'validation loss ([0-9.]+)', open(f'{out}/{name}-{shard}.log').read())
    return m[-1] if m else '?'
ref = load_file(f'{out}/{name}-none.safetensors')
line = f'{name:9s} none {val("none")}'
for shard in ('optimizer', 'gradients'):
    got = load_file(f'{out}/{name}-{shard}.safetensors')
    diff = max(float(np.max(np.abs(got[k].astype(np.float64) - ref[k].astype(np.float64)))) for k in ref)
    first = [k for k in ref if not np.array_equal(got[k], ref[k])]
    line += f' | {shard} {val(shard)} max|d| {diff:.3g} ({len(first)} of {len(ref)} tensors differ)'
print(line)
PY
done
