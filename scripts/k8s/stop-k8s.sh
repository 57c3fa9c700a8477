#!/usr/bin/env bash
# Stop the control plane started by start-k8s.sh RUN_DIR: exactly the processes whose ids it
# recorded (each leads its own session), never anything found by name. Keeps RUN_DIR's logs.
set -uo pipefail
D=${1:?usage: stop-k8s.sh RUN_DIR}
pids=()
for f in "$D"/scheduler.pid "$D"/kcm.pid "$D"/apiserver.pid "$D"/etcd.pid; do
  [ -f "$f" ] || continue
  pid=$(cat "$f"); rm -f "$f"
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
done
for _ in $(seq 100); do
  alive=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  [ "$alive" = 0 ] && break
  sleep 0.1
done
for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
echo "stopped ${#pids[@]} control-plane process(es) of $D"
