// Command values-schema writes the chart's values.schema.json from the CRD.
//
//	go run ./hack/values-schema config/crd/bases/db.example.com_postgresclusters.yaml helm-charts/postgrescluster/values.schema.json
package main

import (
	"fmt"
	"os"

	"github.com/pgpilot/pgpilot/internal/tools/chartschema"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: values-schema CRD.yaml values.schema.json")
		os.Exit(2)
	}
	crd, err := os.ReadFile(os.Args[1])
	if err == nil {
		var out []byte
		if out, err = chartschema.FromCRD(crd, "v1"); err == nil {
			err = os.WriteFile(os.Args[2], out, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "values-schema:", err)
		os.Exit(1)
	}
}
