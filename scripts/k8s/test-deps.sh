#!/usr/bin/env bash
# What the integration and e2e tests need beside the Python packages: Prometheus and etcd (Debian
# packages) and the Kubernetes v1.20.2 control plane (built once by build-k8s.sh, cached outside
# the repository). `make test` runs this first.
#
# Lenient by design: on a machine without root or apt-get it installs nothing and says so, and
# those tests SKIP with the reason. INFERASIM_SKIP_TEST_DEPS=1 skips it; INFERASIM_REQUIRE_E2E=1
# (CI) turns every failure here into an error.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/env.sh"
strict=${INFERASIM_REQUIRE_E2E:-}
fail() { echo "test-deps: $*" >&2; [ -n "$strict" ] && exit 1; echo "test-deps: the e2e/integration tests will skip" >&2; exit 0; }

[ "${INFERASIM_SKIP_TEST_DEPS:-}" = 1 ] && { echo "test-deps: skipped (INFERASIM_SKIP_TEST_DEPS=1)"; exit 0; }
have_k8s() { [ -x "$INFERASIM_K8S_BIN/kube-apiserver" ] && [ -x "$INFERASIM_K8S_BIN/kube-controller-manager" ] \
  && [ -x "$INFERASIM_K8S_BIN/kube-scheduler" ]; }
if have_k8s && command -v etcd >/dev/null && command -v prometheus >/dev/null && command -v kubectl >/dev/null; then
  exit 0   # all there: nothing to do (the common case)
fi
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
  fail "prometheus, etcd or the Kubernetes binaries are missing, and installing them needs root and apt-get"
fi
export DEBIAN_FRONTEND=noninteractive
t0=$(date +%s)
pkgs=""
command -v prometheus >/dev/null || pkgs="$pkgs prometheus"
command -v etcd >/dev/null || pkgs="$pkgs etcd-server"
command -v kubectl >/dev/null || pkgs="$pkgs kubernetes-client"
if [ -n "$pkgs" ]; then
  echo "test-deps: apt-get install$pkgs"
  apt-get update -q >/dev/null || fail "apt-get update failed"
  # --no-install-recommends: prometheus' recommends pull 36 packages (node exporter ...)
  apt-get install -y -q --no-install-recommends $pkgs >/dev/null || fail "apt-get install$pkgs failed"
fi
if ! have_k8s; then
  echo "test-deps: building Kubernetes v1.20.2 from Debian's source package into $INFERASIM_K8S_BIN (~6-13 min, once)"
  bash "$HERE/build-k8s.sh" || fail "scripts/k8s/build-k8s.sh failed"
fi
echo "test-deps: ready in $(( $(date +%s) - t0 )) s"
