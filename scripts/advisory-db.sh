#!/usr/bin/env bash
# Makes sure cargo-deny has a RustSec advisory database to check against offline: the copy
# under $CARGO_HOME/advisory-dbs, or the dated snapshot in third_party/ when that is newer
# (or there is none). Prints the date of the database the check will use.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# cargo-deny's folder for the default database URL (github.com/rustsec/advisory-db).
db="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs/advisory-db-3157b0e258782691"
snapshot="$(mktemp -d)"
trap 'rm -rf "$snapshot"' EXIT
git clone -q "$ROOT/third_party/rustsec-advisory-db/advisory-db.bundle" "$snapshot/db"
commit_time() { git -C "$1" log -1 --format=%ct 2>/dev/null || echo 0; }
if [ ! -d "$db/crates" ] || [ "$(commit_time "$snapshot/db")" -gt "$(commit_time "$db")" ]; then
  rm -rf "$db"
  mkdir -p "$(dirname "$db")"
  mv "$snapshot/db" "$db"
fi
git -C "$db" log -1 --format=%cs
