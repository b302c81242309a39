#!/usr/bin/env bash
# Builds OLM from source, once per version, into $PGPILOT_CACHE/olm, and its two images:
#
#   olm/<version>/bin/  olm, catalog, package-server, copy-content, cpb
#                       (operator-lifecycle-manager at $OLM_VERSION)
#   images/olm-<version>.tar  quay.io/operator-framework/olm:<version>: those commands and
#                       busybox's cp (bundle unpack jobs copy cpb with /bin/cp), user 1001
#   images/opm-<version>.tar  quay.io/operator-framework/opm:<version>: opm (the Makefile's,
#                       hack/olm-tool.sh), grpc_health_probe (the catalog pods' probe) and
#                       busybox's sh (operator-sdk run bundle's catalog pod runs opm
#                       through sh -c), as the released image has them
#   images/scorecard-test-<version>.tar  quay.io/operator-framework/scorecard-test:<version>:
#                       scorecard-test built from operator-sdk at $OPERATOR_SDK_VERSION
#                       (the scorecard basic and olm suites), user 1001
#
# The images use the local cluster's image tools (hack/localcluster/build.sh). A second
# run finds everything and returns at once.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# module_replaces MODULE@VERSION prints the replace directives of the module's own
# go.mod as old=new@version, which a module requiring it does not inherit.
module_replaces() {
  local gomod
  gomod=$(go mod download -json "$1" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  awk '/^replace \(/ { block = 1; next } block && /^\)/ { block = 0 }
    (block && $2 == "=>" && NF >= 4) { print $1 "=" $3 "@" $4 }
    ($1 == "replace" && $3 == "=>" && NF >= 5) { print $2 "=" $4 "@" $5 }' "$gomod"
}

build_olm() {
  local b missing=0
  for b in olm catalog package-server copy-content cpb; do [[ -x $OLM_BIN/$b ]] || missing=1; done
  ((missing)) || return 0
  log "building OLM $OLM_VERSION: olm, catalog, package-server, copy-content, cpb (about 5 minutes on 2 cores, once)"
  local m=$OLM_MODULE replaces
  replaces=$(module_replaces "$m@$OLM_VERSION")
  GO_REPLACES=$replaces build_go_commands "$WORK/olm" "$WORK/olm-bin" "$m@$OLM_VERSION" \
    "-X $m/pkg/version.OLMVersion=${OLM_VERSION#v} -X $m/pkg/version.GitCommit=$OLM_VERSION" \
    "$m/cmd/olm" "$m/cmd/catalog" "$m/cmd/package-server" "$m/cmd/copy-content" "$m/util/cpb"
  mkdir -p "$OLM_BIN"
  mv -f "$WORK/olm-bin"/* "$OLM_BIN/"
}

build_opm() {
  [[ -x $OPM ]] && return 0
  log "building opm $OPM_VERSION (once)"
  bash "$REPO_ROOT/hack/olm-tool.sh" opm "$OPM_VERSION" "$(dirname "$OPM")"
}

build_scorecard() {
  [[ -x $SCORECARD_TEST ]] && return 0
  log "building scorecard-test $OPERATOR_SDK_VERSION (once)"
  bash "$REPO_ROOT/hack/olm-tool.sh" scorecard-test "$OPERATOR_SDK_VERSION" "$(dirname "$SCORECARD_TEST")"
}

build_probe() {
  PROBE=$OLM_CACHE/grpc-health-probe-$GRPC_HEALTH_PROBE_VERSION/grpc_health_probe
  [[ -x $PROBE ]] && return 0
  log "building grpc_health_probe $GRPC_HEALTH_PROBE_VERSION (once)"
  local m=github.com/grpc-ecosystem/grpc-health-probe
  build_go_commands "$WORK/probe" "$WORK/probe-bin" "$m@$GRPC_HEALTH_PROBE_VERSION" "" "$m"
  mkdir -p "$(dirname "$PROBE")"
  mv -f "$WORK/probe-bin/grpc-health-probe" "$PROBE"
}

# pack ROOTFS TARBALL REF MKIMAGE_FLAGS...: a one-layer image of ROOTFS, files root's.
pack() {
  local rootfs=$1 tarball=$2 ref=$3
  shift 3
  mkdir -p "$(dirname "$tarball")"
  "$(lc_tools_dir)/mkimage" -rootfs "$rootfs" -chown 0:0 -epoch 0 -ref "$ref" -o "$tarball.partial" "$@" >/dev/null
  mv -f "$tarball.partial" "$tarball"
}

build_images() {
  local root b
  if [[ ! -s $OLM_IMAGE_TAR ]]; then
    log "packing $OLM_IMAGE"
    root=$WORK/olm-root
    mkdir -p "$root/bin" "$root/tmp"
    chmod 1777 "$root/tmp"
    for b in olm catalog package-server copy-content cpb; do install -m 0755 "$OLM_BIN/$b" "$root/bin/$b"; done
    install -m 0755 /bin/busybox "$root/bin/busybox"
    ln -s busybox "$root/bin/cp"
    pack "$root" "$OLM_IMAGE_TAR" "$OLM_IMAGE" -user 1001 -env PATH=/bin -cmd '["/bin/olm"]' -expose 8080 -expose 5443
  fi
  if [[ ! -s $OPM_IMAGE_TAR ]]; then
    log "packing $OPM_IMAGE"
    root=$WORK/opm-root
    mkdir -p "$root/bin" "$root/tmp"
    chmod 1777 "$root/tmp"
    install -m 0755 "$OPM" "$root/bin/opm"
    install -m 0755 "$PROBE" "$root/bin/grpc_health_probe"
    install -m 0755 /bin/busybox "$root/bin/busybox"
    ln -s busybox "$root/bin/sh"
    pack "$root" "$OPM_IMAGE_TAR" "$OPM_IMAGE" -user 1001 -env PATH=/bin -entrypoint '["/bin/opm"]'
  fi
  if [[ ! -s $SCORECARD_IMAGE_TAR ]]; then
    log "packing $SCORECARD_IMAGE"
    root=$WORK/scorecard-root
    mkdir -p "$root/usr/local/bin" "$root/opt/scorecard-test" "$root/tmp"
    chmod 1777 "$root/tmp"
    install -m 0755 "$SCORECARD_TEST" "$root/usr/local/bin/scorecard-test"
    pack "$root" "$SCORECARD_IMAGE_TAR" "$SCORECARD_IMAGE" -owner /opt/scorecard-test=1001:0 -user 1001 \
      -env PATH=/usr/local/bin -env HOME=/opt/scorecard-test -workdir /opt/scorecard-test \
      -entrypoint '["/usr/local/bin/scorecard-test"]'
  fi
}

main() {
  bash "$LC_DIR/build.sh"
  mkdir -p "$OLM_CACHE"
  WORK=$(mktemp -d "$OLM_CACHE/build.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  build_olm
  build_opm
  build_probe
  build_scorecard
  build_images
}

main "$@"
