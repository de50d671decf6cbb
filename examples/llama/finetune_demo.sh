#!/usr/bin/env bash
# A Llama fine-tune from end to end, small enough for a CPU: import -> tokenize -> fine-tune -> generate -> export.
#
#   examples/llama/finetune_demo.sh TANDEM_BINARY WORK_DIR [DEVICE]      (DEVICE: cpu, the default, or cuda)
#
# 1. A base model: a tiny Llama (4 layers, width 128, 4 heads of which 2 key-value heads) pretrained for a few
#    hundred steps on counting ("417 418 419 ..."), written as a Hugging Face directory — the stand-in for a
#    checkpoint downloaded from the Hub. The tokenizer is a Llama-3-style tokenizer.json (the repository's
#    test fixture, 1,500 tokens, trained on the project's documents).
# 2. Instruction data: a JSONL of prompt/response pairs ("What comes after 417? " -> "418"), tokenized by
#    `tandem data jsonl` with a loss mask (only the answers are trained on); the last tenth of the pairs
#    (questions the fine-tune never saw) validates.
# 3. The fine-tune starts from the directory (`train --init DIR`), reports the held-out answer loss, and
#    the held-out questions are answered greedily before and after.
# 4. The result goes back out as a Hugging Face directory (`export --format hf`).
set -euo pipefail
T=$1
W=$2
dev=(--device "${3:-cpu}")
here=$(cd "$(dirname "$0")" && pwd)
tok="$here/../../tests/fixtures/tokenizer/llama3.json"
mkdir -p "$W"
cd "$W"
say() { printf '\n== %s\n' "$*" >&2; }

# Pretraining text: lines of ten consecutive numbers from random starts below 600 ("417 418 419 ..."). The
# instruction pairs ask for the number after N, for every N below 600 in a shuffled order; the last 60 pairs
# validate: the fine-tune has to carry what the base model learnt from counting over to questions it never saw.
awk 'BEGIN { srand(7)
  for (i = 0; i < 4000; i++) { s = int(rand() * 590); line = s; for (j = 1; j < 10; j++) line = line " " (s + j)
    print line > "pretrain.txt" }
  for (i = 0; i < 600; i++) { n[i] = i; r[i] = rand() }
  for (i = 1; i < 600; i++) for (j = i; j > 0 && r[j-1] > r[j]; j--) {
    t = r[j]; r[j] = r[j-1]; r[j-1] = t; t = n[j]; n[j] = n[j-1]; n[j-1] = t }
  for (i = 0; i < 600; i++) printf "{\"prompt\": \"What comes after %d? \", \"response\": \"%d\"}\n", n[i], n[i] + 1 > "qa.jsonl" }'

say "1. a base model, pretrained on $(wc -l < pretrain.txt) lines of counting, written as a Hugging Face directory"
"$T" data text pretrain.txt -o pretrain --tokenizer "$tok" --val 0.05
"$T" train --model llama --data pretrain --layers 4 --width 128 --heads 4 --kv-heads 2 --mlp-hidden 256 \
  --context 64 --batch-size 16 --steps 600 --lr 3e-3 --warmup 50 --eval-every 200 --log-every 100 \
  --checkpoint base.ck "${dev[@]}"
"$T" export --checkpoint base.ck --format hf -o base-hf
cp "$tok" base-hf/tokenizer.json

say "2. the instruction pairs, tokenized with a loss mask on the answers"
"$T" data jsonl qa.jsonl --tokenizer base-hf/tokenizer.json -o qa --context 24 --val 0.1

ask() {  # the held-out questions answered greedily by checkpoint $1: prints how many are right
  local right=0 q a got
  while IFS= read -r line; do
    q=$(printf '%s' "$line" | sed 's/.*"prompt": "\([^"]*\)".*/\1/')
    a=$(printf '%s' "$line" | sed 's/.*"response": "\([^"]*\)".*/\1/')
    got=$("$T" generate --checkpoint "$1" --tokenizer base-hf/tokenizer.json --prompt "<|begin_of_text|>$q" \
          -n 4 --temperature 0 --no-prompt "${dev[@]}" 2>/dev/null | sed 's/<|end_of_text|>.*//' | head -1)
    [ "$got" = "$a" ] && right=$((right + 1))
  done < <(tail -n 60 qa.jsonl)
  echo "$right"
}
before=$(ask base-hf)

say "3. the fine-tune from base-hf (answers only in the loss)"
"$T" train --model llama --init base-hf --data qa --batch-size 16 --steps 600 --lr 1e-3 --warmup 20 \
  --eval-every 100 --log-every 100 --checkpoint tuned.ck "${dev[@]}"
after=$(ask tuned.ck)
say "held-out questions answered right, greedy: $before of 60 before the fine-tune, $after of 60 after"
for q in "What comes after 99? " "What comes after 457? "; do
  printf '%s-> ' "$q"
  "$T" generate --checkpoint tuned.ck --tokenizer base-hf/tokenizer.json --prompt "<|begin_of_text|>$q" -n 4 \
    --temperature 0 --no-prompt "${dev[@]}" 2>/dev/null | sed 's/<|end_of_text|>.*//' | head -1
  echo
done

say "4. the fine-tuned model as a Hugging Face directory"
"$T" export --checkpoint tuned.ck --format hf -o tuned-hf
ls tuned-hf
