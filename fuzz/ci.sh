#!/usr/bin/env bash
# Bounded fuzzing run for CI (.ci/run) and by hand: installs cargo-fuzz if
# missing, builds every target in fuzz/ on the stable toolchain (no
# sanitizer: `-Zsanitizer` needs nightly), then runs each target for
# LARDER_FUZZ_SECONDS (default 30) from its committed seed corpus
# (fuzz/corpus/<target>, read-only here: new inputs go to a scratch corpus).
# Exit 0: no crash; 1: a target crashed, timed out or ran out of memory
# (the input is under fuzz/artifacts/<target>/); 2: cargo-fuzz could not be
# installed (CI prints SKIPPED). See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")"
secs="${LARDER_FUZZ_SECONDS:-30}"
targets=(checkpoint manifest config request chat_template sse trace)

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --version '^0.13' >/dev/null 2>&1 || exit 2
fi
cargo fuzz --version

# 16 codegen units and no debug info: the build is most of this step's time.
export CARGO_PROFILE_RELEASE_DEBUG=0
build=(--sanitizer none --codegen-units 16)
# LARDER_FUZZ_TARGET_DIR: build elsewhere than fuzz/target (e.g. a cache).
[[ -n "${LARDER_FUZZ_TARGET_DIR:-}" ]] && build+=(--target-dir "$LARDER_FUZZ_TARGET_DIR")
start=$SECONDS
cargo fuzz build "${build[@]}"
echo "built ${#targets[@]} targets in $((SECONDS - start)) s"

scratch="$(mktemp -d)"
# The targets' scratch folders (one per fuzzing process) go too.
trap 'rm -rf "$scratch" /dev/shm/larder-fuzz-*' EXIT
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  log="$scratch/$t.log"
  if cargo fuzz run "${build[@]}" "$t" "$scratch/$t" "corpus/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=16384 -print_final_stats=1 >"$log" 2>&1; then
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
    echo "fuzz $t: ${secs}s, ${execs:-?} execs, no crash"
  else
    tail -n 60 "$log"
    echo "fuzz $t: FAILED (input under fuzz/artifacts/$t/)"
    failed+=("$t")
  fi
done
((${#failed[@]} == 0)) || { echo "fuzz targets that failed: ${failed[*]}"; exit 1; }
