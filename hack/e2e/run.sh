#!/usr/bin/env bash
# make e2e: builds the images and the local cluster (cached), deploys pgpilot, runs
# test/e2e inside the cluster's network namespace, tears the cluster down and checks that
# nothing of it is left on the machine, also when interrupted. Exit status: the tests',
# or the cleanliness check's when the tests passed.
#
#   E2E_RUN=regexp   tests to run (default all); E2E_BENCH=regexp runs benchmarks instead
#   E2E_KEEP=1       leave the cluster up afterwards (make demo-down removes it)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Every test cluster takes local volumes that are released, not reused, after it goes:
# the whole suite binds about 36 (its last restore found none left at 36 once the Auto
# Pilot tests came), so 48 leave room. They are directories; sizes are labels only.
export PGPILOT_LC_PVS=${PGPILOT_LC_PVS:-48}

teardown_on_exit E2E_KEEP

step "Building the e2e test binary"
bin=$REPO_ROOT/bin/e2e.test
# E2E_TAGS adds build tags: monitoring (make e2e-monitoring) builds TestMonitoring in.
(cd "$REPO_ROOT" && go test -tags "e2e ${E2E_TAGS:-}" -c -o "$bin" ./test/e2e/)

build_images
build_s3_image
up=1
fresh_cluster_up
push_images
bash "$LC/push-image.sh" "$S3_TAR" "$S3_IMAGE"
deploy_operator

what=tests
[[ -n ${E2E_BENCH:-} ]] && what=benchmarks
step "Running the e2e $what"
args=(-test.v -test.timeout 45m)
if [[ -n ${E2E_BENCH:-} ]]; then
  # Benchmarks only: they print figures and assert nothing.
  args+=(-test.run '^$' -test.bench "$E2E_BENCH" -test.benchtime "${E2E_BENCHTIME:-10x}")
elif [[ -n ${E2E_RUN:-} ]]; then
  args+=(-test.run "$E2E_RUN")
fi
E2E_PG_MAJOR=$E2E_PG_MAJOR E2E_PG_NEXT=$E2E_PG_NEXT E2E_S3_IMAGE=$S3_IMAGE PROMETHEUS=${PROMETHEUS:-} run_tests "$bin" "${args[@]}"
