#!/usr/bin/env bash
# What the fail-closed checks cost (issue "Fail closed"): the same k3-mini
# synthetic checkpoint packed by an OLD larder (store format 1: no spine or
# file digests, unbound record digests, mapped spine) and by this one, then
# interleaved (old new old new ...) from a cold page cache:
#   - load time of the store (`run --max-new 1`, the "loaded ... in Xs" log line),
#   - steady decode tok/s streamed through a RAM budget (`bench decode`),
#   - `verify` throughput, against the drive limit measured with the same
#     backend in the same run (`bench io`, before and after).
#
# Usage: OLD=/path/to/old/larder scripts/bench_integrity.sh [WORK_DIR]   (root: drop_caches)
# Env: EXPERTS_GIB (4), RAM_BUDGET (1GiB), ROUNDS (3), NEW_TOKENS (24), OUT (bench/results)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OLD:?set OLD to a larder binary built from an earlier commit}"
WORK=${1:-/tmp/larder-bench-integrity}
EXPERTS_GIB=${EXPERTS_GIB:-4}
RAM_BUDGET=${RAM_BUDGET:-1GiB}
ROUNDS=${ROUNDS:-3}
NEW_TOKENS=${NEW_TOKENS:-24}
OUT=${OUT:-bench/results}
STAMP=$(date -u +%Y-%m-%d)
NEW=target/release/larder
cargo build --release -q -p larder
mkdir -p "$WORK" "$OUT"
[ -f "$WORK/k3/config.json" ] || $NEW synth --arch qwen3_moe --preset k3-mini --experts-gib "$EXPERTS_GIB" --out "$WORK/k3" --json > "$WORK/synth.json"
[ -f "$WORK/old.store/manifest.json" ] || $OLD pack --model "$WORK/k3" --out "$WORK/old.store" --json > "$WORK/pack-old.json"
[ -f "$WORK/new.store/manifest.json" ] || $NEW pack --model "$WORK/k3" --out "$WORK/new.store" --json > "$WORK/pack-new.json"
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# Summaries of the JSON documents (stdin).
py_decode=$(cat <<'PY'
import json, sys
d = json.load(sys.stdin)
e = d["stats"].get("experts") or d["stats"]
print("decode %.3f tok/s, verify_s %.2f of decode_s %.2f, %.0f%% of I/O bound, ids %s" % (
    d["decode_tok_per_s"], e.get("verify_s", 0), d["decode_s"], 100 * d["ratio_to_io_bound"], d["ids_hash"][-8:]))
PY
)
py_verify='import json, sys; d = json.load(sys.stdin); print("verify %.2f GB/s (%.1fs)" % (d["bytes"] / d["seconds"] / 1e9, d["seconds"]))'
py_limit='import json, sys; print(round(json.load(sys.stdin)["limit_gbps"], 2))'
py_secs='import json, sys; print(round(json.load(open(sys.argv[1]))["seconds"], 1))' 
limit() { cold; $NEW bench io --store "$WORK/new.store" --io uring --records 96 --json | python3 -c "$py_limit" 2>/dev/null || echo "?"; }
res="$OUT/$STAMP-integrity.txt"
{
  echo "machine: $(nproc) vCPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(free -g | awk '/Mem/{print $2}') GiB RAM; experts ${EXPERTS_GIB} GiB; budget $RAM_BUDGET"
  echo "pack seconds: old $(python3 -c "$py_secs" "$WORK/pack-old.json") new $(python3 -c "$py_secs" "$WORK/pack-new.json")"
  echo "drive limit before (uring O_DIRECT): $(limit) GB/s"
  for r in $(seq 1 "$ROUNDS"); do
    for arm in old new; do
      bin=$OLD; [ $arm = new ] && bin=$NEW
      cold
      load=$(LARDER_LOG=info $bin run --model "$WORK/$arm.store" --ids 1,2,3 --max-new 1 --ram-budget "$RAM_BUDGET" --json 2>&1 >/dev/null | grep -o 'in [0-9.]*s' | head -1)
      cold
      dec=$($bin bench decode --model "$WORK/$arm.store" --ram-budget "$RAM_BUDGET" --new "$NEW_TOKENS" --json 2>/dev/null \
        | python3 -c "$py_decode")
      cold
      ver=$($bin verify "$WORK/$arm.store" --json 2>/dev/null | python3 -c "$py_verify")
      echo "round $r $arm: load $load; $dec; $ver"
    done
  done
  echo "drive limit after (uring O_DIRECT): $(limit) GB/s"
} | tee "$res"
