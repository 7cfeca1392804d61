#!/usr/bin/env bash
# scripts/bench/memory.sh: peak resident memory (/usr/bin/time -v) of whole training runs, the
# project beside PyTorch (torch_train.py: the same models, optimizer, batch and data), in one run
# on this machine. The MLP run is configs/fmnist_mlp.yaml as it is (2 epochs); the CNN run is
# configs/fmnist_cnn.yaml cut to --cnn-steps steps (default 30) and one evaluation, on both sides.
# Writes the table into docs/PERFORMANCE.md between the bench:memory markers.
#
#   bash scripts/bench/memory.sh [--cnn-steps=N]
#   TG_SKIP_APT=1   skip the apt step
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

cnn_steps=30
for a in "$@"; do
  case "$a" in
    --cnn-steps=*) cnn_steps="${a#--cnn-steps=}" ;;
    *) echo "memory.sh: unknown argument '$a' (expected --cnn-steps=N)" >&2; exit 2 ;;
  esac
done
if [[ -z "${TG_SKIP_APT:-}" ]]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch libopenblas0-pthread time
fi
[[ -x build/launcher/tg ]] || bash scripts/build.sh

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# peak KB of a command; its own output goes to $out/NAME.log
peak_kb() {
  local name="$1"; shift
  /usr/bin/time -v "$@" >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
  grep 'Maximum resident set size' "$out/$name.log" | awk '{print $NF}'
}
tg_mlp=$(peak_kb tg_mlp build/launcher/tg train configs/fmnist_mlp.yaml train.run_dir="$out/mlp")
pt_mlp=$(peak_kb pt_mlp /usr/bin/python3 scripts/bench/torch_train.py mlp)
tg_cnn=$(peak_kb tg_cnn build/launcher/tg train configs/fmnist_cnn.yaml train.steps="$cnn_steps" \
  train.eval_every="$cnn_steps" train.run_dir="$out/cnn")
pt_cnn=$(peak_kb pt_cnn /usr/bin/python3 scripts/bench/torch_train.py cnn --steps="$cnn_steps")
for n in tg_mlp pt_mlp tg_cnn pt_cnn; do grep -h -E 'test accuracy' "$out/$n.log" | tail -1 | sed "s/^/$n: /"; done

machine="$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(date -u +%Y-%m-%d)"
/usr/bin/python3 - "$tg_mlp" "$pt_mlp" "$tg_cnn" "$pt_cnn" "$cnn_steps" "$machine" "bash scripts/bench/memory.sh${*:+ $*}" <<'PY'
import sys
tg_mlp, pt_mlp, tg_cnn, pt_cnn = (int(v) / 1024 for v in sys.argv[1:5])
steps, machine, command = sys.argv[5:8]
BEGIN, END = "<!-- bench:memory begin -->", "<!-- bench:memory end -->"
def row(what, a, b):
    return f"| {what} | {a:.0f} MB | {b:.0f} MB | {a / b:.2f} | <= 1.00 ({'met' if a <= b else 'not met'}) |"
section = "\n".join([BEGIN, "", f"Peak resident memory (`/usr/bin/time -v`), measured on {machine} with", "",
                     "```sh", command, "```", "",
                     "| run | tinygrad++ | PyTorch | ratio | target |", "| --- | --- | --- | --- | --- |",
                     row("configs/fmnist_mlp.yaml, 2 epochs and evaluations", tg_mlp, pt_mlp),
                     row(f"configs/fmnist_cnn.yaml, {steps} steps and one evaluation", tg_cnn, pt_cnn), "", END])
path = "docs/PERFORMANCE.md"
doc = open(path).read()
if BEGIN in doc and END in doc:
    doc = doc[:doc.index(BEGIN)] + section + doc[doc.index(END) + len(END):]
else:
    doc = doc.rstrip() + "\n\n## Memory, beside PyTorch\n\n" + section + "\n"
open(path, "w").write(doc)
print(section)
PY
