#!/usr/bin/env bash
# load-image.sh TARBALL...: imports image tarballs (docker-archive or OCI layout, as
# `docker save` or hack/images/mkimage writes them) into the local cluster's
# containerd, namespace k8s.io, where kubelet finds them. Pods use them with
# imagePullPolicy Never or IfNotPresent: there is no registry to pull from.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

(($# > 0)) || die "usage: load-image.sh TARBALL..."
require_root
[[ -S $LC_CONTAINERD_SOCK ]] || die "the local cluster's containerd is not running: run hack/localcluster/up.sh"
for tarball in "$@"; do
  [[ -s $tarball ]] || die "$tarball: no such image tarball"
  log "importing $tarball"
  # Unpacked into the overlayfs snapshotter at import, so the first pod starts at once.
  ctr_lc images import --snapshotter overlayfs "$tarball"
done
