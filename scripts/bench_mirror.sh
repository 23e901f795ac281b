#!/usr/bin/env bash
# Mirrored hot experts on two emulated drives of different speed (root only):
# two loop-mounted ext4 images, read-throttled by the block cgroup (v1 blkio
# or v2 io.max) to SLOW and FAST bytes/s. A synthetic k3-mini (skewed routing)
# is packed onto the slow drive only (a store made before a faster drive was
# added), run once for heat, then decoded in interleaved arms:
#   none         - no mirrors
#   hot-demands  - MIRROR_SHARE of the bank mirrored onto the fast drive: the most demanded records
#   hot-reads    - the same size: the records most read from the drive (misses and prefetches)
#   all          - every expert mirrored
# Each arm reports decode tok/s, bytes per drive and the output ids (all arms
# must agree). Results: bench/results/<date>-mirror/ (JSON lines + summary).
#
#   sudo scripts/bench_mirror.sh [WORK_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-/var/tmp/larder-bench-mirror}
LARDER=${LARDER:-$ROOT/target/release/larder}
SLOW=${SLOW:-250000000}
FAST=${FAST:-750000000}
BUDGET_SHARE=${BUDGET_SHARE:-0.10}
MIRROR_SHARE=${MIRROR_SHARE:-0.30}
ROUNDS=${ROUNDS:-3}
NEW=${NEW:-24}
OUT=$ROOT/bench/results/$(date -u +%F)-mirror
[ "$(id -u)" = 0 ] || { echo "bench_mirror.sh needs root (loop devices, cgroups, drop_caches)" >&2; exit 1; }
[ -x "$LARDER" ] || (cd "$ROOT" && cargo build --release -p larder)
mkdir -p "$WORK" "$OUT"

drive() { # name -> mounted folder on a fresh loop device
  local img=$WORK/$1.img mnt=$WORK/mnt-$1 dev
  [ -f "$img" ] || truncate -s 6G "$img"
  dev=$(losetup -j "$img" | cut -d: -f1)
  if [ -z "$dev" ]; then dev=$(losetup -f --show "$img"); mkfs.ext4 -q -F "$dev"; fi
  mkdir -p "$mnt"; mountpoint -q "$mnt" || mount "$dev" "$mnt"
  echo "$dev"
}
SLOW_DEV=$(drive slow); FAST_DEV=$(drive fast)
majmin() { lsblk -no MAJ:MIN "$1" | tr -d ' '; }

# A cgroup whose reads from each loop device are capped.
if [ -d /sys/fs/cgroup/blkio ]; then
  CG=/sys/fs/cgroup/blkio/larder-bench-mirror; mkdir -p $CG
  echo "$(majmin "$SLOW_DEV") $SLOW" > $CG/blkio.throttle.read_bps_device
  echo "$(majmin "$FAST_DEV") $FAST" > $CG/blkio.throttle.read_bps_device
else
  CG=/sys/fs/cgroup/larder-bench-mirror; mkdir -p $CG
  echo +io > /sys/fs/cgroup/cgroup.subtree_control || true
  echo "$(majmin "$SLOW_DEV") rbps=$SLOW" > $CG/io.max
  echo "$(majmin "$FAST_DEV") rbps=$FAST" > $CG/io.max
fi
in_cg() { bash -c 'echo $$ > "$0"/cgroup.procs; exec "$@"' "$CG" "$@"; }

MODEL=$WORK/k3mini-skewed STORE=$WORK/store
[ -f "$MODEL/config.json" ] || "$LARDER" synth --arch kimi_linear --preset k3-mini --experts-format mxfp4 \
  --experts-gib 1.1 --routing skewed --measure-tokens 0 --out "$MODEL" >/dev/null
[ -f "$STORE/manifest.json" ] || "$LARDER" pack --model "$MODEL" --out "$STORE" \
  --drive "$WORK/mnt-slow:$(awk "BEGIN{print $SLOW/1e9}")" --json >/dev/null
BANK=$(python3 -c "import json;m=json.load(open('$STORE/manifest.json'));print(sum(e['len'] for l in m['layers'] for e in l['experts']))")
BUDGET=$(awk "BEGIN{printf \"%d\", $BANK*$BUDGET_SHARE}")
IDS=$(python3 -c "print(','.join(str((i*7919)%30000+100) for i in range(64)))")
run() {
  sync; echo 3 > /proc/sys/vm/drop_caches
  in_cg "$LARDER" run --model "$STORE" --ids "$IDS" --max-new "$NEW" --ignore-eos --ram-budget "$BUDGET" \
    --io uring --stats --json 2>/dev/null
}
[ -f "$STORE/heat.json" ] || run >/dev/null
cp "$STORE/heat.json" "$WORK/heat.json"
mirror() { # name bytes --by -> mirrors.<name> beside the store, its files kept aside
  "$LARDER" mirror "$STORE" --size "$2" --by "$3" --drive "$WORK/mnt-fast:$(awk "BEGIN{print $FAST/1e9}")" \
    --heat "$WORK/heat.json" --json > "$OUT/mirror-$1.json"
  cp "$STORE/mirrors.json" "$STORE/mirrors.$1"
  cp "$(ls -d "$WORK"/mnt-fast/larder-*)"/mirror-g* "$WORK/keep/"
}
# Every set stays on the fast drive: each mirror run removes the files of
# the generation before it, so they are kept aside and put back at the end.
HOT=$(awk "BEGIN{printf \"%d\", $BANK*$MIRROR_SHARE}")
rm -f "$STORE/mirrors.json"; rm -rf "$WORK/keep"; mkdir -p "$WORK/keep"
mirror hot-demands "$HOT" demands
mirror hot-reads "$HOT" reads
mirror all "$BANK" demands
rm -f "$STORE/mirrors.json"
cp -n "$WORK/keep/"* "$(ls -d "$WORK"/mnt-fast/larder-*)/"
: > "$OUT/runs.jsonl"
for r in $(seq "$ROUNDS"); do
  for arm in none hot-demands hot-reads all; do
    rm -f "$STORE/mirrors.json"
    [ $arm = none ] || cp "$STORE/mirrors.$arm" "$STORE/mirrors.json"
    cp "$WORK/heat.json" "$STORE/heat.json"
    run | python3 -c "
import json,sys; d=json.load(sys.stdin); s=d['stats']
print(json.dumps({'arm':'$arm','round':$r,'decode_tok_per_s':s['decode_tok_per_s'],'prefill_tok_per_s':s['prefill_tok_per_s'],
 'expert_bytes_read':s['expert_bytes_read'],'drive_bytes':s['drive_bytes'],'io_wait_s':s['io_wait_s'],'decode_s':s['decode_s'],'prefill_s':s['prefill_s'],
 'hit_rate':s['hit_rate'],'ids_hash':hash(tuple(d['ids']))&0xffffffff}))" | tee -a "$OUT/runs.jsonl"
  done
done
rm -f "$STORE/mirrors.json"; cp "$WORK/heat.json" "$STORE/heat.json"
python3 - "$OUT" "$SLOW" "$FAST" "$BANK" "$BUDGET" "$HOT" <<'EOF'
import json, sys, statistics as st
out, slow, fast, bank, budget, hot = sys.argv[1], *map(float, sys.argv[2:])
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
assert len({r['ids_hash'] for r in runs}) == 1, "arms disagree on the output ids"
gbps = [slow / 1e9, fast / 1e9]
lines = [f"drives: slow {slow/1e9:.2f} GB/s (holds the store), fast {fast/1e9:.2f} GB/s (mirrors only); loop devices "
         f"with cgroup read caps. Bank {bank/2**30:.2f} GiB, RAM budget {budget/2**20:.0f} MiB, hot mirror "
         f"{hot/2**20:.0f} MiB. All arms: the same ids.", "",
         "| arm | decode tok/s (median, min-max) | expert GB read | share from the fast drive | run s | "
         "bound of its split (max per drive) / run | both drives' bound / run |", "|---|---|---|---|---|---|---|"]
for arm in ["none", "hot-demands", "hot-reads", "all"]:
    rs = [r for r in runs if r['arm'] == arm]
    tps = [r['decode_tok_per_s'] for r in rs]
    med = lambda f: st.median(f(r) for r in rs)
    secs = lambda r: r['prefill_s'] + r['decode_s']
    split = lambda r: max(b / 1e9 / gbps[d] for d, b in enumerate(r['drive_bytes'])) / secs(r)
    both = lambda r: r['expert_bytes_read'] / 1e9 / sum(gbps) / secs(r)
    lines.append(f"| {arm} | {st.median(tps):.2f} ({min(tps):.2f}-{max(tps):.2f}) | {med(lambda r: r['expert_bytes_read'])/1e9:.2f} | "
                 f"{med(lambda r: sum(r['drive_bytes'][1:]) / max(1, sum(r['drive_bytes']))):.2f} | {med(secs):.1f} | "
                 f"{med(split):.2f} | {med(both):.2f} |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
