# Reads a run's TensorBoard event files with TensorBoard's own EventAccumulator and checks every
# scalar against metrics.jsonl (the same tags as launcher/metric_sinks.cpp's record_scalars:
# "<type>/<key>" for the numbers of train, eval and skip records but step, time, elapsed_s).
# Usage: python3 tensorboard_read.py RUN_DIR; exit status 0 when every value matches.
import json
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

run_dir = sys.argv[1]
acc = EventAccumulator(run_dir + "/tensorboard", size_guidance={"scalars": 0})
acc.Reload()
want = {}
for line in open(run_dir + "/metrics.jsonl"):
    r = json.loads(line)
    if r["type"] not in ("train", "eval", "skip"):
        continue
    for k, v in r.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time", "elapsed_s"):
            f32 = struct.unpack("f", struct.pack("f", v))[0]
            want.setdefault(r["type"] + "/" + k, []).append((r["step"], f32, r["time"]))
tags = sorted(acc.Tags()["scalars"])
if tags != sorted(want):
    sys.exit("tags differ: tensorboard %s, metrics.jsonl %s" % (tags, sorted(want)))
for tag, expected in want.items():
    got = [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
    if [(s, v) for s, v, _ in got] != [(s, v) for s, v, _ in expected]:
        sys.exit("%s: tensorboard %s, metrics.jsonl %s" % (tag, got, expected))
    if any(abs(a[2] - b[2]) > 1e-3 for a, b in zip(got, expected)):
        sys.exit("%s: wall times differ" % tag)
print("tensorboard read %d tags, %d values, all equal to metrics.jsonl" % (len(want), sum(map(len, want.values()))))
