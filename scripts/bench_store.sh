#!/usr/bin/env bash
# Streaming benchmark of the SSD expert store (issue: "The SSD expert store"),
# now the manifest bench/manifests/store-backends.toml: a packed k3-mini store
# with an 8 GiB expert bank; io_uring + O_DIRECT with and without prefetch and
# mmap, interleaved over two rounds, each in the same cgroup memory limit,
# the drive limit measured before and after every run, ids checked against
# the uring arm. Edit the manifest (or a copy) to change sizes or rounds.
#
# Usage: scripts/bench_store.sh [OUT_DIR]   (root for the cgroup and drop_caches)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
args=(bench run bench/manifests/store-backends.toml)
[ $# -ge 1 ] && args+=(--out "$1")
exec target/release/larder "${args[@]}"
