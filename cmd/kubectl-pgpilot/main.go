// Command kubectl-pgpilot is the kubectl plugin for pgpilot's PostgresClusters: put it
// on PATH and run kubectl pgpilot (make plugin builds it; internal/cli is the code).
package main

import (
	"os"

	"github.com/pgpilot/pgpilot/internal/cli"
)

func main() { os.Exit(cli.Main()) }
