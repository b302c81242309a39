#!/usr/bin/env bash
# Builds the operator image without Docker or a registry: the three commands built as the
# Dockerfile's builder stage builds them, then the Dockerfile's last stage (its COPY
# lines, USER, WORKDIR, ENV, LABELs, ENTRYPOINT) read and packed by hack/images/mkimage,
# so that the Dockerfile stays the one description of the image.
#
# Writes $PGPILOT_CACHE/images/pgpilot-<id>.tar, where <id> is the first 12 hex digits of
# the image ID, and prints two lines: the tarball's path and the image reference
# pgpilot:<id>. The tarball also tags the image pgpilot:dev. Load it with
#   ctr -n k8s.io images import <tarball>      (or docker load -i <tarball>)
# The build is reproducible: the same sources give the same image ID (and layers), so an
# unchanged tree gives the same tag.
#
# Environment: VERSION and REVISION (the image's labels; default the Dockerfile's ARG
# default and `git rev-parse HEAD`), SOURCE_DATE_EPOCH (the files' and the image's time;
# default the HEAD commit's time), GOARCH (default the Go toolchain's).
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE=${PGPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgpilot}
out="$CACHE/images"
arch=${GOARCH:-$(go env GOARCH)}
revision=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
# How many operator tarballs to keep in the cache (the newest).
keep=${PGPILOT_IMAGES_KEEP:-5}

log() { echo "operator-image: $*" >&2; }
mkdir -p "$out"
work=$(mktemp -d "$out/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/out" "$work/tmp"
chmod 1777 "$work/tmp" # the builder's /rootfs/tmp

start=$SECONDS
log "building ./cmd/... for linux/$arch"
# The Dockerfile's builder stage's command (VERSION's default is its ARG's).
CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath \
  -ldflags "-s -w -X github.com/pgpilot/pgpilot/internal/version.Version=${VERSION:-dev}" -o "$work/out/" ./cmd/...
go build -o "$work/mkimage" ./hack/images/mkimage

args=(-dockerfile Dockerfile -context .
  -from "builder:/out/=$work/out" -from "builder:/rootfs/tmp=$work/tmp"
  -build-arg "REVISION=$revision" -platform "linux/$arch" -epoch "$epoch"
  -ref 'pgpilot:{id}' -ref pgpilot:dev -o "$out/pgpilot-{id}.tar")
if [[ -n ${VERSION:-} ]]; then
  args+=(-build-arg "VERSION=$VERSION")
fi
log "packing the Dockerfile's last stage"
id=$("$work/mkimage" "${args[@]}")
short=${id#sha256:}
short=${short:0:12}
tarball="$out/pgpilot-$short.tar"
touch "$tarball" # the newest, for the pruning below

# Older operator tarballs beyond the newest $keep.
# shellcheck disable=SC2012 # our own file names, no odd characters; ls -t sorts them by time
ls -1t "$out"/pgpilot-????????????.tar 2>/dev/null | tail -n +$((keep + 1)) | while read -r old; do
  rm -f "$old"
done

log "$(du -m "$tarball" | cut -f1) MB, image $id, in $((SECONDS - start))s"
echo "$tarball"
echo "pgpilot:$short"
