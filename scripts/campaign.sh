#!/usr/bin/env bash
# Start (or resume) THE training campaign of a drafter in the background, nice'd, from a copy of
# the release binary (so rebuilding the tree does not touch the running job). The drafter is
# PARADRAFT_CAMPAIGN_METHOD: pard, the default since DFlash's held-out α1 went flat (#57), dflash
# or dart. State, log and curve live in $HOME/.cache/paradraft/campaign/<method>; it resumes
# from its newest checkpoint, or from drafters/smollm2-135m-<method> when there is none.
#
#   scripts/campaign.sh            start it (no-op when it already runs)
#   scripts/campaign.sh pause      SIGSTOP it (before timing anything)
#   scripts/campaign.sh resume     SIGCONT it
#   scripts/campaign.sh stop       SIGTERM it: it checkpoints after its current step and exits;
#                                  mid-distillation it starts no new answer, lets those under
#                                  way finish, then checkpoints (killed after 60 s regardless:
#                                  then only that round's CPU time is lost from the counter)
#   scripts/campaign.sh status     pid, last log lines, last curve point
set -euo pipefail
cd "$(dirname "$0")/.."
METHOD="${PARADRAFT_CAMPAIGN_METHOD:-pard}"
DIR="${PARADRAFT_CAMPAIGN_DIR:-$HOME/.cache/paradraft/campaign/$METHOD}"
PIDF="$DIR/pid"
mkdir -p "$DIR"
running() { [[ -f "$PIDF" ]] && kill -0 "$(cat "$PIDF")" 2>/dev/null; }
case "${1:-start}" in
  start)
    # One start at a time: two at once both passed the check below while the binary was built
    # and ran two campaigns on one directory (2026-11-27; one failed on the other's log).
    exec 9>"$DIR/start.lock"
    flock -n 9 || { echo "a start of this campaign is under way"; exit 0; }
    if running; then echo "campaign already running (pid $(cat "$PIDF"))"; exit 0; fi
    cargo build --release --locked -q
    mkdir -p "$DIR/bin"
    cp target/release/paradraft "$DIR/bin/paradraft"
    shift || true
    nohup nice -n 19 "$DIR/bin/paradraft" train campaign --method "$METHOD" --dir "$DIR" "$@" \
      >>"$DIR/run.log" 2>&1 9>&- &
    echo $! >"$PIDF"
    echo "campaign started (pid $!), log $DIR/run.log"
    ;;
  pause) running && kill -STOP "$(cat "$PIDF")" && echo paused ;;
  resume) running && kill -CONT "$(cat "$PIDF")" && echo resumed ;;
  stop)
    running || exit 0
    pid="$(cat "$PIDF")"
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || { echo stopped; exit 0; }; sleep 1; done
    kill -KILL "$pid" 2>/dev/null || true
    # Wait for it to go, so that a `start` right after does not find it still running.
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "stopped (killed after 60 s)"
    ;;
  status)
    if running; then echo "running (pid $(cat "$PIDF"))"; else echo "not running"; fi
    tail -n 3 "$DIR/run.log" 2>/dev/null || true
    tail -n 1 "$DIR/curve.jsonl" 2>/dev/null || true
    ;;
  *) echo "usage: $0 [start|pause|resume|stop|status] [train campaign options]" >&2; exit 2 ;;
esac
