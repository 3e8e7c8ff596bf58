#!/usr/bin/env bash
# From a fresh machine to a trained model: installs what is missing, builds, generates a
# Criteo-like data set (hourly Parquet under .primus/data), starts NATS, Redis and the
# standalone services (`primus up`), applies the example DLRM Job, follows its progress until
# it ends, prints its AUC next to the data's best achievable AUC, samples/s and where the
# checkpoint went, and stops the cluster again.
#
# Usage: ./scripts/quickstart.sh [URL]
# URL (default file://<repo>/.primus) is where the data set and the checkpoints go. An
# s3://bucket/prefix URL uses the S3 endpoint and credentials of the AWS_* environment
# (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, and for MinIO/SeaweedFS AWS_ENDPOINT_URL and
# AWS_ALLOW_HTTP=true), which the services inherit. An hdfs://namenode:port/prefix URL uses
# that namenode as the user HADOOP_USER_NAME (else the login user), who must be able to
# write under the prefix.
# PRIMUS_QUICKSTART_ROWS_PER_HOUR sets the data size (24 hourly windows).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

STORE="${1:-file://$ROOT/.primus}"
STORE="${STORE%/}"
case "$STORE" in
  file://*) ;;
  s3://*)
    if [[ -z "${AWS_ACCESS_KEY_ID:-}" || -z "${AWS_SECRET_ACCESS_KEY:-}" ]]; then
      echo "[quickstart] $STORE: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for MinIO or SeaweedFS)" >&2
      exit 2
    fi ;;
  hdfs://*) ;;
  *) echo "[quickstart] $STORE: give a file://, s3:// or hdfs:// URL" >&2; exit 2 ;;
esac

./scripts/install-deps.sh --without-check-tools
# shellcheck source=scripts/env.sh
. scripts/env.sh
./scripts/free-target-space.sh

# Only what `primus up` and the example Job run, without the optional parts they do not use
# here: the Kubernetes client, burn (MTRM's dense network on the CPU) and, unless the data
# goes to HDFS, the HDFS client. `cargo build --workspace` builds everything.
FEATURES=()
case "$STORE" in
  hdfs://*) FEATURES=(--features "primus-cli/hdfs,primus-master/hdfs,primus-ps/hdfs,primus-data-executor/hdfs") ;;
esac
echo "[quickstart] building the services (the first build takes several minutes)"
cargo build --locked --profile quickstart --bins --no-default-features \
  "${SERVICE_PACKAGES[@]/#/--package=}" "${FEATURES[@]}"
BIN="$CARGO_TARGET_DIR/quickstart"
DATA="$ROOT/.primus"
API_PORT=7070

# A fresh cluster each run: Redis and NATS state of an earlier run would resume its jobs.
rm -rf "$DATA"
mkdir -p "$DATA"
ROWS_PER_HOUR="${PRIMUS_QUICKSTART_ROWS_PER_HOUR:-10000}"
echo "[quickstart] generating a Criteo-like data set: 24 hours x $ROWS_PER_HOUR rows"
"$BIN/primus" datagen criteo --out "$STORE/data/criteo-like" --start 2026-11-20T00 \
  --unit hourly --windows 24 --rows-per-window "$ROWS_PER_HOUR" --cardinality-scale 0.001 \
  | tee "$DATA/datagen.txt"
BEST_AUC="$(sed -n 's/^best achievable AUC[^:]*: //p' "$DATA/datagen.txt")"

echo "[quickstart] primus up"
"$BIN/primus" up --data-dir "$DATA" \
  --nats-port "${PRIMUS_QUICKSTART_NATS_PORT:-4222}" \
  --redis-port "${PRIMUS_QUICKSTART_REDIS_PORT:-6379}" >"$DATA/up.log" 2>&1 &
UP_PID=$!
stop_cluster() {
  if kill -0 "$UP_PID" 2>/dev/null; then
    kill -TERM "$UP_PID"
    wait "$UP_PID" || { echo "[quickstart] the cluster did not stop cleanly:"; cat "$DATA/up.log"; return 1; }
  fi
}
trap 'stop_cluster || true' EXIT

for _ in $(seq 1 120); do
  grep -q "cluster up" "$DATA/up.log" && break
  kill -0 "$UP_PID" 2>/dev/null || { cat "$DATA/up.log"; echo "[quickstart] primus up failed"; exit 1; }
  sleep 0.5
done
grep -q "cluster up" "$DATA/up.log" || { cat "$DATA/up.log"; echo "[quickstart] cluster not up in 60 s"; exit 1; }
cat "$DATA/up.log"

# The example with its data and checkpoint URLs under $STORE.
sed -e "s|file://./.primus/data/|$STORE/data/|" -e "s|file://./.primus/checkpoints/|$STORE/checkpoints/|" \
  examples/criteo-like.yaml >"$DATA/criteo-like.yaml"
export PRIMUS_SERVER="http://127.0.0.1:$API_PORT" PRIMUS_TOKEN_FILE="$DATA/token"
primus() { "$BIN/primus" "$@"; }
set -x
primus apply -f "$DATA/criteo-like.yaml"
primus get jobs
set +x
echo "[quickstart] training (progress until the Job ends)"
TRAIN_START=$SECONDS
primus watch job ctr-demo || { primus describe job ctr-demo; echo "[quickstart] the job did not succeed"; exit 1; }
primus describe job ctr-demo
STATUS="$(primus get job ctr-demo -o json)"
python3 - "$BEST_AUC" "$((SECONDS - TRAIN_START))" <<PY
import json, sys
status = json.loads('''$STATUS''').get("status", {})
progress = status.get("progress") or {}
complete = next((c for c in status.get("conditions", []) if c.get("type", c.get("kind")) == "Complete"), {})
auc = progress.get("auc")
print("[quickstart] result")
print(f"  AUC (progressive, last 100k samples): {auc:.4f}" if auc is not None else "  AUC: not reported")
print(f"  best achievable AUC of the data:      {float(sys.argv[1]):.4f}")
samples, seconds = progress.get("samples") or 0, max(int(sys.argv[2]), 1)
print(f"  samples trained: {samples} in {progress.get('steps')} steps, {samples / seconds:.0f} samples/s over {seconds} s (job start to end)")
print(f"  {complete.get('message', '')}")
PY

echo "[quickstart] stopping the cluster"
trap - EXIT
stop_cluster
tail -n 6 "$DATA/up.log"
echo "[quickstart] done: data generated, model trained, every service stopped with exit 0"
