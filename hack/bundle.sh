#!/usr/bin/env bash
# Generates the OLM bundle from config/ with operator-sdk: bundle/ (manifests, metadata,
# tests/scorecard) and bundle.Dockerfile, written under the directory given (the
# repository root by default). make bundle runs it with its tools and settings:
#
#   KUSTOMIZE OPERATOR_SDK  the tools
#   VERSION                 the bundle's version (CSV pgpilot.v<VERSION>)
#   OPERATOR_IMG            the operator image the CSV runs (and RELATED_IMAGE_AGENT)
#   IMAGE_TAG_BASE          RELATED_IMAGE_PGBOUNCER is $IMAGE_TAG_BASE-pgbouncer, with
#                           config/manager's tag (PgBouncer's version); unset, config's
#   CHANNELS DEFAULT_CHANNEL
#
# config/ itself is not modified: the images are set in a copy of it.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
for v in KUSTOMIZE OPERATOR_SDK VERSION OPERATOR_IMG CHANNELS DEFAULT_CHANNEL; do
  [ -n "${!v:-}" ] || { echo "bundle.sh: $v is not set (run make bundle)" >&2; exit 2; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -R "$root/config" "$root/PROJECT" "$work/"
(cd "$work/config/manager" && "$KUSTOMIZE" edit set image "controller=$OPERATOR_IMG")
# PgBouncer's image is published beside the operator's (hack/images/pgbouncer.sh).
if [ -n "${IMAGE_TAG_BASE:-}" ]; then
  manager=$work/config/manager/manager.yaml
  awk -v repo="$IMAGE_TAG_BASE-pgbouncer" '
    prev ~ /- name: RELATED_IMAGE_PGBOUNCER$/ && match($0, /value: .*:/) {
      print substr($0, 1, RSTART - 1) "value: " repo ":" substr($0, RSTART + RLENGTH); done = 1; prev = ""; next
    }
    { print; prev = $0 }
    END { exit !done }' "$manager" >"$work/manager.yaml" ||
    { echo "bundle.sh: config/manager/manager.yaml sets no RELATED_IMAGE_PGBOUNCER" >&2; exit 1; }
  mv "$work/manager.yaml" "$manager"
fi

# operator-sdk reads PROJECT (package name and layout) from its working directory and the
# manifests, the CSV base included, from a pipe.
cd "$work"
"$KUSTOMIZE" build config/manifests |
  "$OPERATOR_SDK" generate bundle --quiet --overwrite --package pgpilot --version "$VERSION" \
    --channels "$CHANNELS" --default-channel "$DEFAULT_CHANNEL" --output-dir bundle

# operator-sdk stamps the CSV's createdAt annotation with the current time. Keep the
# previous stamp when nothing else changed, so that regenerating is idempotent.
csv=bundle/manifests/pgpilot.clusterserviceversion.yaml
if [ -f "$out/$csv" ]; then
  prev=$(grep -m1 '^    createdAt: ' "$out/$csv" || true)
  if [ -n "$prev" ]; then
    awk -v prev="$prev" '/^    createdAt: / && !done { print prev; done = 1; next } { print }' "$csv" >csv.yaml
    if cmp -s csv.yaml "$out/$csv"; then
      cp csv.yaml "$csv"
    fi
  fi
fi

mkdir -p "$out"
rm -rf "$out/bundle" "$out/bundle.Dockerfile"
cp -R bundle bundle.Dockerfile "$out/"
