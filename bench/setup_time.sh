#!/usr/bin/env bash
# The set-up time a new user meets: a fresh clone of this repository, `./tandem.sh run` timed to its first
# epoch lines (then stopped), and `pip install .` into a new virtual environment after it. No compiler cache.
#   bench/setup_time.sh [WORK_DIR]      (default /tmp/tandem-setup-time; replaced)
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
W=${1:-/tmp/tandem-setup-time}
rm -rf "$W" && mkdir -p "$W" && git clone -q "$src" "$W/clone" && cd "$W/clone" || exit 1
echo "commit $(git log --oneline -1)"
export CCACHE_DISABLE=1
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s)
setsid ./tandem.sh run > run.log 2>&1 &
pid=$!
start="" first=""
while kill -0 $pid 2>/dev/null; do
  [ -z "$start" ] && grep -q "Starting Epoch 0" run.log && start=$(( $(date +%s) - t0 ))
  if grep -q "Training loss" run.log; then first=$(( $(date +%s) - t0 )); break; fi
  sleep 2
done
echo "./tandem.sh run: 'Starting Epoch 0' after ${start:-?} s; the first 'Training loss' line after ${first:-?} s"
kill -TERM -- -$pid 2>/dev/null; sleep 2; kill -KILL -- -$pid 2>/dev/null
python3 -m venv "$W/env"
t1=$(date +%s)
"$W/env/bin/python" -m pip install -q . > pip.log 2>&1
rc=$?
echo "pip install . (rc $rc) after $(( $(date +%s) - t1 )) s"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
