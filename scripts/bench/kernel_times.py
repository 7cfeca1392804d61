#!/usr/bin/env python3
"""Where a step's device time goes, by kernel: reads the `*** DEVICE  n NAME  t ms ...` lines that
DEBUG=2 prints for every kernel launch (one launch at a time, each timed with events, so the sum
is the step run kernel by kernel, not the replayed graph) and prints, per kernel name, the time
and launches per step, the mean time a launch, and the share of the whole, largest first.

  DEVICE=CUDA DEBUG=2 build/launcher/tg bench --reps=1 gpt2_step 2>&1 | \\
      python3 scripts/bench/kernel_times.py --steps 3 [--top 30]

--steps N divides by the steps the log holds (`tg bench --reps=1` runs a workload's step 3
times before it replays it: count one kernel that runs once a step, e.g. the LM head's
product, to check). The first launch of a kernel that the driver loads lazily (a library's) is
slow; take the figures of a run whose products were already loaded (the first run of a library
product times its candidate algorithms, MATMUL_TUNE, which loads them)."""
import argparse
import re
import sys
from collections import defaultdict

LINE = re.compile(r"^\*\*\* (\S+)\s+\d+ (\S+)\s+([0-9.]+) ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", nargs="?", help="a DEBUG=2 log (default: standard input)")
    ap.add_argument("--steps", type=float, default=1.0, help="steps in the log (default 1)")
    ap.add_argument("--top", type=int, default=40, help="kernels to list (default 40)")
    args = ap.parse_args()
    if args.steps <= 0:
        sys.exit(f"kernel_times.py: --steps must be positive, got {args.steps}")
    ms, launches = defaultdict(float), defaultdict(int)
    with (open(args.log) if args.log else sys.stdin) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                ms[m.group(2)] += float(m.group(3))
                launches[m.group(2)] += 1
    if not ms:
        sys.exit("kernel_times.py: no DEBUG=2 kernel lines (`*** DEVICE n NAME t ms`) in the input")
    total = sum(ms.values())
    print(f"{'ms/step':>9} {'launches':>9} {'ms/launch':>10} {'share':>6}  kernel")
    for name in sorted(ms, key=ms.get, reverse=True)[: args.top]:
        print(f"{ms[name] / args.steps:9.3f} {launches[name] / args.steps:9.1f} {ms[name] / launches[name]:10.4f} "
              f"{ms[name] / total:6.1%}  {name}")
    print(f"{total / args.steps:9.3f} {sum(launches.values()) / args.steps:9.1f} {'':>10} {'':>6}  all {len(ms)} kernels")


if __name__ == "__main__":
    main()
