#!/usr/bin/env bash
# Builds, once, everything the local cluster runs, into $PGPILOT_CACHE/localcluster/
# (keyed by version), and installs the Debian packages it needs:
#
#   k8s-v1.32.0/     kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl
#   etcd-v3.5.17/    etcd
#   coredns-v1.11.4/ coredns
#   registry-v3.0.0/ registry (CNCF Distribution's registry server)
#   images/          pause and busybox image tarballs (built here; up.sh pushes them)
#   tools/           mkimage (hack/images/mkimage), crane (go-containerregistry's
#                    registry client) and the pause binary (./pause)
#
# There is no download site for Kubernetes binaries here: they are built from the Go
# module proxy like hack/control-plane.sh does, whose kube-apiserver, kubectl and etcd
# are reused. A second run finds everything and returns in well under a second.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Debian packages: the container runtime, CNI plugins, iptables for kubelet and
# kube-proxy, openssl for the certificates, and a static busybox for a test image.
PACKAGES=(containerd runc containernetworking-plugins iptables openssl busybox-static)

install_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  [[ $(id -u) == 0 ]] || die "missing packages ${missing[*]}: run as root, or apt-get install them"
  log "installing ${missing[*]} with apt-get (seconds, once)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 ||
    { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
}

# scratch_module DIR NAME: a throwaway module for building another project's commands.
scratch_module() {
  mkdir -p "$1"
  (cd "$1" && go mod init "$2" >/dev/null 2>&1)
}

k8s_ldflags() {
  local minor=${K8S_VERSION#*.} pkg flags="-s -w"
  minor=${minor%%.*}
  # Without these the binaries report v0.0.0 and version checks (Helm's kubeVersion,
  # kubelet/apiserver skew) fail.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

build_kubernetes() {
  local bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
  local b absent=0
  for b in "${bins[@]}"; do [[ -x $LC_K8S_BIN/$b ]] || absent=1; done
  ((absent)) || return 0
  mkdir -p "$LC_K8S_BIN"

  # kube-apiserver and kubectl: the ones hack/control-plane.sh builds for envtest.
  local cp
  cp=$(K8S_VERSION=$K8S_VERSION ETCD_VERSION=$ETCD_VERSION bash "$REPO_ROOT/hack/control-plane.sh")
  for b in kube-apiserver kubectl; do
    ln -f "$cp/$b" "$LC_K8S_BIN/$b" 2>/dev/null || cp -f "$cp/$b" "$LC_K8S_BIN/$b"
  done

  local rest=() cmds=()
  for b in kube-controller-manager kube-scheduler kubelet kube-proxy; do
    [[ -x $LC_K8S_BIN/$b ]] || { rest+=("$b"); cmds+=("k8s.io/kubernetes/cmd/$b"); }
  done
  ((${#rest[@]})) || return 0
  log "building ${rest[*]} v$K8S_VERSION (about 3 minutes on 2 cores, once)"
  local work=$WORK/k8s
  scratch_module "$work" pgpilot.local/localcluster-k8s
  (
    cd "$work"
    local modfile
    modfile=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
    # k8s.io/kubernetes replaces its staging modules with local paths; pin each one to the
    # published v0.<minor>.<patch> instead.
    awk -v v="v0.${K8S_VERSION#*.}" '$2 == "=>" && $3 ~ /^\.\/staging\// { print "replace " $1 " => " $1 " " v }' \
      "$modfile" >>go.mod
    {
      printf '//go:build tools\n\npackage tools\n\nimport (\n'
      printf '\t_ "%s"\n' "${cmds[@]}"
      printf ')\n'
    } >tools.go
    go get "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null 2>&1 || go get "k8s.io/kubernetes@v$K8S_VERSION"
    go mod tidy -e >/dev/null 2>&1 || true
    # One go build for all of them: the shared packages compile once.
    CGO_ENABLED=0 go build -trimpath -ldflags "$(k8s_ldflags)" -o "$work/bin/" "${cmds[@]}"
  )
  for b in "${rest[@]}"; do mv -f "$work/bin/$b" "$LC_K8S_BIN/$b"; done
  "$LC_K8S_BIN/kubelet" --version >&2
}

build_etcd() {
  [[ -x $LC_ETCD_BIN/etcd ]] && return 0
  local cp
  cp=$(K8S_VERSION=$K8S_VERSION ETCD_VERSION=$ETCD_VERSION bash "$REPO_ROOT/hack/control-plane.sh")
  mkdir -p "$LC_ETCD_BIN"
  ln -f "$cp/etcd" "$LC_ETCD_BIN/etcd" 2>/dev/null || cp -f "$cp/etcd" "$LC_ETCD_BIN/etcd"
}

build_coredns() {
  [[ -x $LC_COREDNS_BIN/coredns ]] && return 0
  log "building CoreDNS v$COREDNS_VERSION (about 90 seconds, once)"
  build_go_commands "$WORK/coredns" "$LC_COREDNS_BIN" "github.com/coredns/coredns@v$COREDNS_VERSION" "" \
    github.com/coredns/coredns
}

# The registry server: distribution's `registry serve`, with the filesystem storage
# driver alone. Its cmd/registry also links the Azure, GCS and S3 drivers and their SDKs,
# most of its build time on a cold machine; this command is that one less them.
build_registry() {
  [[ -x $LC_REGISTRY_BIN/registry ]] && return 0
  log "building the registry server v$REGISTRY_VERSION (about a minute, once)"
  local m=github.com/distribution/distribution/v3 work=$WORK/registry
  mkdir -p "$work" "$LC_REGISTRY_BIN"
  cat >"$work/main.go" <<EOF
// Command registry is CNCF Distribution's registry server with the filesystem driver.
package main

import (
	"os"

	"$m/registry"
	_ "$m/registry/storage/driver/filesystem"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
EOF
  (
    cd "$work"
    go mod init pgpilot.local/localcluster-registry >/dev/null 2>&1
    go get "$m@v$REGISTRY_VERSION" >/dev/null 2>&1 || go get "$m@v$REGISTRY_VERSION"
    go mod tidy >/dev/null 2>&1 || go mod tidy
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X $m/version.version=v$REGISTRY_VERSION" -o "$work/registry" .
  )
  mv -f "$work/registry" "$LC_REGISTRY_BIN/registry"
}

# The registry's storage is a cache: every image in it can be pushed again from its
# tarball or rebuilt. When it outgrows its bound it starts empty.
bound_registry_data() {
  local max=${PGPILOT_REGISTRY_MAX_MB:-8192} mb
  [[ -d $LC_REGISTRY_DATA ]] || return 0
  mb=$(du -sm "$LC_REGISTRY_DATA" | cut -f1)
  if ((mb > max)); then
    log "the registry's storage holds ${mb} MB (more than $max): emptying it"
    rm -rf --one-file-system "$LC_REGISTRY_DATA"
  fi
}

# The image tools: hack/images/mkimage (which also packs the operator and PostgreSQL
# images), crane (go-containerregistry's command, which pushes image tarballs to the
# registry) and the pause binary, rebuilt when their sources change.
build_tools() {
  local sum
  sum=$(cat "$REPO_ROOT"/go.sum "$REPO_ROOT"/hack/images/mkimage/*.go "$LC_DIR"/pause/*.go | sha256sum | cut -c1-16)
  TOOLS_DIR=$LC_TOOLS/$sum
  [[ -x $TOOLS_DIR/mkimage && -x $TOOLS_DIR/crane && -x $TOOLS_DIR/pause ]] && return 0
  log "building the image tools (seconds)"
  mkdir -p "$TOOLS_DIR"
  (cd "$REPO_ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$TOOLS_DIR/" ./hack/images/mkimage \
    github.com/google/go-containerregistry/cmd/crane ./hack/localcluster/pause)
}

# pack ROOTFS TARBALL REF MKIMAGE_FLAGS...: a one-layer image of ROOTFS, files owned by root.
pack() {
  local rootfs=$1 tarball=$2 ref=$3
  shift 3
  "$TOOLS_DIR/mkimage" -rootfs "$rootfs" -chown 0:0 -epoch 0 -ref "$ref" -o "$tarball.partial" "$@" >/dev/null
  mv -f "$tarball.partial" "$tarball"
}

build_images() {
  mkdir -p "$LC_IMAGES"
  local stamp=$LC_IMAGES/.tools root
  # Rebuild the images when the tools changed (a new pause binary, say).
  if [[ $(cat "$stamp" 2>/dev/null) != "$TOOLS_DIR" ]]; then
    rm -f "$LC_IMAGES/pause-3.10.tar" "$BUSYBOX_IMAGE_TAR"
  fi
  if [[ $PAUSE_IMAGE_TAR == "$LC_IMAGES/pause-3.10.tar" && ! -s $PAUSE_IMAGE_TAR ]]; then
    log "writing the pause image $PAUSE_IMAGE"
    root=$WORK/pause-root
    mkdir -p "$root"
    install -m 0755 "$TOOLS_DIR/pause" "$root/pause"
    pack "$root" "$PAUSE_IMAGE_TAR" "$PAUSE_IMAGE" -entrypoint '["/pause"]' -user 65535:65535
  fi
  if [[ ! -s $BUSYBOX_IMAGE_TAR ]]; then
    log "writing the busybox image $BUSYBOX_IMAGE (Debian's static busybox)"
    root=$WORK/busybox-root
    mkdir -p "$root/bin" "$root/etc" "$root/tmp"
    chmod 1777 "$root/tmp"
    install -m 0755 /bin/busybox "$root/bin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do
      [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet"
    done
    pack "$root" "$BUSYBOX_IMAGE_TAR" "$BUSYBOX_IMAGE" -cmd '["sh"]' -env PATH=/bin
  fi
  echo "$TOOLS_DIR" >"$stamp"
}

main() {
  install_packages
  mkdir -p "$LC_CACHE"
  WORK=$(mktemp -d "$LC_CACHE/build.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  build_kubernetes
  build_etcd
  build_coredns
  build_registry
  bound_registry_data
  build_tools
  build_images
}

main "$@"
