#!/usr/bin/env bash
# Builds a real kube-apiserver, kubectl and etcd from the Go module proxy, once, into
# $PGPILOT_CACHE/control-plane/<versions>/, and prints that directory (the value for
# KUBEBUILDER_ASSETS). Later runs find the binaries and return at once.
#
# There is no download site for envtest's prebuilt binaries here, so they are built from
# source: a scratch module pins every staging module that k8s.io/kubernetes replaces with
# a local path to the matching published version.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.32.0}
ETCD_VERSION=${ETCD_VERSION:-3.5.17}
CACHE=${PGPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgpilot}
out="$CACHE/control-plane/k8s-v${K8S_VERSION}-etcd-v${ETCD_VERSION}"

if [[ -x $out/kube-apiserver && -x $out/etcd && -x $out/kubectl ]]; then
  echo "$out"
  exit 0
fi

log() { echo "control-plane: $*" >&2; }
work=$(mktemp -d "$CACHE/build.XXXXXX" 2>/dev/null || { mkdir -p "$CACHE" && mktemp -d "$CACHE/build.XXXXXX"; })
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
minor=${K8S_VERSION#*.}; minor=${minor%%.*}
staging_version="v0.${K8S_VERSION#*.}"

log "building kube-apiserver and kubectl v${K8S_VERSION} from source (about 4 minutes on 2 cores, once)"
mkdir -p "$work/k8s"
(
  cd "$work/k8s"
  go mod init pgpilot.local/control-plane >/dev/null 2>&1
  modfile=$(go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  # Every "k8s.io/x => ./staging/src/k8s.io/x" becomes "k8s.io/x => k8s.io/x v0.<minor>.<patch>".
  awk -v v="$staging_version" '$2 == "=>" && $3 ~ /^\.\/staging\// { print "replace " $1 " => " $1 " " v }' \
    "$modfile" >>go.mod
  cat >tools.go <<GO
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  go get "k8s.io/kubernetes@v${K8S_VERSION}" >/dev/null 2>&1 || go get "k8s.io/kubernetes@v${K8S_VERSION}"
  go mod tidy -e >/dev/null 2>&1 || true
  ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=v${K8S_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor}"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ldflags" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
)

log "building etcd v${ETCD_VERSION} from source (under a minute, once)"
mkdir -p "$work/etcd"
(
  cd "$work/etcd"
  go mod init pgpilot.local/etcd >/dev/null 2>&1
  cat >main.go <<GO
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >/dev/null 2>&1 || go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}"
  go mod tidy >/dev/null 2>&1
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/etcd" .
)

"$out/kube-apiserver" --version >&2
echo "$out"
