#!/usr/bin/env bash
# make e2e: builds the images and the local cluster (cached), deploys pgpilot, runs
# test/e2e inside the cluster's network namespace, tears the cluster down and checks that
# nothing of it is left on the machine. Exit status: the tests', or the cleanliness
# check's when the tests passed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Every test cluster takes local volumes that are released, not reused, after it goes.
export PGPILOT_LC_PVS=${PGPILOT_LC_PVS:-24}

step "Building the e2e test binary"
bin=$REPO_ROOT/bin/e2e.test
(cd "$REPO_ROOT" && go test -tags e2e -c -o "$bin" ./test/e2e/)

build_images
build_s3_image
cluster_up
status=0
load_images && bash "$LC/load-image.sh" "$S3_TAR" && deploy_operator || status=$?
if ((status == 0)); then
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
  E2E_PG_MAJOR=$E2E_PG_MAJOR E2E_S3_IMAGE=$S3_IMAGE bash "$LC/exec.sh" "$bin" "${args[@]}" || status=$?
fi
if [[ ${E2E_KEEP:-} == 1 ]]; then
  step "E2E_KEEP=1: leaving the cluster up (make demo-down removes it)"
  exit "$status"
fi
step "Tearing the cluster down"
# down.sh ends with check-clean.sh and fails when anything of the cluster is left.
bash "$LC/down.sh" || status=$((status ? status : 1))
exit "$status"
