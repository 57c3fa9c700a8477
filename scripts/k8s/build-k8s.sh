#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2 offline from Debian
# bookworm's own `kubernetes` source package (it vendors every Go dependency), with Debian's Go.
# Nothing is fetched from outside the Debian archive (see shared/notes/kubernetes-control-plane.md).
#
#   scripts/k8s/build-k8s.sh [OUT_DIR]      default: $(scripts/k8s/env.sh bin dir)
#
# The build (about 6 minutes on 2 cores) is cached OUTSIDE the repository; a cached build is
# detected in well under a second. Also installs etcd-server, which the control plane needs.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=env.sh
. "$HERE/env.sh"
OUT=$(realpath -m "${1:-$INFERASIM_K8S_BIN}")

have_build() {
  [ -x "$OUT/kube-apiserver" ] && "$OUT/kube-apiserver" --version 2>/dev/null | grep -q '^Kubernetes v1\.20\.' \
    && [ -x "$OUT/kube-controller-manager" ] && [ -x "$OUT/kube-scheduler" ]
}

apt_ok() { command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; }

if have_build && command -v etcd >/dev/null; then
  echo "cached: $("$OUT/kube-apiserver" --version) in $OUT; etcd $(etcd --version | head -1)"
  exit 0
fi
if ! apt_ok; then
  echo "build-k8s: needs root and apt-get (Debian bookworm) to install golang-go and etcd-server" >&2
  exit 3
fi

t0=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
if ! grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
  # Source entries for the archive apt already uses: same URIs, suites and keyring.
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      > /etc/apt/sources.list.d/debian-src.sources
  else
    sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > /etc/apt/sources.list.d/debian-src.list
  fi
fi
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends etcd-server >/dev/null
if have_build; then
  echo "cached: $("$OUT/kube-apiserver" --version) in $OUT; installed etcd"; exit 0
fi
apt-get install -y -q --no-install-recommends golang-go make rsync jq dpkg-dev \
  golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev >/dev/null

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
apt-get source -q kubernetes >/dev/null 2>&1   # 34 MB, vendor/ included
cd kubernetes-*/
# Go >= 1.18 with k8s 1.20's vendored reflect2 v1.0.1 crashes kube-apiserver (SIGSEGV) on the first
# custom-resource create; Debian's reflect2 1.0.2 and json-iterator 1.1.12 have the same APIs.
for p in github.com/modern-go/reflect2 github.com/json-iterator/go; do
  rm -rf "vendor/$p"; cp -r "/usr/share/gocode/src/$p" "vendor/$p"; find "vendor/$p" -name '*_test.go' -delete
done
# Kubernetes' own make in GOPATH mode, as debian/rules builds kubectl; a HOME inside WORK keeps the
# Go cache out of the user's home.
env -u GOFLAGS HOME="$WORK" make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler" \
  > "$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; exit 1; }
mkdir -p "$OUT"
for b in kube-apiserver kube-controller-manager kube-scheduler; do
  cp "_output/bin/$b" "$OUT/.$b.tmp" && mv "$OUT/.$b.tmp" "$OUT/$b"   # never a half-copied binary
done
echo "built in $(( $(date +%s) - t0 ))s: $("$OUT/kube-apiserver" --version) in $OUT"
