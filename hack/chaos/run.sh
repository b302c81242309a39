#!/usr/bin/env bash
# make chaos / make chaos-short: builds the images and the local cluster (cached),
# deploys pgpilot, runs the fault suite test/chaos as root inside the cluster's network
# namespace, tears the cluster down and checks that nothing of it is left. The exit
# status is the suite's (it fails when an invariant breaks), or the teardown's when the
# suite passed. docs/chaos.md says what is measured.
#
#   CHAOS_ROUNDS=3         rounds per fault and mode
#   CHAOS_FAULTS=regexp    faults to run (default all); CHAOS_MODES=regexp (async, sync,
#                          sync-local)
#   CHAOS_SHORT=1          the CI subset unless CHAOS_FAULTS/CHAOS_ROUNDS/CHAOS_MODES say
#                          otherwise: evict, container-kill, sandbox-kill, freeze,
#                          network-cut, reachable-cut, operator-kill-revoked; async and
#                          sync; 1 round
#   CHAOS_HOLD=20s         how long a frozen or cut primary stays so
#   CHAOS_RECOVERY_TIMEOUT=5m
#   CHAOS_KEEP=1           leave the cluster up afterwards (make demo-down removes it)
#
# The results table is printed at the end and kept in bin/chaos-report.md.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../e2e/lib.sh"

if [[ ${CHAOS_SHORT:-} == 1 ]]; then
  export CHAOS_FAULTS=${CHAOS_FAULTS:-^(evict|container-kill|sandbox-kill|freeze|network-cut|reachable-cut|operator-kill-revoked|operator-partition)$}
  export CHAOS_ROUNDS=${CHAOS_ROUNDS:-1}
  export CHAOS_MODES=${CHAOS_MODES:-^(async|sync)$}
fi
# Each mode's cluster takes three local volumes, and one more cluster for every round
# that does not recover.
export PGPILOT_LC_PVS=${PGPILOT_LC_PVS:-24}
REPORT=$REPO_ROOT/bin/chaos-report.md
begin=$SECONDS

# The teardown runs on every exit, an interrupted run's included, so that no cluster, no
# frozen pod and no test process is left behind.
after_teardown() {
  if [[ -s $REPORT ]]; then
    echo
    cat "$REPORT"
  fi
  step "make chaos took $((SECONDS - begin))s"
}
teardown_on_exit CHAOS_KEEP

step "Building the chaos test binary"
mkdir -p "$REPO_ROOT/bin"
rm -f "$REPORT"
bin=$REPO_ROOT/bin/chaos.test
(cd "$REPO_ROOT" && go test -tags chaos -c -o "$bin" ./test/chaos/)

build_images
up=1
fresh_cluster_up
push_images
deploy_operator
step "Running the chaos suite (faults: ${CHAOS_FAULTS:-all}, ${CHAOS_ROUNDS:-3} rounds each; $((SECONDS - begin))s so far)"
E2E_PG_MAJOR=$E2E_PG_MAJOR CHAOS_REPORT=$REPORT run_tests "$bin" -test.v -test.count 1 \
  -test.timeout "${CHAOS_TIMEOUT:-6h}" -test.run '^TestChaos$'
