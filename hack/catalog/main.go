// Command catalog writes the file-based catalog (FBC) that serves the OLM bundle in
// bundle/ from a bundle image, without pulling that image from a registry: the
// olm.package, an olm.channel for each of the bundle's channels and the olm.bundle, with
// the properties `opm render --migrate` gives a bundle image (olm.gvk, olm.package,
// olm.csv.metadata) and its related images.
//
// Bundles and channel entries of other versions already in the catalog are kept, and a
// new version's entry replaces the newest one of its channel, so the catalog grows an
// upgrade graph release by release. Writing the same bundle again changes nothing.
//
//	go run ./hack/catalog -bundle bundle -image <bundle image> -catalog catalog/pgpilot/catalog.yaml
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pgpilot/pgpilot/internal/tools/olm"
)

func main() {
	bundleDir := flag.String("bundle", "bundle", "Bundle directory (manifests/ and metadata/).")
	image := flag.String("image", "", "Image the bundle directory is built into (make bundle-build).")
	out := flag.String("catalog", filepath.Join("catalog", "pgpilot", "catalog.yaml"), "Catalog file to write; its other bundles are kept.")
	flag.Parse()
	if *image == "" {
		fmt.Fprintln(os.Stderr, "catalog: -image is required")
		os.Exit(2)
	}
	if err := run(*bundleDir, *image, *out); err != nil {
		fmt.Fprintln(os.Stderr, "catalog:", err)
		os.Exit(1)
	}
}

func run(bundleDir, image, out string) error {
	b, err := olm.LoadBundle(bundleDir)
	if err != nil {
		return err
	}
	var existing *olm.Catalog
	if data, err := os.ReadFile(out); err == nil {
		if existing, err = olm.Parse(data); err != nil {
			return fmt.Errorf("reading %s: %w", out, err)
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	c, err := olm.Add(existing, b, image)
	if err != nil {
		return err
	}
	data, err := c.Marshal()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, data, 0o644)
}
