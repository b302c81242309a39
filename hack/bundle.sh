#!/usr/bin/env bash
# Generates the OLM bundle from config/ with operator-sdk: bundle/ (manifests, metadata,
# tests/scorecard) and bundle.Dockerfile, written under the directory given (the
# repository root by default). make bundle runs it with its tools and settings:
#
#   KUSTOMIZE OPERATOR_SDK  the tools
#   VERSION                 the bundle's version (CSV pgpilot.v<VERSION>)
#   OPERATOR_IMG            the operator image the CSV runs (and RELATED_IMAGE_AGENT)
#   CHANNELS DEFAULT_CHANNEL
#
# config/ itself is not modified: the operator image is set in a copy of it.
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
