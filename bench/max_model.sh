#!/usr/bin/env bash
# The largest Llama that trains on this machine, by the memory plan (docs/memory.md), under each memory policy:
# nothing (every activation kept), --recompute full, --offload optimizer --recompute full and --offload parameters
# --recompute full.
# For each policy it walks a ladder of Llama shapes (layers, width, heads, key-value heads and MLP width scaled
# along Llama 3's 1B, 3B and 8B, below and beyond them) asking `tandem bench train --plan-only`, takes the largest
# that fits, adds layers at its width while the plan still fits, and then confirms it: a few training steps of that
# shape, whose measured peak is printed beside the plan's.
#
#   bench/max_model.sh [--device cpu|cuda] [--precision P] [--context T] [--batch-size B] [--vocab V]
#                      [--steps N] [--no-confirm] [--tandem PATH] [-- FLAGS FOR bench train]
#
# Defaults: the device's default precision, context 2048, batch 1, Llama 3's vocabulary (128256), 3 timed steps.
# TANDEM_MEMORY_LIMIT_MIB plans for a device of that many MiB instead of this one's free memory (and the confirming
# run is checked against the same). Prints one line per policy and ends with a summary table.
set -uo pipefail
cd "$(dirname "$0")/.."

T=${TANDEM:-build/bin/tandem}
device=cpu precision="" context=2048 batch=1 vocab=128256 steps=3 confirm=1 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --no-confirm) confirm=0; shift ;;
    --tandem) T=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "max_model.sh: unknown argument $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
[ -x "$T" ] || { echo "max_model.sh: no tandem at $T (build it, or give --tandem PATH)" >&2; exit 2; }

# The ladder: name, layers, width, heads, key-value heads, MLP width, tied (1) or not (0). The named Llama 3 shapes
# are Meta's; the others keep their proportions (head size 64 or 128, 8 key-value heads from 1B up, the MLP about
# 2.7-4 times the width, untied from 8B up).
LADDER=(
  "llama-60m 8 512 8 4 1536 1"
  "llama-150m 12 768 12 4 2048 1"
  "llama-400m 16 1024 16 8 4096 1"
  "llama-1b 16 2048 32 8 8192 1"
  "llama-3b 28 3072 24 8 8192 1"
  "llama-8b 32 4096 32 8 14336 0"
  "llama-13b 40 5120 40 8 13824 0"
  "llama-34b 48 8192 64 8 22016 0"
  "llama-70b 80 8192 64 8 28672 0"
)

common=(--model llama --device "$device" --context "$context" --vocab "$vocab" --batch-size "$batch")
[ -n "$precision" ] && common+=(--precision "$precision")

# The flags of a rung at a number of layers.
shape_flags() {  # name layers width heads kv mlp tied [layers override]
  local f=(--layers "${8:-$2}" --width "$3" --heads "$4" --kv-heads "$5" --mlp-hidden "$6")
  [ "$7" = 0 ] && f+=(--untied)
  echo "${f[@]}"
}

# `bench train --plan-only`'s RESULT, as "fits peak parameters available".
plan() {  # policy flags..., then shape flags
  "$T" bench train "${common[@]}" "$@" "${extra[@]}" --plan-only 2>/dev/null | sed -n 's/^RESULT //p' | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
print("yes" if j["fits"] else "no", j["planned_peak_bytes"], j["parameters"], j["available_bytes"])'
}

gib() { python3 -c "print(f'{$1 / 2**30:.2f} GiB')"; }

# A policy's flags, or nothing when this tandem does not have it yet.
policy_available() {
  case "$1" in
    "") return 0 ;;
    --offload*) "$T" bench train --help 2>&1 | grep -q -- "--offload" ;;
    *) return 0 ;;
  esac
}

summary=()
for policy in "" "--recompute full" "--offload optimizer --recompute full" "--offload parameters --recompute full"; do
  label=${policy:-nothing}
  if ! policy_available "$policy"; then
    echo "$label: not built yet (tandem bench train has no ${policy%% *}): skipped"
    summary+=("$label|not built yet|||")
    continue
  fi
  # shellcheck disable=SC2206
  pflags=($policy)
  best="" best_layers=0 best_plan=""
  for rung in "${LADDER[@]}"; do
    # shellcheck disable=SC2086
    set -- $rung
    read -r fits peak params avail <<<"$(plan "${pflags[@]}" $(shape_flags "$@"))"
    [ -z "${fits:-}" ] && { echo "$label: $1: no plan (tandem refused the shape)" >&2; break; }
    [ "$fits" = yes ] || break
    best=$rung best_layers=$2 best_plan="$fits $peak $params $avail"
  done
  if [ -z "$best" ]; then
    echo "$label: not even ${LADDER[0]%% *} fits"
    summary+=("$label|none fits|||")
    continue
  fi
  # More layers at the largest fitting width, while the plan still fits (at most twice as many).
  # shellcheck disable=SC2086
  set -- $best
  step=$(( $2 / 8 > 0 ? $2 / 8 : 1 ))
  for (( layers = $2 + step; layers <= 2 * $2; layers += step )); do
    read -r fits peak params avail <<<"$(plan "${pflags[@]}" $(shape_flags "$@" "$layers"))"
    [ "${fits:-no}" = yes ] || break
    best_layers=$layers best_plan="$fits $peak $params $avail"
  done
  read -r _ peak params avail <<<"$best_plan"
  shape="$1's width, $best_layers layers"
  sflags=$(shape_flags "$@" "$best_layers")
  echo "$label: $shape ($(python3 -c "print(f'{$params / 1e9:.2f}')") B parameters): planned peak $(gib "$peak") of $(gib "$avail") [$sflags]"
  measured="-"
  if [ "$confirm" = 1 ]; then
    # shellcheck disable=SC2086
    out=$("$T" bench train "${common[@]}" "${pflags[@]}" $sflags "${extra[@]}" --steps "$steps" --warmup 2 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
      measured=$(echo "$out" | sed -n 's/^RESULT //p' | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
m, p, rate = j["peak_memory_bytes"], j["planned_peak_bytes"], j["tokens_per_s"]
print(f"{m / 2**30:.2f} GiB measured (planned/measured {p / m:.3f}), {rate:.0f} tok/s")')
      echo "$label: confirmed: $measured"
    else
      measured="failed (rc $rc)"
      echo "$label: the confirming run failed (rc $rc):"
      echo "$out" | tail -5
    fi
  fi
  summary+=("$label|$shape|$(python3 -c "print(f'{$params / 1e9:.2f} B')")|$(gib "$peak")|$measured")
done

echo
echo "| policy | largest shape | parameters | planned peak | confirmed |"
echo "|---|---|---|---|---|"
for row in "${summary[@]}"; do echo "| ${row//|/ | } |"; done
