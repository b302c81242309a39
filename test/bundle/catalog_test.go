package bundle

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pgpilot/pgpilot/internal/tools/olm"
)

func loadCatalog(t *testing.T) (*olm.Catalog, []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "catalog", "pgpilot", "catalog.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := olm.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return c, data
}

// The file-based catalog serves the committed bundle: its package, in each of its
// channels, under its name, with its APIs and metadata, from BUNDLE_IMG.
func TestCatalogServesTheBundle(t *testing.T) {
	b := loadBundle(t)
	c, data := loadCatalog(t)
	csv := b.CSV

	if c.Package.Name != b.Package || c.Package.DefaultChannel != b.DefaultChannel {
		t.Errorf("package %s default channel %s, want %s and %s", c.Package.Name, c.Package.DefaultChannel, b.Package, b.DefaultChannel)
	}
	if c.Package.Icon == nil || c.Package.Icon.Data != csv.Spec.Icon[0].Data {
		t.Error("the package's icon is not the CSV's")
	}
	var channels []string
	for _, ch := range c.Channels {
		channels = append(channels, ch.Name)
		if ch.Package != b.Package {
			t.Errorf("channel %s is of package %s", ch.Name, ch.Package)
		}
		if !slices.ContainsFunc(ch.Entries, func(e olm.ChannelEntry) bool { return e.Name == csv.Name }) {
			t.Errorf("channel %s has no entry for %s: %+v", ch.Name, csv.Name, ch.Entries)
		}
	}
	if diff := cmp.Diff(b.Channels, channels); diff != "" {
		t.Errorf("channels (-bundle +catalog):\n%s", diff)
	}
	if !slices.Contains(channels, "stable") || !slices.Contains(channels, "candidate") || c.Package.DefaultChannel != "stable" {
		t.Errorf("channels %v default %s, want stable (default) and candidate", channels, c.Package.DefaultChannel)
	}

	i := slices.IndexFunc(c.Bundles, func(cb olm.CatalogBundle) bool { return cb.Name == csv.Name })
	if i < 0 {
		t.Fatalf("no olm.bundle %s in the catalog", csv.Name)
	}
	cb := c.Bundles[i]
	version := makefileVar(t, "VERSION")
	if cb.Package != b.Package || !strings.HasSuffix(cb.Image, "-bundle:v"+version) {
		t.Errorf("bundle %s: package %s image %s, want %s and BUNDLE_IMG (…-bundle:v%s)", cb.Name, cb.Package, cb.Image, b.Package, version)
	}

	props := map[string][]json.RawMessage{}
	for _, p := range cb.Properties {
		props[p.Type] = append(props[p.Type], p.Value)
	}
	var pkg olm.PackageProperty
	unmarshalOne(t, props[olm.PropertyPackage], &pkg)
	if pkg != (olm.PackageProperty{PackageName: b.Package, Version: csv.Spec.Version.String()}) {
		t.Errorf("olm.package %+v, want %s %s", pkg, b.Package, csv.Spec.Version)
	}
	// One olm.gvk per API: exactly pgpilot's kinds, as the bundle's CRDs serve them.
	var gvks []olm.GVKProperty
	for _, raw := range props[olm.PropertyGVK] {
		var gvk olm.GVKProperty
		if err := json.Unmarshal(raw, &gvk); err != nil {
			t.Fatal(err)
		}
		gvks = append(gvks, gvk)
	}
	var served []olm.GVKProperty
	for _, crd := range b.V1CRDs {
		for _, v := range crd.Spec.Versions {
			if v.Served {
				served = append(served, olm.GVKProperty{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind, Version: v.Name})
			}
		}
	}
	want := []olm.GVKProperty{
		{Group: "db.example.com", Kind: "PostgresBackup", Version: "v1"},
		{Group: "db.example.com", Kind: "PostgresCluster", Version: "v1"},
	}
	byName := func(a, b olm.GVKProperty) int {
		return strings.Compare(a.Group+"/"+a.Kind+"/"+a.Version, b.Group+"/"+b.Kind+"/"+b.Version)
	}
	slices.SortFunc(served, byName)
	if diff := cmp.Diff(want, served); diff != "" {
		t.Errorf("APIs the bundle's CRDs serve (-want +bundle):\n%s", diff)
	}
	if diff := cmp.Diff(want, gvks); diff != "" {
		t.Errorf("olm.gvk properties (-want +catalog):\n%s", diff)
	}
	var meta olm.CSVMetadata
	unmarshalOne(t, props[olm.PropertyCSVMetadata], &meta)
	if meta.DisplayName != csv.Spec.DisplayName || meta.Description != csv.Spec.Description ||
		meta.MinKubeVersion != csv.Spec.MinKubeVersion || !cmp.Equal(meta.Annotations, csv.Annotations) ||
		!cmp.Equal(meta.InstallModes, csv.Spec.InstallModes) {
		t.Error("olm.csv.metadata is not the CSV's metadata: run make catalog")
	}
	if diff := cmp.Diff(csv.Spec.CustomResourceDefinitions, meta.CustomResourceDefinitions); diff != "" {
		t.Errorf("olm.csv.metadata crdDescriptions (-CSV +catalog):\n%s", diff)
	}

	related := map[string]string{}
	for _, ri := range cb.RelatedImages {
		related[ri.Image] = ri.Name
	}
	for _, ri := range csv.Spec.RelatedImages {
		if name, ok := related[ri.Image]; !ok || name != ri.Name {
			t.Errorf("related image %s %s of the CSV is not in the catalog", ri.Name, ri.Image)
		}
	}
	if _, ok := related[cb.Image]; !ok {
		t.Errorf("the bundle image %s is not among the related images", cb.Image)
	}

	// make catalog would write exactly this file.
	again, err := olm.Add(c, b, cb.Image)
	if err != nil {
		t.Fatal(err)
	}
	out, err := again.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(data), string(out)); diff != "" {
		t.Errorf("catalog/pgpilot/catalog.yaml is stale: run make catalog (-committed +generated):\n%s", diff)
	}
}

// catalog.Dockerfile serves catalog/ from where its label says.
func TestCatalogDockerfile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "catalog.Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"COPY catalog /configs",
		"LABEL operators.operatorframework.io.index.configs.v1=/configs",
		`CMD ["serve", "/configs", "--cache-dir=/tmp/cache"]`,
	} {
		if !strings.Contains(string(data), "\n"+line+"\n") {
			t.Errorf("catalog.Dockerfile lacks %q", line)
		}
	}
}

func unmarshalOne(t *testing.T, values []json.RawMessage, into any) {
	t.Helper()
	if len(values) != 1 {
		t.Fatalf("%d properties of type %T, want 1", len(values), into)
	}
	if err := json.Unmarshal(values[0], into); err != nil {
		t.Fatal(err)
	}
}
