#!/usr/bin/env bash
# make run: the operator against the current kubeconfig's cluster when one answers,
# else against an embedded local control plane (hack/localcp).
set -euo pipefail
cd "$(dirname "$0")/.."

kubectl=$(command -v kubectl || true)
[[ -n $kubectl ]] || kubectl="$(bash hack/control-plane.sh)/kubectl"

if "$kubectl" version --request-timeout=5s >/dev/null 2>&1; then
  context=$("$kubectl" config current-context 2>/dev/null || echo "in-cluster")
  echo "Running pgpilot against the cluster of context ${context}; installing the CRDs first."
  "$kubectl" apply --server-side -f config/crd/bases >/dev/null
  : "${RELATED_IMAGE_AGENT:=${IMG:-controller:latest}}"
  # PgBouncer's, for spec.pooler: config/manager's unless given.
  : "${RELATED_IMAGE_PGBOUNCER:=$(awk '/- name: RELATED_IMAGE_PGBOUNCER$/ { getline; print $2; exit }' config/manager/manager.yaml)}"
  export RELATED_IMAGE_AGENT RELATED_IMAGE_PGBOUNCER
  trap 'kill 0' EXIT INT TERM
  bin/manager --metrics-bind-address=0 --health-probe-bind-address=:8081 &
  bin/controller --metrics-bind-address=0 --health-probe-bind-address=:8082 &
  wait -n
  exit 1
fi

echo "No cluster answers at the current kubeconfig: starting an embedded local control plane."
go build -o bin/localcp ./hack/localcp
exec bin/localcp --kubeconfig-out "${PGPILOT_LOCAL_KUBECONFIG:-bin/local/kubeconfig}"
