// Package olm reads the OLM bundle that make bundle writes and builds the file-based
// catalog (FBC) that serves it.
package olm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/operator-framework/api/pkg/manifests"
	"sigs.k8s.io/yaml"
)

// Directories and files of a registry+v1 bundle, relative to its root.
const (
	ManifestsDir    = "manifests"
	MetadataDir     = "metadata"
	AnnotationsFile = "metadata/annotations.yaml"
	ScorecardConfig = "tests/scorecard/config.yaml"
)

// Bundle is a bundle directory as OLM reads it: the manifests, and the package and
// channels from metadata/annotations.yaml.
type Bundle struct {
	*manifests.Bundle
	// Annotations are all of metadata/annotations.yaml.
	Annotations map[string]string
}

// LoadBundle reads the bundle rooted at dir, as `operator-sdk bundle validate` does: the
// manifests from dir/manifests, and the package, channels and default channel from
// dir/metadata/annotations.yaml.
func LoadBundle(dir string) (*Bundle, error) {
	data, err := os.ReadFile(filepath.Join(dir, AnnotationsFile))
	if err != nil {
		return nil, err
	}
	var ann struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.UnmarshalStrict(data, &ann); err != nil {
		return nil, fmt.Errorf("%s: %w", AnnotationsFile, err)
	}
	var meta manifests.AnnotationsFile
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return nil, fmt.Errorf("%s: %w", AnnotationsFile, err)
	}
	b, err := manifests.GetBundleFromDir(filepath.Join(dir, ManifestsDir))
	if err != nil {
		return nil, fmt.Errorf("loading the bundle in %s: %w", dir, err)
	}
	if b.CSV == nil {
		return nil, fmt.Errorf("the bundle in %s has no ClusterServiceVersion", dir)
	}
	b.Package = meta.Annotations.PackageName
	b.Channels = nil
	for _, c := range strings.Split(meta.Annotations.Channels, ",") {
		if c = strings.TrimSpace(c); c != "" {
			b.Channels = append(b.Channels, c)
		}
	}
	b.DefaultChannel = meta.Annotations.DefaultChannelName
	return &Bundle{Bundle: b, Annotations: ann.Annotations}, nil
}
