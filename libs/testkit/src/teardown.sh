#!/bin/sh
# Removes a fixture's folder and everything it started: teardown.sh DIR [keep]
#   DIR/parts/*/       parts torn down first, each like the whole (a cluster's nodes)
#   DIR/pids/*.pid     daemons, stopped in the reverse order of their names (SIGNAL, default
#                      TERM, then KILL after 10 s; SIGNAL=KILL for a machine lost at once)
#   DIR/runc/*/        runc state roots: their containers are killed and deleted (killing the
#                      shims does not kill the containers)
#   DIR/netns          network namespaces to delete, one per line (after the pods' own)
#   DIR/cgroups        cgroup roots to remove in every hierarchy, deepest first
#   DIR/host-paths     host folders the fixture's programs write whatever they are told
# Also: containerd shims serving sockets under DIR, mounts under DIR (deepest first), and the
# pods' cni-* namespaces that DIR's containerd created. With `keep` the folder stays.
D="$1"
[ -n "$D" ] && [ -d "$D" ] || exit 0
SIGNAL="${SIGNAL:-TERM}"

alive() { # a zombie is not alive: PID 1 here may reap orphans late
  st=$(awk '/^State/{print $2}' "/proc/$1/status" 2>/dev/null)
  [ -n "$st" ] && [ "$st" != Z ]
}

for part in "$D"/parts/*/; do
  [ -d "$part" ] && sh "$0" "${part%/}" keep
done

pids=""
for f in $(ls -r "$D"/pids/*.pid 2>/dev/null); do
  p=$(cat "$f")
  if alive "$p"; then
    kill "-$SIGNAL" "$p" 2>/dev/null
    # Wait for each daemon before the next: a kubelet must stop before its containerd.
    i=0
    while alive "$p" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    alive "$p" && kill -KILL "$p" 2>/dev/null
  fi
  pids="$pids $p"
  rm -f "$f"
done

for root in "$D"/runc/*/ "$D"/docker-exec/runtime-runc/*/; do
  [ -d "$root" ] || continue
  for id in $(runc --root "$root" list -q 2>/dev/null); do
    runc --root "$root" kill "$id" KILL 2>/dev/null
    sleep 0.1
    runc --root "$root" delete -f "$id" 2>/dev/null
  done
done
# containerd and its shims (dockerd's own containerd too) name sockets under DIR.
pkill -KILL -f "containerd.*$D/" 2>/dev/null
sleep 0.3

mount | awk -v r="$D/" 'index($3, r) == 1 {print $3}' | sort -r | while read -r m; do
  umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
done

# Network namespaces: the pods' that DIR's containerd made, then the fixture's own; whatever
# still runs inside one (a container whose runc state was lost, a docker-proxy) is killed.
remove_netns() {
  for p in $(ip netns pids "$1" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  ip netns delete "$1" 2>/dev/null
}
meta="$D/containerd/root/io.containerd.metadata.v1.bolt/meta.db"
if [ -f "$meta" ]; then
  for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do
    grep -aqs "$ns" "$meta" && remove_netns "$ns"
  done
fi
if [ -f "$D/netns" ]; then
  while read -r ns; do [ -n "$ns" ] && remove_netns "$ns"; done < "$D/netns"
fi

if [ -f "$D/cgroups" ]; then
  while read -r cg; do
    [ -n "$cg" ] || continue
    for h in /sys/fs/cgroup/*/; do
      [ -d "$h${cg#/}" ] && find "$h${cg#/}" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
  done < "$D/cgroups"
fi

if [ -f "$D/host-paths" ]; then
  while read -r p; do
    case "$p" in /var/lib/kubelet|/var/log/containers|/var/lib/cni) rm -rf "$p" ;; esac
  done < "$D/host-paths"
fi

[ "$2" = keep ] || rm -rf "$D"
exit 0
