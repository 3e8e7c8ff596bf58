#!/usr/bin/env bash
# Keeps the shared build directory ($CARGO_TARGET_DIR, outside the clone) from filling the
# disk: every change of profile or dependency leaves the old artifacts behind. When the
# disk holding it has less than PRIMUS_MIN_FREE_GIB (default 20) free, the incremental
# caches go first, then the quickstart's build, then the whole dev build (the next build is
# a cold one).
set -euo pipefail
: "${CARGO_TARGET_DIR:?source scripts/env.sh first}"
MIN_FREE_GIB="${PRIMUS_MIN_FREE_GIB:-20}"

free_gib() {
  local dir="$CARGO_TARGET_DIR"
  while [ ! -d "$dir" ]; do dir="$(dirname "$dir")"; done
  df --output=avail -BG "$dir" | tail -1 | tr -dc '0-9'
}

for stale in "$CARGO_TARGET_DIR/debug/incremental" "$CARGO_TARGET_DIR/quickstart" \
  "$CARGO_TARGET_DIR/debug"; do
  free="$(free_gib)"
  if [ "$free" -ge "$MIN_FREE_GIB" ]; then
    exit 0
  fi
  if [ -d "$stale" ]; then
    echo "[build] ${free} GiB free on the disk of $CARGO_TARGET_DIR (< ${MIN_FREE_GIB} GiB): removing $stale"
    rm -rf "$stale"
  fi
done
free="$(free_gib)"
if [ "$free" -lt "$MIN_FREE_GIB" ]; then
  echo "[build] only ${free} GiB free on the disk of $CARGO_TARGET_DIR after removing old builds; a build may run out of space" >&2
fi
