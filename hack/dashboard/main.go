// Command dashboard writes the chart's Grafana dashboard from internal/tools/dashboard.
//
//	go run ./hack/dashboard helm-charts/postgrescluster/dashboards/pgpilot.json
package main

import (
	"fmt"
	"os"

	"github.com/pgpilot/pgpilot/internal/tools/dashboard"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard OUT.json")
		os.Exit(2)
	}
	out, err := dashboard.Build()
	if err == nil {
		err = os.WriteFile(os.Args[1], out, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}
