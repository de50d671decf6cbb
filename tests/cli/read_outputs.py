"""Reads what `tandem train --tensorboard` and `tandem export` wrote with the readers other tools use:
TensorBoard's own event reader and Python's safetensors. Exits non-zero on any mismatch.

usage: read_outputs.py TENSORBOARD_DIR EPOCHS CHECKPOINT SAFETENSORS
"""
import json
import struct
import sys

import numpy as np
from safetensors.numpy import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

tb_dir, epochs, checkpoint, exported = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
per_epoch = ["train/loss", "train/accuracy", "eval/accuracy", "train/images_per_s", "comm/bytes_sent_per_step"]
missing = [t for t in per_epoch + ["step/loss"] if t not in tags]
assert not missing, f"scalars missing from {tb_dir}: {missing} (found {sorted(tags)})"
for tag in per_epoch:
    events = acc.Scalars(tag)
    assert [e.step for e in events] == list(range(epochs)), f"{tag}: steps {[e.step for e in events]}"
for e in acc.Scalars("eval/accuracy"):
    assert 0.0 <= e.value <= 1.0, e
assert len(acc.Scalars("step/loss")) >= 2, "expected a step/loss point every N steps"
print(f"tensorboard: {len(tags)} scalar tags, {epochs} epochs each")

# The checkpoint, parsed from its documented layout, is the reference for the exported values.
DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32, "i64": np.int64, "u8": np.uint8}
with open(checkpoint, "rb") as f:
    raw = f.read()
assert raw[:8] == b"TANDEMCK"
(version,) = struct.unpack_from("<I", raw, 8)
(hlen,) = struct.unpack_from("<Q", raw, 12)
start = 24 if version >= 2 else 20
header = json.loads(raw[start:start + hlen])
data = raw[start + hlen:]
reference = {}
for t in header["tensors"]:
    kind, _, name = t["name"].partition("/")
    if kind in ("param", "buffer"):
        arr = np.frombuffer(data, DTYPES[t["dtype"]], count=int(np.prod(t["shape"], dtype=np.int64)), offset=t["offset"])
        reference[name] = arr.reshape(t["shape"])

loaded = load_file(exported)
assert sorted(loaded) == sorted(reference), f"names differ: {sorted(loaded)} vs {sorted(reference)}"
for name, ref in reference.items():
    assert loaded[name].dtype == ref.dtype and loaded[name].shape == ref.shape, name
    assert np.array_equal(loaded[name], ref), f"{name}: values differ"
print(f"safetensors: {len(loaded)} tensors equal to the checkpoint's")
