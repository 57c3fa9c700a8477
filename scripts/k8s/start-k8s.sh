#!/usr/bin/env bash
# Start a real Kubernetes v1.20.2 control plane on 127.0.0.1 only: etcd (Debian's etcd-server),
# kube-apiserver (RBAC on, status subresources, token auth), kube-controller-manager and
# kube-scheduler (built by build-k8s.sh). No kubelet: tests play it by patching pod status.
#
#   scripts/k8s/start-k8s.sh RUN_DIR [CRD_DIR]
#
# Writes RUN_DIR/kubeconfig (cluster admin), RUN_DIR/env (KUBECONFIG and ports, to source) and
# RUN_DIR/*.pid; stop with scripts/k8s/stop-k8s.sh RUN_DIR. Ports are free ones picked at start,
# so several control planes (CI, a developer's test run) can run side by side.
# CRDs given in CRD_DIR are applied BEFORE the controller-manager starts, so its garbage
# collector knows them at once (otherwise up to 30 s late).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/env.sh"
D=$(realpath -m "${1:?usage: start-k8s.sh RUN_DIR [CRD_DIR]}"); CRDS=${2:-}
BIN=$INFERASIM_K8S_BIN
ETCD=${INFERASIM_ETCD:-$(command -v etcd || true)}
for b in kube-apiserver kube-controller-manager kube-scheduler; do
  [ -x "$BIN/$b" ] || { echo "start-k8s: $BIN/$b missing; run scripts/k8s/build-k8s.sh" >&2; exit 3; }
done
[ -n "$ETCD" ] || { echo "start-k8s: etcd not found (apt-get install etcd-server)" >&2; exit 3; }
command -v openssl >/dev/null || { echo "start-k8s: openssl not found" >&2; exit 3; }
t0=$(date +%s.%N)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ETCD_PORT=$(free_port); PEER_PORT=$(free_port); API_PORT=$(free_port); KCM_PORT=$(free_port); SCHED_PORT=$(free_port)

[ -d "$D" ] && [ -n "$(ls "$D"/*.pid 2>/dev/null)" ] && "$HERE/stop-k8s.sh" "$D" >/dev/null 2>&1 || true
rm -rf "$D"; mkdir -p "$D/etcd" "$D/pki"; P=$D/pki
openssl genrsa -out "$P/sa.key" 2048 2>/dev/null; openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" -days 3650 -subj /CN=inferasim-test-ca 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$P/apiserver.key" -out "$P/apiserver.csr" -subj /CN=kube-apiserver 2>/dev/null
echo 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes.default.svc' > "$P/ext.cnf"
openssl x509 -req -in "$P/apiserver.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -out "$P/apiserver.crt" \
  -days 3650 -extfile "$P/ext.cnf" 2>/dev/null
TOKEN=$(openssl rand -hex 16); echo "$TOKEN,admin,admin,system:masters" > "$P/tokens.csv"; chmod 600 "$P/tokens.csv"

# setsid: each component in its own session, so stop-k8s.sh ends exactly these processes.
setsid "$ETCD" --name test --data-dir "$D/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-cluster "test=http://127.0.0.1:$PEER_PORT" \
  --unsafe-no-fsync > "$D/etcd.log" 2>&1 < /dev/null & echo $! > "$D/etcd.pid"
setsid "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 --secure-port="$API_PORT" --insecure-port=0 \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
  --token-auth-file="$P/tokens.csv" --authorization-mode=Node,RBAC --service-cluster-ip-range=10.0.0.0/24 \
  --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$P/sa.pub" \
  --service-account-signing-key-file="$P/sa.key" > "$D/apiserver.log" 2>&1 < /dev/null & echo $! > "$D/apiserver.pid"
cat > "$D/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: inferasim-test, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$P/ca.crt"}}]
users: [{name: admin, user: {token: "$TOKEN"}}]
contexts: [{name: inferasim-test, context: {cluster: inferasim-test, user: admin, namespace: default}}]
current-context: inferasim-test
KC
chmod 600 "$D/kubeconfig"
ready=
for _ in $(seq 600); do
  if curl -sf --cacert "$P/ca.crt" -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$API_PORT/readyz" >/dev/null; then
    ready=1; break
  fi
  kill -0 "$(cat "$D/apiserver.pid")" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$ready" ]; then
  echo "start-k8s: kube-apiserver not ready" >&2; tail -20 "$D/etcd.log" "$D/apiserver.log" >&2; "$HERE/stop-k8s.sh" "$D"; exit 1
fi
export KUBECONFIG=$D/kubeconfig
KUBECTL=${KUBECTL:-kubectl}
if [ -n "$CRDS" ]; then
  "$KUBECTL" apply -f "$CRDS" >/dev/null
  "$KUBECTL" wait --for condition=established crd --all --timeout=60s >/dev/null
fi
setsid "$BIN/kube-controller-manager" --kubeconfig="$D/kubeconfig" --leader-elect=false --bind-address=127.0.0.1 \
  --secure-port="$KCM_PORT" --port=0 --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
  --use-service-account-credentials=true \
  --controllers='*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service,-route,-attachdetach,-persistentvolume-binder,-persistentvolume-expander,-ttl' \
  > "$D/kcm.log" 2>&1 < /dev/null & echo $! > "$D/kcm.pid"
setsid "$BIN/kube-scheduler" --kubeconfig="$D/kubeconfig" --leader-elect=false --bind-address=127.0.0.1 \
  --secure-port="$SCHED_PORT" --port=0 > "$D/scheduler.log" 2>&1 < /dev/null & echo $! > "$D/scheduler.pid"
cat > "$D/env" <<ENV
export KUBECONFIG=$D/kubeconfig
export INFERASIM_K8S_RUN=$D
export INFERASIM_K8S_API_PORT=$API_PORT
ENV
# Ready when the controller-manager has given the default ServiceAccount its token.
for _ in $(seq 300); do
  if [ -n "$("$KUBECTL" get sa default -o jsonpath='{.secrets}' 2>/dev/null)" ]; then
    echo "control plane up in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s: KUBECONFIG=$D/kubeconfig"
    exit 0
  fi
  sleep 0.2
done
echo "start-k8s: controller-manager not ready" >&2; tail -20 "$D/apiserver.log" "$D/kcm.log" >&2
"$HERE/stop-k8s.sh" "$D"; exit 1
