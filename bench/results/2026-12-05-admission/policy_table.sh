#!/bin/bash
# default policy / belady per trace at 10..60%
B=${1:-/work/main/target/release/larder}
for t in /tmp/m-local.trace /tmp/m-skewed.trace /tmp/m-mixed.trace /tmp/m-uniform.trace /tmp/k3-local.trace /tmp/k3-mixed.trace /tmp/k3-skewed.trace /work/main/bench/results/2026-12-03-plan/run-skewed.trace /work/main/bench/results/2026-12-03-plan/run-uniform.trace /work/main/bench/results/2026-12-05-plan/validation/local-25-uring-noprefetch.trace /work/main/bench/results/2026-12-05-plan/validation/skewed-25-uring-noprefetch.trace /work/main/bench/results/2026-12-05-plan/validation/uniform-25-uring-noprefetch.trace; do
  $B bench cache --trace $t --json 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin)
r=[b['policies'][b['default_policy']]['hit_rate']/max(1e-9,b['policies']['belady']['hit_rate']) for b in d['budgets']]
print('%-40s'%'$t'.split('/')[-1], ' '.join('%.3f'%x for x in r))" &
done; wait
