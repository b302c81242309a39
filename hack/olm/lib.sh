# shellcheck shell=bash
# shellcheck disable=SC2034 # the names are for the scripts that source this file
# OLM on the local cluster: versions, images and paths (sourced, not run). OLM is built
# from the Go module proxy (operator-lifecycle-manager for olm, catalog, package-server
# and the bundle-unpack utilities; operator-registry for opm), packed as images with
# hack/images/mkimage, pushed to the node's registry under their released names.

OLM_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../localcluster/lib.sh
source "$OLM_LIB_DIR/../localcluster/lib.sh"

# v0.28.0: the newest release whose go.mod the checksum database knows (v0.30 and v0.31
# are served without an entry); it builds with this machine's Go.
OLM_VERSION=${OLM_VERSION:-v0.28.0}
OLM_MODULE=github.com/operator-framework/operator-lifecycle-manager
# opm and operator-sdk: the Makefile's versions.
OPM_VERSION=${OPM_VERSION:-v1.35.0}
OPERATOR_SDK_VERSION=${OPERATOR_SDK_VERSION:-v1.34.1}
# OLM's catalog pods probe their gRPC server with grpc_health_probe, which opm images carry.
GRPC_HEALTH_PROBE_VERSION=v0.4.25

OLM_CACHE=$PGPILOT_CACHE/olm
OLM_BIN=$OLM_CACHE/$OLM_VERSION/bin
OLM_IMAGES=$OLM_CACHE/images
OLM_MANIFESTS=$OLM_CACHE/$OLM_VERSION/manifests
OPM=${OPM:-$PGPILOT_CACHE/tools/opm-$OPM_VERSION/opm}
OPERATOR_SDK=${OPERATOR_SDK:-$PGPILOT_CACHE/tools/operator-sdk-$OPERATOR_SDK_VERSION/operator-sdk}
SCORECARD_TEST=$PGPILOT_CACHE/tools/scorecard-test-$OPERATOR_SDK_VERSION/scorecard-test

# The released names: the chart's images and the bundle's scorecard config need no
# rewriting, containerd's mirror of quay.io serves them from the local registry.
OLM_IMAGE=quay.io/operator-framework/olm:$OLM_VERSION
OPM_IMAGE=quay.io/operator-framework/opm:$OPM_VERSION
OLM_IMAGE_TAR=$OLM_IMAGES/olm-$OLM_VERSION.tar
OPM_IMAGE_TAR=$OLM_IMAGES/opm-$OPM_VERSION.tar
# The image bundle/tests/scorecard/config.yaml names for the basic and olm suites.
SCORECARD_IMAGE=quay.io/operator-framework/scorecard-test:$OPERATOR_SDK_VERSION
SCORECARD_IMAGE_TAR=$OLM_IMAGES/scorecard-test-$OPERATOR_SDK_VERSION.tar

# OLM's namespace (the upstream chart values') and the CRDs' group.
OLM_NAMESPACE=olm

log() { echo "olm: $*" >&2; }
