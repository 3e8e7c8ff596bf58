#!/bin/sh
# Chooses the program from the first argument: a service name (api-server, master,
# data-executor, trainer, ps, serving-sync) runs primus-<name>; `primus` runs the CLI.
set -e
case "${1:-}" in
  api-server|master|data-executor|trainer|ps|serving-sync)
    service="$1"; shift
    exec "/usr/local/bin/primus-$service" "$@" ;;
  primus)
    shift
    exec /usr/local/bin/primus "$@" ;;
  ""|-h|--help)
    echo "usage: <api-server|master|data-executor|trainer|ps|serving-sync|primus> [ARGS...]"
    exit 0 ;;
  *)
    echo "unknown program '$1': expected api-server, master, data-executor, trainer, ps, serving-sync or primus" >&2
    exit 2 ;;
esac
