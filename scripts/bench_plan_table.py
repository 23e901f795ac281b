"""Prints the Markdown table of a scripts/bench_plan.sh run: per arm, measured
decode tok/s against the I/O bound and `larder plan`'s forecast of it.
Usage: python3 scripts/bench_plan_table.py OUT_DIR [PLAN_SUFFIX]"""
import glob, json, sys

out = sys.argv[1]
suffix = sys.argv[2] if len(sys.argv) > 2 else ".plan.json"
print("| routing | budget | arm | measured tok/s | I/O bound tok/s | ratio to bound | hit (measured / simulated) | MB read per token (measured / planned) | planned tok/s | error | binds |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
errors = []
for f in sorted(glob.glob(f"{out}/*.decode.json")):
    name = f.split("/")[-1][: -len(".decode.json")]
    routing, share, arm = name.split("-", 2)
    d = json.load(open(f))
    p = json.load(open(f[: -len(".decode.json")] + suffix))
    m, fc = d["decode_tok_per_s"], p["decode_tok_per_s"]
    err = 100 * (fc - m) / m
    errors.append(abs(err))
    print(f"| {routing} | {share}% | {arm} | {m:.2f} | {d['io_bound_tok_per_s']:.2f} | {d['ratio_to_io_bound']:.2f} | "
          f"{d['hit_rate']:.3f} / {p['hit_rate']:.3f} | {d['miss_bytes_per_token']/1e6:.0f} / {p['bytes_per_token']/1e6:.0f} | "
          f"{fc:.2f} | {err:+.1f}% | {p['binding']} |")
within = sum(e <= 15 for e in errors)
print(f"\n{within} of {len(errors)} arms within 15%; median |error| {sorted(errors)[len(errors)//2]:.1f}%")
