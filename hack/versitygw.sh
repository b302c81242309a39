#!/usr/bin/env bash
# Builds the versitygw S3 server from the Go module proxy, once, into
# $PGPILOT_CACHE/versitygw/<version>/versitygw, and prints the binary's path. Later runs
# find the binary and return at once. The backup store's tests run it as a real
# S3-compatible endpoint (internal/tools/testing/s3server).
#
# versitygw's go.mod has no replace directives, so `go install module/cmd@version` builds
# it directly; it needs a Go toolchain of at least the version its go.mod names.
set -euo pipefail

VERSITYGW_VERSION=${VERSITYGW_VERSION:-v1.8.0}
CACHE=${PGPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgpilot}
out="$CACHE/versitygw/${VERSITYGW_VERSION}"
bin="$out/versitygw"

if [[ -x $bin ]]; then
  echo "$bin"
  exit 0
fi

log() { echo "versitygw: $*" >&2; }
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

log "building versitygw ${VERSITYGW_VERSION} from source (about a minute, once)"
# Built into a scratch directory and renamed into place, so a concurrent run (go test runs
# packages in parallel) never finds a half-written binary.
(
  cd "$work"
  GOBIN="$work/bin" CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X main.Version=${VERSITYGW_VERSION} -X main.Build=module-proxy -X main.BuildTime=none" \
    "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}"
)
mv -f "$work/bin/versitygw" "$bin"

"$bin" --version >&2
echo "$bin"
