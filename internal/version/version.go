// Package version is the version of the pgpilot operator these binaries belong to.
package version

// Version is set when the operator image is built (the Dockerfile's and
// hack/images/operator.sh's -ldflags "-X github.com/pgpilot/pgpilot/internal/version.Version=<VERSION>");
// "dev" in a build that did not set it (go run, tests).
var Version = "dev"
