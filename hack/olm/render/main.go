// Command render writes the manifests that install OLM, rendered from the Helm chart
// in the operator-lifecycle-manager module's deploy/chart with the module's own
// deploy/upstream/values.yaml (OLM's releases render their quickstart manifests the
// same way), and the images this machine built instead of the released ones:
//
//	render -module-dir $(go env GOMODCACHE)/github.com/operator-framework/operator-lifecycle-manager@v0.28.0 \
//	    -olm-image quay.io/operator-framework/olm:v0.28.0 -opm-image quay.io/operator-framework/opm:v1.35.0 \
//	    -crds crds.yaml -manifests olm.yaml
//
// Nothing of OLM is copied into this repository: the chart is read from the module cache
// at build time.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

// skipped are the chart's templates left out, and why.
var skipped = map[string]string{
	// The OperatorHub.io catalog's image is on the internet; nothing here can pull it.
	"0000_50_olm_17-upstream-operators.catalogsource.yaml": "operatorhubio-catalog",
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	moduleDir := fs.String("module-dir", "", "The operator-lifecycle-manager module's directory (required).")
	olmImage := fs.String("olm-image", "", "The image of OLM's olm, catalog and package-server commands (required).")
	opmImage := fs.String("opm-image", "", "The opm image bundle unpack jobs run (required).")
	crdsOut := fs.String("crds", "", "Where to write OLM's CustomResourceDefinitions (required).")
	manifestsOut := fs.String("manifests", "", "Where to write the rest, in the chart's order (required).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *moduleDir == "" || *olmImage == "" || *opmImage == "" || *crdsOut == "" || *manifestsOut == "" {
		return errors.New("-module-dir, -olm-image, -opm-image, -crds and -manifests are required")
	}
	crds, manifests, err := render(*moduleDir, *olmImage, *opmImage)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*crdsOut, crds, 0o644); err != nil {
		return err
	}
	return os.WriteFile(*manifestsOut, manifests, 0o644)
}

// render returns the chart's CRDs and its rendered templates, each as one multi-document
// YAML stream.
func render(moduleDir, olmImage, opmImage string) (crds, manifests []byte, err error) {
	chart, err := loader.Load(filepath.Join(moduleDir, "deploy", "chart"))
	if err != nil {
		return nil, nil, err
	}
	vals, err := chartutil.ReadValuesFile(filepath.Join(moduleDir, "deploy", "upstream", "values.yaml"))
	if err != nil {
		return nil, nil, err
	}
	// The images built here, pulled once (IfNotPresent: their tags are versions), and
	// one packageserver instead of two on a single node.
	for _, c := range []string{"olm", "catalog", "package"} {
		if err := set(vals, c+".image.ref", olmImage); err != nil {
			return nil, nil, err
		}
		if err := set(vals, c+".image.pullPolicy", "IfNotPresent"); err != nil {
			return nil, nil, err
		}
	}
	if err := set(vals, "catalog.opmImageArgs", "--opmImage="+opmImage); err != nil {
		return nil, nil, err
	}
	if err := set(vals, "package.replicaCount", 1); err != nil {
		return nil, nil, err
	}
	top, err := chartutil.ToRenderValues(chart, vals, chartutil.ReleaseOptions{Name: "olm", Namespace: "olm"}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, nil, err
	}
	out, err := engine.Render(chart, top)
	if err != nil {
		return nil, nil, err
	}

	var names []string
	for name := range out {
		names = append(names, name)
	}
	sort.Strings(names) // the chart's file names carry its order: 0000_50_olm_00-..., 0000_50_olm_07-...
	var m bytes.Buffer
	for _, name := range names {
		base := path.Base(name)
		if strings.HasPrefix(base, "_") || skipped[base] != "" {
			continue
		}
		doc := strings.TrimSpace(out[name])
		if doc == "" {
			continue
		}
		fmt.Fprintf(&m, "---\n# %s\n%s\n", base, doc)
	}
	var c bytes.Buffer
	for _, f := range chart.CRDObjects() {
		fmt.Fprintf(&c, "---\n# %s\n%s\n", path.Base(f.Filename), strings.TrimSpace(string(f.File.Data)))
	}
	if c.Len() == 0 || m.Len() == 0 {
		return nil, nil, fmt.Errorf("%s: the chart rendered no CRDs or no manifests", moduleDir)
	}
	return c.Bytes(), m.Bytes(), nil
}

// set sets a dotted key in nested values, making the maps on the way.
func set(vals map[string]any, key string, value any) error {
	parts := strings.Split(key, ".")
	cur := vals
	for _, p := range parts[:len(parts)-1] {
		next, ok := cur[p].(map[string]any)
		if !ok {
			if cur[p] != nil {
				return fmt.Errorf("values: %s is not a map", p)
			}
			next = map[string]any{}
			cur[p] = next
		}
		cur = next
	}
	cur[parts[len(parts)-1]] = value
	return nil
}
