#!/usr/bin/env bash
# Validates `larder plan` against measured decode: for each routing preset,
# cache budget (share of the bank) and arm (io_uring with prefetch, pread with
# prefetch, io_uring without prefetch), `bench decode --trace` measures decode
# tok/s (with the drive limit before and after) and records the route trace;
# `plan` then forecasts the same run from the model, that trace, the budget,
# the drive limit measured in the run, the arm's backend and `bench kernels`
# figures. Arms are interleaved per budget so drive drift hits every arm alike.
# Usage: scripts/bench_plan.sh LARDER_BIN OUT_DIR MODEL_PREFIX [ROUTINGS...]
#   (models: MODEL_PREFIX-ROUTING, e.g. from `larder synth --arch kimi_linear
#   --preset k3-mini --experts-format mxfp4 --experts-gib 1 --routing R --out k3mini-R`)
set -euo pipefail
bin="$1"; out="$2"; prefix="$3"; shift 3
routings=("${@:-uniform skewed}")
mkdir -p "$out"
# Kernels on every core, as decode runs them (`plan` divides by the threads measured).
[[ -f "$out/kernels.json" ]] || "$bin" bench kernels --formats bf16,mxfp4 --rows 1,256 --shapes 2048x1408 \
  --threads "$(nproc)" --no-candle --json --out "$out/kernels.json" >/dev/null
ram_gbps=$(python3 -c "import json; print(json.load(open('$out/kernels.json'))['ram_gbps'])")
for routing in ${routings[*]}; do
  model="$prefix-$routing"
  bank=$("$bin" doctor --model "$model" --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['model']['expert_bank_bytes'])")
  for share in 10 25 50; do
    budget=$((bank * share / 100))
    for arm in uring pread uring-noprefetch; do
      io=${arm%%-*}; pf=2; [[ $arm == *noprefetch ]] && pf=0
      name="$routing-$share-$arm"
      sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
      "$bin" bench decode --model "$model" --ram-budget "$budget" --io "$io" --prefetch $pf \
        --prompt-tokens 16 --new 32 --json --trace "$out/$name.trace" --overwrite >"$out/$name.decode.json" 2>"$out/$name.err"
      drive=$(python3 -c "import json; print(json.load(open('$out/$name.decode.json'))['limit']['gbps'])")
      extra=(); [[ $pf == 0 ]] && extra=(--no-prefetch)
      "$bin" plan --model "$model" --ram-budget "$budget" --drive "$drive" --trace "$out/$name.trace" \
        --kernels "$out/kernels.json" --ram-gbps "$ram_gbps" --io "$io" --json "${extra[@]}" >"$out/$name.plan.json"
      python3 - "$out/$name" <<'PY'
import json, sys
d = json.load(open(sys.argv[1] + ".decode.json")); p = json.load(open(sys.argv[1] + ".plan.json"))
m, f = d["decode_tok_per_s"], p["decode_tok_per_s"]
print(f"{sys.argv[1].split('/')[-1]:28s} measured {m:6.2f} tok/s  planned {f:6.2f}  error {100*(f-m)/m:+6.1f}%  "
      f"hit {d['hit_rate']:.3f} vs {p['hit_rate']:.3f}  drive {d['limit']['gbps']:.2f} GB/s  bound {p['binding']}")
PY
    done
  done
done
