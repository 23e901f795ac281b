#!/bin/bash
bank=1176502272; out=/tmp/ab3; m=/var/tmp/pv/k3mini-uniform.store
for round in 1 2 3 4 5; do
  for cfg in pc-10 pc-25 direct-50 direct-10; do
   kind=${cfg%-*}; share=${cfg#*-}
   budget=$((bank*share/100))
   for arm in old new newoff; do
     bin=/tmp/larder-old; extra=""; [[ $arm == new* ]] && bin=/work/main/target/release/larder
     [[ $arm == newoff ]] && extra="--verify off"
     if [[ $kind == pc ]]; then extra="$extra --no-direct"; find -L $m -type f -exec cat {} + > /dev/null; else sync; echo 3 > /proc/sys/vm/drop_caches; fi
     $bin bench decode --model $m --ram-budget $budget --io uring --prefetch 2 --prompt-tokens 16 --new 32 --json $extra > $out/$cfg-$arm-$round.json 2>$out/$cfg-$arm-$round.err
     python3 -c "
import json; d=json.load(open('$out/$cfg-$arm-$round.json')); s=d['stats']
print('$cfg $arm $round', round(d['decode_tok_per_s'],2), 'hit',round(d['hit_rate'],3),'drive',round(d['limit']['gbps'],2), 'wait', round(s['io_wait_s'],3), 'verify', round(s['verify_s'],3), 'decode_s', round(s['decode_s'],3))"
   done
  done
done
echo ALLDONE
