#!/usr/bin/env bash
# make olm: installs OLM, built from source (build.sh), into the local cluster, starting
# the cluster first when it is not up. The manifests are rendered at install time from
# the operator-lifecycle-manager module's deploy/chart (render/), with the images built
# here, which are pushed to the node's registry under their released names. Returns
# when OLM's operators are available and the packageserver's CSV has Succeeded; a second
# run on a cluster with OLM applies the same manifests and returns as soon as it is so.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

packageserver_succeeded() {
  [[ $(kubectl_lc -n "$OLM_NAMESPACE" get csv packageserver -o 'jsonpath={.status.phase}' 2>/dev/null) == Succeeded ]]
}

require_root
begin=$SECONDS
bash "$LC_DIR/up.sh" >/dev/null
bash "$OLM_LIB_DIR/build.sh"

log "pushing OLM's images"
bash "$LC_DIR/push-image.sh" "$OLM_IMAGE_TAR" "$OLM_IMAGE" >/dev/null
bash "$LC_DIR/push-image.sh" "$OPM_IMAGE_TAR" "$OPM_IMAGE" >/dev/null

log "rendering OLM $OLM_VERSION's chart from the module"
dir=$(go mod download -json "$OLM_MODULE@$OLM_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d $dir/deploy/chart ]] || die "$OLM_MODULE@$OLM_VERSION has no deploy/chart"
mkdir -p "$OLM_MANIFESTS"
(cd "$REPO_ROOT" && go run ./hack/olm/render -module-dir "$dir" -olm-image "$OLM_IMAGE" -opm-image "$OPM_IMAGE" \
  -crds "$OLM_MANIFESTS/crds.yaml" -manifests "$OLM_MANIFESTS/olm.yaml")

log "installing OLM's CRDs and operators"
# Server-side: the CRDs are too large for the last-applied annotation.
kubectl_lc apply --server-side --force-conflicts -f "$OLM_MANIFESTS/crds.yaml" >/dev/null
kubectl_lc wait --for condition=Established -f "$OLM_MANIFESTS/crds.yaml" --timeout=60s >/dev/null
kubectl_lc apply --server-side --force-conflicts -f "$OLM_MANIFESTS/olm.yaml" >/dev/null
kubectl_lc -n "$OLM_NAMESPACE" rollout status deployment/olm-operator --timeout=5m >&2
kubectl_lc -n "$OLM_NAMESPACE" rollout status deployment/catalog-operator --timeout=5m >&2
log "waiting for the packageserver (OLM installs it from its CSV; an aggregated API)"
wait_for "the packageserver CSV" 300 packageserver_succeeded || die "OLM's packageserver did not succeed: kubectl -n $OLM_NAMESPACE describe csv packageserver"
kubectl_lc wait apiservice v1.packages.operators.coreos.com --for condition=Available --timeout=120s >/dev/null
log "OLM $OLM_VERSION is up in $((SECONDS - begin))s"
