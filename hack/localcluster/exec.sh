#!/usr/bin/env bash
# exec.sh CMD [ARGS...]: runs CMD inside the local cluster's network namespace with
# KUBECONFIG set and the cluster's kubectl first on PATH. That namespace is the only
# place the cluster can be reached from (node 10.77.0.1, pods, Service IPs), and there
# Service names resolve through CoreDNS:
#
#   hack/localcluster/exec.sh kubectl get pods -A
#   hack/localcluster/exec.sh go test ./test/e2e/...
#
# There is no network off the machine in there: build or download what a command needs
# (Go modules, say) before.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

(($# > 0)) || die "usage: exec.sh CMD [ARGS...]"
require_root
netns_exists || die "the local cluster is not up: run hack/localcluster/up.sh"
export KUBECONFIG=$LC_KUBECONFIG
export PATH=$LC_K8S_BIN:$PATH
# The node's registry ($LC_REGISTRY) has a certificate of the cluster CA.
registry_trust
# `ip netns exec` (not nsenter) so /etc/netns/pgpilot-lc/resolv.conf becomes the
# command's /etc/resolv.conf.
exec ip netns exec "$LC_NETNS" "$@"
