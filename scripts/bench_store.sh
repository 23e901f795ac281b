#!/usr/bin/env bash
# Streaming benchmark of the SSD expert store (issue: "The SSD expert store").
#
# Builds (or reuses) a k3-mini synthetic checkpoint with an expert bank of
# EXPERTS_GIB, packs it, measures the drive limit (`larder bench io`), then
# runs `larder bench decode` for the io_uring+O_DIRECT arm and the mmap arm,
# interleaved (A B A B ...), each inside a cgroup (v1 or v2) whose memory
# limit is the same for both arms: RAM_BUDGET + spine + SLACK. The mmap arm
# has no expert cache of its own, so the cgroup limit is what bounds its page
# cache; the uring arm gets the same total memory.
#
# Usage: scripts/bench_store.sh [WORK_DIR]   (needs root for the cgroup)
# Env: EXPERTS_GIB (8), RAM_BUDGET (2GiB), ROUNDS (2), NEW (32), OUT (bench/results)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/larder-bench-store}
EXPERTS_GIB=${EXPERTS_GIB:-8}
RAM_BUDGET=${RAM_BUDGET:-2GiB}
ROUNDS=${ROUNDS:-2}
NEW=${NEW:-32}
OUT=${OUT:-bench/results}
STAMP=$(date -u +%Y-%m-%d)
L=target/release/larder
cargo build --release -q
mkdir -p "$WORK" "$OUT"
[ -f "$WORK/k3/config.json" ] || $L synth --arch qwen3_moe --preset k3-mini --experts-gib "$EXPERTS_GIB" --out "$WORK/k3" --json > "$WORK/synth.json"
[ -f "$WORK/k3.store/manifest.json" ] || $L pack --model "$WORK/k3" --out "$WORK/k3.store" --json > "$WORK/pack.json"

budget_bytes=$(python3 -c "import sys; u={'KiB':2**10,'MiB':2**20,'GiB':2**30}; s=sys.argv[1]; print(int(float(s[:-3])*u[s[-3:]]))" "$RAM_BUDGET")
spine=$(stat -c %s "$WORK/k3.store/spine.safetensors")
slack=$((768 << 20))
limit=$((budget_bytes + spine + slack))

# A memory cgroup with `limit` bytes; prints the directory to join.
make_cgroup() {
  local name=larder-bench-$$
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    local dir=/sys/fs/cgroup/$name
    mkdir -p "$dir" && echo "$limit" > "$dir/memory.max"
  else
    local base=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)
    local dir=$base/$name
    mkdir -p "$dir" && echo "$limit" > "$dir/memory.limit_in_bytes"
  fi
  echo "$dir"
}
CG=$(make_cgroup)
trap 'rmdir "$CG" 2>/dev/null || true' EXIT
in_cgroup() { sh -c 'echo $$ > "$0/cgroup.procs" && shift && exec "$@"' "$CG" _ "$@"; }

$L bench io --store "$WORK/k3.store" --io uring,pread,mmap --records 192 --json --out "$OUT/$STAMP-store-io.json" > /dev/null
# Arms: io_uring + O_DIRECT with prefetch (default), without prefetch, and mmap.
for r in $(seq 1 "$ROUNDS"); do
  for arm in uring uring-noprefetch mmap; do
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    case $arm in
      uring) flags="--io uring" ;;
      uring-noprefetch) flags="--io uring --prefetch 0" ;;
      mmap) flags="--io mmap" ;;
    esac
    # shellcheck disable=SC2086
    in_cgroup $L bench decode --model "$WORK/k3.store" --ram-budget "$RAM_BUDGET" $flags --new "$NEW" \
      --limit-records 192 --json --out "$OUT/$STAMP-store-decode-$arm-r$r.json" > /dev/null
    python3 - "$OUT/$STAMP-store-decode-$arm-r$r.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
pf = d['stats'].get('prefetch_reads', 0)
print(f"{d['io']['backend']:>5} prefetch_reads={pf:>4}: decode {d['decode_tok_per_s']:.3f} tok/s, {d['miss_bytes_per_token']/2**20:.0f} MiB/token, "
      f"hit {100*d['hit_rate']:.1f}%, limit {d['limit_before']['gbps']:.2f}/{d['limit_after']['gbps']:.2f} GB/s, "
      f"{100*d['ratio_to_io_bound']:.0f}% of the I/O bound, overlap {d['routing_overlap']:.3f}, ids {d['ids_hash'][-8:]}")
PY
  done
done
echo "cgroup memory limit: $limit bytes (budget $budget_bytes + spine $spine + slack $slack)"
