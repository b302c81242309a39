#!/usr/bin/env bash
# push-image.sh TARBALL REF...: pushes an image tarball (as `docker save` or
# hack/images/mkimage -o writes it) to the local cluster's registry, once for each image
# reference REF, with crane (go-containerregistry's registry client). The node pulls it
# from there under its own name REF: containerd's mirrors send docker.io, quay.io,
# example.com and pgpilot.local to the local registry (LC_MIRRORED in lib.sh). Prints
# where each went, with its digest.
#
#   push-image.sh "$PGPILOT_CACHE/images/pgpilot-0123456789ab.tar" pgpilot:0123456789ab
#
# Blobs the registry already holds are not sent again.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

(($# >= 2)) || die "usage: push-image.sh TARBALL REF..."
tarball=$1
shift
require_root
[[ -s $tarball ]] || die "$tarball: no such image tarball"
{ netns_exists && daemon_pid registry >/dev/null; } || die "the local cluster's registry is not running: run hack/localcluster/up.sh"
crane=$(lc_tools_dir)/crane
registry_trust
for ref in "$@"; do
  dest=$(registry_ref "$ref")
  log "pushing $ref ($dest)"
  in_netns "$crane" push "$tarball" "$dest" 2>>"$LC_LOGS/push-image.log"
done
