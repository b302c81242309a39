# shellcheck shell=bash
# What `make demo` and `make e2e` share: build the images, bring up the local cluster,
# push the images to its registry, and deploy pgpilot with config/default (sourced, not
# run).

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PGPILOT_CACHE=${PGPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgpilot}
REPO_ROOT=$(cd "$E2E_DIR/../.." && pwd)
LC=$REPO_ROOT/hack/localcluster
# The local cluster's names (K8S_VERSION, netns_exists, ...); it sets REPO_ROOT alike.
# shellcheck source=../localcluster/lib.sh
source "$LC/lib.sh"
# The local PostgreSQL image is Debian's PostgreSQL 15 (the only major that can be had
# offline here besides 17 and 18): the demo and the tests ask for version 15, never
# tag 15's binaries as another major.
E2E_PG_MAJOR=15
# The newer major the upgrade tests move a cluster to (Debian's PostgreSQL 17), also the
# image a cluster of version 17 runs on the local node.
E2E_PG_NEXT=17

step() { printf '\n==> %s\n' "$*" >&2; }

# build_images sets OPERATOR_TAR, OPERATOR_IMAGE, POSTGRES_TAR, POSTGRES_IMAGE,
# POSTGRES_NEXT_TAR, POSTGRES_NEXT_IMAGE, PGBOUNCER_TAR and PGBOUNCER_IMAGE.
build_images() {
  local out
  step "Building the operator image (the three binaries, the chart; seconds once Go's cache is warm)"
  out=$(bash "$REPO_ROOT/hack/images/operator.sh")
  OPERATOR_TAR=$(sed -n 1p <<<"$out")
  OPERATOR_IMAGE=$(sed -n 2p <<<"$out")
  step "Building the PostgreSQL $E2E_PG_MAJOR image from Debian packages (about a minute, once)"
  out=$(bash "$REPO_ROOT/hack/images/postgres.sh")
  POSTGRES_TAR=$(sed -n 1p <<<"$out")
  POSTGRES_IMAGE=$(sed -n 2p <<<"$out")
  step "Building the PostgreSQL $E2E_PG_NEXT image from Debian packages (about a minute, once)"
  out=$(bash "$REPO_ROOT/hack/images/postgres.sh" "$E2E_PG_NEXT")
  POSTGRES_NEXT_TAR=$(sed -n 1p <<<"$out")
  POSTGRES_NEXT_IMAGE=$(sed -n 2p <<<"$out")
  step "Building the PgBouncer image of the pooler from Debian packages (about a minute, once)"
  out=$(bash "$REPO_ROOT/hack/images/pgbouncer.sh")
  PGBOUNCER_TAR=$(sed -n 1p <<<"$out")
  PGBOUNCER_IMAGE=$(sed -n 2p <<<"$out")
}

# build_s3_image sets S3_TAR and S3_IMAGE: versitygw (hack/versitygw.sh builds it) as an
# image, an S3-compatible store the e2e tests run in a pod. Its data lives under /srv,
# owned by the user it runs as.
build_s3_image() {
  local bin version root
  step "Building the S3 server image (versitygw; seconds once it is built)"
  bin=$(bash "$REPO_ROOT/hack/versitygw.sh")
  version=$(basename "$(dirname "$bin")")
  S3_IMAGE=pgpilot-versitygw:${version#v}
  S3_TAR=$PGPILOT_CACHE/images/pgpilot-versitygw-${version#v}.tar
  [[ -s $S3_TAR ]] && return 0
  root=$(mktemp -d)
  mkdir -p "$root/srv/data" "$root/srv/meta" "$root/srv/iam" "$root/tmp"
  chmod 1777 "$root/tmp"
  install -m 0755 "$bin" "$root/versitygw"
  (cd "$REPO_ROOT" && go run ./hack/images/mkimage -rootfs "$root" -chown 0:0 -owner /srv=65532:65532 \
    -user 65532:65532 -entrypoint '["/versitygw"]' -expose 7070 -epoch 0 \
    -ref "$S3_IMAGE" -o "$S3_TAR.partial" >/dev/null)
  mv -f "$S3_TAR.partial" "$S3_TAR"
  rm -rf "$root"
}

cluster_up() {
  step "Building the local Kubernetes $K8S_VERSION cluster's parts (about 10 minutes the first time, then cached)"
  bash "$LC/build.sh"
  step "Starting the local cluster in its own network namespace"
  bash "$LC/up.sh"
}

# fresh_cluster_up is cluster_up for a test: a cluster left up (by make demo, or a kept
# test run) is torn down first, so that no object, volume or pod of it is in the test.
fresh_cluster_up() {
  if netns_exists; then
    step "A local cluster is already up (make demo's, or a kept run's): tearing it down for a fresh one"
    bash "$LC/down.sh"
  fi
  cluster_up
}

# The tests run in the background (run_tests), so that an interrupt reaches the teardown
# at once, which stops them first.
status=0
test_pid=

# run_tests ARGS...: runs `exec.sh ARGS` (a test binary inside the cluster's namespace)
# and waits for it; its failure becomes the script's exit status.
run_tests() {
  bash "$LC/exec.sh" "$@" &
  test_pid=$!
  wait "$test_pid" || status=$?
  test_pid=
}

stop_tests() {
  if [[ -n $test_pid ]] && kill -0 "$test_pid" 2>/dev/null; then
    kill -TERM "$test_pid" 2>/dev/null || true
    wait "$test_pid" 2>/dev/null || true
  fi
}

# teardown_on_exit KEEP_VAR tears the cluster down when the script exits, interrupted or
# not, unless $KEEP_VAR is 1; the exit status is the script's (in $status), or the
# teardown's when that was 0. Running tests are stopped first, then on_exit, when set,
# runs (before the teardown).
teardown_on_exit() {
  keep_var=$1 up=0
  trap _teardown EXIT
  trap 'status=130; exit 130' INT
  trap 'status=143; exit 143' TERM
}

_teardown() {
  local rc=$?
  trap - EXIT INT TERM
  ((${status:-0} == 0)) && status=$rc
  stop_tests
  if declare -F on_exit >/dev/null; then on_exit || true; fi
  if ((up)); then
    if [[ ${!keep_var:-} == 1 ]]; then
      step "$keep_var=1: leaving the cluster up (make demo-down removes it)"
    else
      step "Tearing the cluster down"
      # down.sh ends with check-clean.sh and fails when anything of the cluster is left.
      bash "$LC/down.sh" || status=$((status ? status : 1))
    fi
  fi
  if declare -F after_teardown >/dev/null; then after_teardown || true; fi
  exit "$status"
}

# push_images pushes the operator, PostgreSQL and PgBouncer images to the local cluster's
# registry, where the node pulls them from under their own names.
push_images() {
  step "Pushing the images to the cluster's registry"
  bash "$LC/push-image.sh" "$OPERATOR_TAR" "$OPERATOR_IMAGE"
  bash "$LC/push-image.sh" "$POSTGRES_TAR" "$POSTGRES_IMAGE"
  bash "$LC/push-image.sh" "$POSTGRES_NEXT_TAR" "$POSTGRES_NEXT_IMAGE"
  bash "$LC/push-image.sh" "$PGBOUNCER_TAR" "$PGBOUNCER_IMAGE"
}

# deploy_operator applies config/default with the local images, and waits until the
# operator's Deployment is available.
deploy_operator() {
  local overlay
  overlay=$(mktemp -d "$REPO_ROOT/.e2e-overlay.XXXXXX")
  # A kustomize overlay needs a relative path to config/default.
  cat >"$overlay/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../config/default
images:
- name: controller
  newName: ${OPERATOR_IMAGE%:*}
  newTag: ${OPERATOR_IMAGE##*:}
patches:
- target: {kind: Deployment, name: pgpilot-controller-manager}
  patch: |-
    apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: pgpilot-controller-manager
      namespace: pgpilot-system
    spec:
      template:
        spec:
          containers:
          - name: manager
            env:
            - name: RELATED_IMAGE_AGENT
              value: ${OPERATOR_IMAGE}
            - name: RELATED_IMAGE_POSTGRES_${E2E_PG_MAJOR}
              value: ${POSTGRES_IMAGE}
            - name: RELATED_IMAGE_POSTGRES_${E2E_PG_NEXT}
              value: ${POSTGRES_NEXT_IMAGE}
            - name: RELATED_IMAGE_PGBOUNCER
              value: ${PGBOUNCER_IMAGE}
YAML
  step "Deploying pgpilot (config/default) with the local images"
  bash "$LC/exec.sh" kubectl apply --server-side --force-conflicts -k "$overlay" >&2
  rm -rf "$overlay"
  bash "$LC/exec.sh" kubectl -n pgpilot-system rollout status deployment/pgpilot-controller-manager --timeout=5m >&2
}
