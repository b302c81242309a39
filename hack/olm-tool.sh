#!/usr/bin/env bash
# Builds one of the Operator Framework's command-line tools at a pinned version, from the
# Go module proxy, into a directory (the Makefile caches it under $PGPILOT_CACHE/tools):
#
#   hack/olm-tool.sh operator-sdk v1.34.1 <dir>   # <dir>/operator-sdk
#   hack/olm-tool.sh scorecard-test v1.34.1 <dir> # <dir>/scorecard-test (the scorecard
#                                                 # basic and olm suites' test image's binary)
#   hack/olm-tool.sh opm v1.35.0 <dir>            # <dir>/opm
#
# `go install <module>@<version>` cannot build either here: it asks the module proxy for
# the module's version list (to report deprecations), which the proxy refuses for these
# modules, and operator-registry's go.mod has a replace directive, which go install
# refuses. So each tool is built in a scratch module that requires it at that version.
set -euo pipefail

usage="usage: olm-tool.sh operator-sdk|scorecard-test|opm <version> <dir>"
tool=${1:?$usage}
version=${2:?$usage}
out=${3:?$usage}

case "$tool" in
operator-sdk | scorecard-test)
  module=github.com/operator-framework/operator-sdk
  pkg=$module/cmd/operator-sdk
  [ "$tool" = scorecard-test ] && pkg=$module/images/scorecard-test
  # The version is recorded in every bundle it generates
  # (operators.operatorframework.io.metrics.builder); without it, "unknown".
  ldflags="-X $module/internal/version.Version=$version -X $module/internal/version.GitVersion=$version"
  ldflags+=" -X $module/internal/version.ImageVersion=$version -X $module/internal/version.KubernetesVersion=v1.28.0"
  # golang.org/x/tools before v0.2x does not compile with current Go (internal/tokeninternal).
  extra=(golang.org/x/tools@v0.29.0)
  # operator-sdk's module has no checksum-database entry; skip the lookup for it alone.
  export GONOSUMDB=$module
  ;;
opm)
  module=github.com/operator-framework/operator-registry
  pkg=$module/cmd/opm
  ldflags="-X $module/cmd/opm/version.opmVersion=$version"
  extra=()
  ;;
*)
  echo "olm-tool.sh: unknown tool $tool" >&2
  exit 2
  ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init pgpilot.tools/"$tool" >/dev/null 2>&1
go get "$pkg@$version" "${extra[@]}" 2>"$work/get.log" || { cat "$work/get.log" >&2; exit 1; }
if [ "$tool" = opm ]; then
  # Keep the replace directives of operator-registry's own go.mod, as its releases do.
  go mod download -json "$module@$version" >"$work/dl.json"
  gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' "$work/dl.json")
  if grep -q '^replace (' "$gomod"; then
    echo "olm-tool.sh: $module@$version has a replace block; extend this script" >&2
    exit 1
  fi
  sed -n 's/^replace \([^ ]*\) => \([^ ]*\) \([^ ]*\)$/\1=\2@\3/p' "$gomod" | while read -r r; do
    go mod edit -replace="$r"
  done
fi
mkdir -p "$out"
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$tool" "$pkg"
