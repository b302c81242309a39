# shellcheck shell=bash
# What `make demo` and `make e2e` share: build the images, bring up the local cluster,
# load the images into it, and deploy pgpilot with config/default (sourced, not run).

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PGPILOT_CACHE=${PGPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgpilot}
REPO_ROOT=$(cd "$E2E_DIR/../.." && pwd)
LC=$REPO_ROOT/hack/localcluster
# The local PostgreSQL image is Debian's PostgreSQL 15 (the only major that can be had
# offline here besides 17 and 18): the demo and the tests ask for version 15, never
# tag 15's binaries as another major.
E2E_PG_MAJOR=15

step() { printf '\n==> %s\n' "$*" >&2; }

# build_images sets OPERATOR_TAR, OPERATOR_IMAGE, POSTGRES_TAR and POSTGRES_IMAGE.
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
  step "Building the local Kubernetes $(sed -n 's/^K8S_VERSION=//p' "$LC/lib.sh") cluster's parts (about 10 minutes the first time, then cached)"
  bash "$LC/build.sh"
  step "Starting the local cluster in its own network namespace"
  bash "$LC/up.sh"
}

load_images() {
  step "Loading the images into the cluster's containerd"
  bash "$LC/load-image.sh" "$OPERATOR_TAR" "$POSTGRES_TAR"
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
YAML
  step "Deploying pgpilot (config/default) with the local images"
  bash "$LC/exec.sh" kubectl apply --server-side --force-conflicts -k "$overlay" >&2
  rm -rf "$overlay"
  bash "$LC/exec.sh" kubectl -n pgpilot-system rollout status deployment/pgpilot-controller-manager --timeout=5m >&2
}
