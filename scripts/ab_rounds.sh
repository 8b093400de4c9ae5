#!/usr/bin/env bash
# Interleaved A/B of two paradraft binaries: ROUNDS rounds (default 2), each running CMD with
# the binary before the change (OLD) and then with the one after it (NEW). CMD is a bash
# command that finds the binary in $BIN, the output directory in $OUT and the run's name
# (old-r1, new-r1, ...) in $RUN; its stdout and stderr go to OUT/RUN.log. Pause the training
# campaign first (scripts/campaign.sh pause).
# Usage: OLD=BIN NEW=BIN [ROUNDS=N] scripts/ab_rounds.sh OUT 'CMD'
set -euo pipefail
OUT=${1:?output dir}
CMD=${2:?command}
: "${OLD:?binary before}" "${NEW:?binary after}"
mkdir -p "$OUT"
for r in $(seq "${ROUNDS:-2}"); do
  for v in old new; do
    b=OLD; [[ $v == new ]] && b=NEW
    BIN=${!b} OUT=$OUT RUN=$v-r$r bash -c "$CMD" > "$OUT/$v-r$r.log" 2>&1
  done
done
