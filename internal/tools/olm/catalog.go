package olm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/blang/semver/v4"
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Schemas of the file-based catalog's objects.
const (
	SchemaPackage = "olm.package"
	SchemaChannel = "olm.channel"
	SchemaBundle  = "olm.bundle"
)

// Property types of an olm.bundle.
const (
	PropertyPackage     = "olm.package"
	PropertyGVK         = "olm.gvk"
	PropertyCSVMetadata = "olm.csv.metadata"
)

// Catalog is the file-based catalog of one package.
type Catalog struct {
	Package  Package
	Channels []Channel
	Bundles  []CatalogBundle
}

// Package is the catalog's olm.package.
type Package struct {
	Schema         string `json:"schema"`
	Name           string `json:"name"`
	DefaultChannel string `json:"defaultChannel"`
	Icon           *Icon  `json:"icon,omitempty"`
	Description    string `json:"description,omitempty"`
}

// Icon is a package's icon.
type Icon struct {
	Data      string `json:"base64data"`
	MediaType string `json:"mediatype"`
}

// Channel is an olm.channel: the bundles a subscription to it can install, and which
// bundle each one upgrades from.
type Channel struct {
	Schema  string         `json:"schema"`
	Package string         `json:"package"`
	Name    string         `json:"name"`
	Entries []ChannelEntry `json:"entries"`
}

// ChannelEntry is one bundle of a channel.
type ChannelEntry struct {
	Name      string   `json:"name"`
	Replaces  string   `json:"replaces,omitempty"`
	Skips     []string `json:"skips,omitempty"`
	SkipRange string   `json:"skipRange,omitempty"`
}

// CatalogBundle is an olm.bundle: one version of the operator and the image it is in.
type CatalogBundle struct {
	Schema        string         `json:"schema"`
	Name          string         `json:"name"`
	Package       string         `json:"package"`
	Image         string         `json:"image"`
	Properties    []Property     `json:"properties"`
	RelatedImages []RelatedImage `json:"relatedImages,omitempty"`
}

// Property is a typed fact about a bundle.
type Property struct {
	Type  string          `json:"type"`
	Value json.RawMessage `json:"value"`
}

// RelatedImage is an image a bundle's operator runs or deploys; the bundle image itself
// has an empty name.
type RelatedImage struct {
	Name  string `json:"name"`
	Image string `json:"image"`
}

// PackageProperty is the value of an olm.package property.
type PackageProperty struct {
	PackageName string `json:"packageName"`
	Version     string `json:"version"`
}

// GVKProperty is the value of an olm.gvk property: an API the bundle provides.
type GVKProperty struct {
	Group   string `json:"group"`
	Kind    string `json:"kind"`
	Version string `json:"version"`
}

// CSVMetadata is the value of an olm.csv.metadata property: what a catalog shows of a
// bundle's ClusterServiceVersion.
type CSVMetadata struct {
	Annotations               map[string]string                  `json:"annotations,omitempty"`
	APIServiceDefinitions     v1alpha1.APIServiceDefinitions     `json:"apiServiceDefinitions,omitempty"`
	CustomResourceDefinitions v1alpha1.CustomResourceDefinitions `json:"crdDescriptions,omitempty"`
	Description               string                             `json:"description,omitempty"`
	DisplayName               string                             `json:"displayName,omitempty"`
	InstallModes              []v1alpha1.InstallMode             `json:"installModes,omitempty"`
	Keywords                  []string                           `json:"keywords,omitempty"`
	Labels                    map[string]string                  `json:"labels,omitempty"`
	Links                     []v1alpha1.AppLink                 `json:"links,omitempty"`
	Maintainers               []v1alpha1.Maintainer              `json:"maintainers,omitempty"`
	Maturity                  string                             `json:"maturity,omitempty"`
	MinKubeVersion            string                             `json:"minKubeVersion,omitempty"`
	NativeAPIs                []metav1.GroupVersionKind          `json:"nativeAPIs,omitempty"`
	Provider                  v1alpha1.AppLink                   `json:"provider,omitempty"`
}

// CatalogEntry returns the olm.bundle that serves b from image.
func CatalogEntry(b *Bundle, image string) CatalogBundle {
	csv := b.CSV
	var props []Property
	var gvks []GVKProperty
	for _, crd := range b.V1CRDs {
		for _, v := range crd.Spec.Versions {
			if v.Served {
				gvks = append(gvks, GVKProperty{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind, Version: v.Name})
			}
		}
	}
	sort.Slice(gvks, func(i, j int) bool {
		return gvks[i].Group+"/"+gvks[i].Kind+"/"+gvks[i].Version < gvks[j].Group+"/"+gvks[j].Kind+"/"+gvks[j].Version
	})
	for _, g := range gvks {
		props = append(props, mustProperty(PropertyGVK, g))
	}
	props = append(props, mustProperty(PropertyPackage, PackageProperty{PackageName: b.Package, Version: csv.Spec.Version.String()}))
	props = append(props, mustProperty(PropertyCSVMetadata, CSVMetadata{
		Annotations:               csv.Annotations,
		APIServiceDefinitions:     csv.Spec.APIServiceDefinitions,
		CustomResourceDefinitions: csv.Spec.CustomResourceDefinitions,
		Description:               csv.Spec.Description,
		DisplayName:               csv.Spec.DisplayName,
		InstallModes:              csv.Spec.InstallModes,
		Keywords:                  csv.Spec.Keywords,
		Labels:                    csv.Labels,
		Links:                     csv.Spec.Links,
		Maintainers:               csv.Spec.Maintainers,
		Maturity:                  csv.Spec.Maturity,
		MinKubeVersion:            csv.Spec.MinKubeVersion,
		NativeAPIs:                csv.Spec.NativeAPIs,
		Provider:                  csv.Spec.Provider,
	}))

	// As opm renders a bundle image: the CSV's related images, then the bundle image,
	// then the images of the operator's own containers that are not listed yet.
	var related []RelatedImage
	seen := map[string]bool{}
	add := func(name, img string) {
		if !seen[img] {
			seen[img] = true
			related = append(related, RelatedImage{Name: name, Image: img})
		}
	}
	for _, ri := range csv.Spec.RelatedImages {
		add(ri.Name, ri.Image)
	}
	add("", image)
	var own []string
	for _, d := range csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs {
		for _, c := range append(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers...) {
			own = append(own, c.Image)
		}
	}
	sort.Strings(own)
	for _, img := range own {
		add("", img)
	}

	return CatalogBundle{
		Schema:        SchemaBundle,
		Name:          csv.Name,
		Package:       b.Package,
		Image:         image,
		Properties:    props,
		RelatedImages: related,
	}
}

// Add returns the catalog c (nil for none) with bundle b, served from image, in each of
// b's channels: other versions are kept, a version already in a channel keeps its entry,
// and a new version's entry replaces the channel's newest, so that each channel is one
// line of upgrades; a version older than a channel's newest is refused. Adding the same
// bundle twice gives the same catalog.
func Add(c *Catalog, b *Bundle, image string) (*Catalog, error) {
	entry := CatalogEntry(b, image)
	version, err := semver.Parse(b.CSV.Spec.Version.String())
	if err != nil {
		return nil, fmt.Errorf("bundle %s: version: %w", b.CSV.Name, err)
	}
	out := &Catalog{}
	if c != nil {
		if c.Package.Name != b.Package {
			return nil, fmt.Errorf("the catalog is of package %q, the bundle of %q", c.Package.Name, b.Package)
		}
		out.Package = c.Package
		out.Channels = append(out.Channels, c.Channels...)
		for _, cb := range c.Bundles {
			if cb.Name != entry.Name {
				out.Bundles = append(out.Bundles, cb)
			}
		}
	}
	versions := map[string]semver.Version{}
	newest := true
	for _, cb := range out.Bundles {
		v, err := cb.Version()
		if err != nil {
			return nil, err
		}
		versions[cb.Name] = v
		if v.GTE(version) {
			newest = false
		}
	}
	out.Bundles = append(out.Bundles, entry)
	versions[entry.Name] = version
	sort.SliceStable(out.Bundles, func(i, j int) bool {
		return versions[out.Bundles[i].Name].LT(versions[out.Bundles[j].Name])
	})

	// The package's default channel, description and icon are the newest bundle's.
	if c == nil || newest {
		out.Package = Package{Schema: SchemaPackage, Name: b.Package, DefaultChannel: b.DefaultChannel, Description: b.CSV.Spec.Description}
		if len(b.CSV.Spec.Icon) > 0 {
			out.Package.Icon = &Icon{Data: b.CSV.Spec.Icon[0].Data, MediaType: b.CSV.Spec.Icon[0].MediaType}
		}
	}

	for _, name := range b.Channels {
		i := -1
		for j := range out.Channels {
			if out.Channels[j].Name == name {
				i = j
			}
		}
		if i < 0 {
			out.Channels = append(out.Channels, Channel{Schema: SchemaChannel, Package: b.Package, Name: name})
			i = len(out.Channels) - 1
		}
		ch := out.Channels[i]
		var head string
		present := false
		for _, e := range ch.Entries {
			if e.Name == entry.Name {
				present = true
			}
			v, ok := versions[e.Name]
			if ok && v.LT(version) && (head == "" || v.GT(versions[head])) {
				head = e.Name
			}
		}
		if !present && head != "" && head != newestIn(ch, versions) {
			return nil, fmt.Errorf("channel %s: %s is older than the channel's newest bundle %s", name, entry.Name, newestIn(ch, versions))
		}
		if !present {
			ch.Entries = append(append([]ChannelEntry(nil), ch.Entries...), ChannelEntry{Name: entry.Name, Replaces: head})
		}
		out.Channels[i] = ch
	}
	sort.SliceStable(out.Channels, func(i, j int) bool { return out.Channels[i].Name < out.Channels[j].Name })
	return out, nil
}

// newestIn is the name of the newest bundle of channel ch.
func newestIn(ch Channel, versions map[string]semver.Version) string {
	var newest string
	for _, e := range ch.Entries {
		if v, ok := versions[e.Name]; ok && (newest == "" || v.GT(versions[newest])) {
			newest = e.Name
		}
	}
	return newest
}

// Version is the bundle's version, from its olm.package property.
func (b CatalogBundle) Version() (semver.Version, error) {
	for _, p := range b.Properties {
		if p.Type == PropertyPackage {
			var pkg PackageProperty
			if err := json.Unmarshal(p.Value, &pkg); err != nil {
				return semver.Version{}, fmt.Errorf("bundle %s: %s: %w", b.Name, PropertyPackage, err)
			}
			return semver.Parse(pkg.Version)
		}
	}
	return semver.Version{}, fmt.Errorf("bundle %s has no %s property", b.Name, PropertyPackage)
}

// Marshal writes the catalog as YAML documents: the package, its channels, its bundles.
func (c *Catalog) Marshal() ([]byte, error) {
	var out bytes.Buffer
	docs := []any{c.Package}
	for _, ch := range c.Channels {
		docs = append(docs, ch)
	}
	for _, b := range c.Bundles {
		docs = append(docs, b)
	}
	for _, d := range docs {
		y, err := yaml.Marshal(d)
		if err != nil {
			return nil, err
		}
		out.WriteString("---\n")
		out.Write(y)
	}
	return out.Bytes(), nil
}

// Parse reads a catalog of one package written by Marshal (or by opm).
func Parse(data []byte) (*Catalog, error) {
	c := &Catalog{}
	packages := 0
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		var meta struct {
			Schema string `json:"schema"`
		}
		if err := json.Unmarshal(raw, &meta); err != nil {
			return nil, err
		}
		var err error
		switch meta.Schema {
		case SchemaPackage:
			packages++
			err = strictUnmarshal(raw, &c.Package)
		case SchemaChannel:
			var ch Channel
			err = strictUnmarshal(raw, &ch)
			c.Channels = append(c.Channels, ch)
		case SchemaBundle:
			var b CatalogBundle
			err = strictUnmarshal(raw, &b)
			c.Bundles = append(c.Bundles, b)
		default:
			err = fmt.Errorf("unknown schema %q", meta.Schema)
		}
		if err != nil {
			return nil, err
		}
	}
	if packages != 1 {
		return nil, fmt.Errorf("want one %s, found %d", SchemaPackage, packages)
	}
	return c, nil
}

func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func mustProperty(typ string, v any) Property {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // the property types above always marshal
	}
	return Property{Type: typ, Value: data}
}
