# Sourced by the other scripts (and printable: `scripts/k8s/env.sh` prints the settings).
# Where the control-plane binaries are cached: outside the repository, shared by every checkout.
: "${INFERASIM_CACHE:=${XDG_CACHE_HOME:-$HOME/.cache}/inferasim}"
: "${INFERASIM_K8S_BIN:=$INFERASIM_CACHE/k8s/v1.20.2/bin}"
export INFERASIM_CACHE INFERASIM_K8S_BIN
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "INFERASIM_CACHE=$INFERASIM_CACHE"
  echo "INFERASIM_K8S_BIN=$INFERASIM_K8S_BIN"
fi
