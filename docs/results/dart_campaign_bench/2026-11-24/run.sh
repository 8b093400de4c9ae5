#!/bin/bash
cd /work/main
B=./target/release/paradraft
scripts/campaign.sh pause; sleep 2
for T in 0 1; do
  $B bench --methods dart,pld --temperature $T --seed 1 --out /tmp/bench/new_t$T > /tmp/bench/new_t$T.log 2>&1
  $B bench --methods dart --draft-model /tmp/dart_old --temperature $T --seed 1 --out /tmp/bench/old_t$T > /tmp/bench/old_t$T.log 2>&1
done
$B bench --methods dart --fixed-draft --tree-budget 8 --out /tmp/bench/new_fixed8 > /tmp/bench/new_fixed8.log 2>&1
$B bench --methods dart --fixed-draft --tree-budget 8 --draft-model /tmp/dart_old --out /tmp/bench/old_fixed8 > /tmp/bench/old_fixed8.log 2>&1
scripts/campaign.sh resume
echo done > /tmp/bench/done
