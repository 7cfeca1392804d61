#!/usr/bin/env bash
# scripts/bench/gpt2.sh: the GPT-2 124M training step on the GPU beside PyTorch in one run:
# `DEVICE=CUDA tg bench gpt2_step gpt2_step_t4096` (bf16 compute, float32 master weights, AdamW,
# JIT replay) and scripts/bench/torch_gpt2.py (eager and torch.compile, SDPA flash attention,
# fused AdamW, bf16 autocast) at the same batch and length (16 x 1024, 4 x 4096). Prints
# tokens/s, MFU and peak memory of each, and tinygrad++'s tokens/s over torch.compile's
# (issue targets: >= 1.2x, >= 550,000 tokens/s at 16 x 1024; peak memory no more than PyTorch's).
#
#   bash scripts/bench/gpt2.sh [--reps=N] [WORKLOAD ...]   (default: gpt2_step gpt2_step_t4096)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
args=("$@")
names=0
for a in "$@"; do [[ $a == --* ]] || names=1; done
[[ $names == 1 ]] || args+=(gpt2_step gpt2_step_t4096)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
DEVICE=CUDA build/launcher/tg bench "${args[@]}" | tee "$out/tg.jsonl" || echo '{"name": "tg bench failed"}' >> "$out/tg.jsonl"
python3 scripts/bench/torch_gpt2.py "${args[@]}" | tee "$out/torch.jsonl"
python3 - "$out/tg.jsonl" "$out/torch.jsonl" <<'PY'
import json, os, sys
load = lambda p: {r["name"]: r for r in map(json.loads, filter(lambda l: l.startswith("{"), open(p)))}
tg, pt = load(sys.argv[1]), load(sys.argv[2])
V, D, L, H = 50304, 768, 12, 12
n = V * D + L * (12 * D * D + 13 * D) + 2 * D  # parameters without the position embeddings
seq = {"gpt2_step": 1024, "gpt2_step_t4096": 4096}
peak = float(os.environ.get("PEAK_TFLOPS", "989"))
print(f"{'workload':<18}{'side':<16}{'ms':>10}{'tokens/s':>12}{'MFU':>7}{'peak MB':>10}")
for w, t in seq.items():
    rows = [("tinygrad++", tg.get(w)), ("torch eager", pt.get(w)), ("torch.compile", pt.get(w + "_compiled"))]
    for side, r in rows:
        if not r or "tokens_per_s" not in r:
            continue
        mfu = r["tokens_per_s"] * (6 * n + 12 * L * H * (D // H) * t) / (peak * 1e12)
        print(f"{w:<18}{side:<16}{r['ms']:>10.1f}{r['tokens_per_s']:>12.0f}{mfu:>7.1%}{r.get('peak_mb', 0):>10.0f}")
    a, c = tg.get(w), pt.get(w + "_compiled")
    if a and c and "tokens_per_s" in a:
        print(f"{w:<18}tinygrad++ / torch.compile tokens/s: {a['tokens_per_s'] / c['tokens_per_s']:.2f}x, "
              f"peak memory {a.get('peak_mb', 0) / c['peak_mb']:.2f}x")
PY
