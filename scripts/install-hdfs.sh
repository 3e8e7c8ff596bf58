#!/usr/bin/env bash
# Builds the testkit's HDFS (libs/testkit/hdfs: a namenode and datanodes of Hadoop's
# MiniDFSCluster, from the hadoop-client-minicluster jars on Maven Central) into
# $CLUSTER_TOOLS_DIR/hdfs-<hash of its sources>, outside the clone like the cargo target dir,
# and links $CLUSTER_TOOLS_DIR/bin/primus-minihdfs to it. The Maven repository lives in
# ~/.cache/primus-rs/m2 (about 100 MB). A second run finds it and does nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/env.sh
. "$ROOT/scripts/env.sh"
SRC="$ROOT/libs/testkit/hdfs"
M2="${MAVEN_REPO_CACHE:-$HOME/.cache/primus-rs/m2}"

log() { printf '[install-hdfs] %s\n' "$*"; }

for tool in java javac mvn; do
  command -v "$tool" >/dev/null 2>&1 || { log "$tool is missing: install a JDK 17 and Maven (Debian: openjdk-17-jdk-headless maven)"; exit 1; }
done

hash="$(cat "$SRC/pom.xml" "$SRC"/src/main/java/dev/primus/testkit/*.java | sha256sum | cut -c1-12)"
OUT="$CLUSTER_TOOLS_DIR/hdfs-$hash"
if [ ! -x "$OUT/primus-minihdfs" ]; then
  hadoop_version="$(sed -n 's:.*<hadoop.version>\(.*\)</hadoop.version>.*:\1:p' "$SRC/pom.xml")"
  log "building the HDFS launcher on Hadoop $hadoop_version (Maven Central)"
  build="$(mktemp -d "$CLUSTER_TOOLS_DIR/hdfs-build.XXXXXX")"
  if ! mvn -B -q -Dstyle.color=never -Dmaven.repo.local="$M2" -f "$SRC/pom.xml" \
    dependency:build-classpath -Dmdep.outputFile="$build/classpath" >"$build/mvn.log" 2>&1; then
    cat "$build/mvn.log"; log "Maven could not resolve the launcher's dependencies"; exit 1
  fi
  javac --release 17 -nowarn -XDsuppressNotes -cp "$(cat "$build/classpath")" -d "$build/classes" \
    "$SRC"/src/main/java/dev/primus/testkit/*.java 2>&1 | grep -v "internal proprietary API\|^ *\^\|Signal\|^[0-9]* warning" || true
  [ -f "$build/classes/dev/primus/testkit/MiniHdfs.class" ] || { log "javac failed"; exit 1; }
  cat > "$build/primus-minihdfs" <<WRAPPER
#!/bin/sh
# The testkit's HDFS; flags: --base=DIR --namenode-port=PORT [--datanodes=N]
exec java -Xmx1g -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \\
  -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \\
  -cp "$OUT/classes:\$(cat "$OUT/classpath")" dev.primus.testkit.MiniHdfs "\$@"
WRAPPER
  chmod +x "$build/primus-minihdfs"
  rm -rf "$OUT"
  mv "$build" "$OUT"
  # Launchers of earlier sources.
  find "$CLUSTER_TOOLS_DIR" -maxdepth 1 -name 'hdfs-*' ! -name "hdfs-$hash" -exec rm -rf {} +
fi
mkdir -p "$CLUSTER_TOOLS_DIR/bin"
ln -sfn "$OUT/primus-minihdfs" "$CLUSTER_TOOLS_DIR/bin/primus-minihdfs"
log "primus-minihdfs: Hadoop $(sed -n 's:.*<hadoop.version>\(.*\)</hadoop.version>.*:\1:p' "$SRC/pom.xml") ($OUT)"
