package chart

import (
	"fmt"
	"sort"
	"strings"

	helmchart "helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"

	"github.com/pgpilot/pgpilot/internal/operator/plan"
)

// DefaultKubeVersion is the Kubernetes version a render assumes unless told otherwise: the
// oldest one the chart supports.
const DefaultKubeVersion = "v1.29.0"

// Load reads the chart in dir, e.g. helm-charts/postgrescluster.
func Load(dir string) (*helmchart.Chart, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("loading chart %s: %w", dir, err)
	}
	return ch, nil
}

// Options describe one render of the chart.
type Options struct {
	// Name is the release name, which is the cluster's name.
	Name string
	// Namespace is the release's namespace.
	Namespace string
	// Values override the chart's values.yaml, as a PostgresCluster's spec does.
	Values map[string]any
	// KubeVersion of the cluster; DefaultKubeVersion when empty.
	KubeVersion string
	// APIVersions the cluster serves beyond the built-in ones, as "group/version" or
	// "group/version/Kind".
	APIVersions []string
	// Observed is what the plan finds in the cluster (internal/operator/plan); the zero value is
	// a cluster never deployed.
	Observed plan.Observed
}

// Document is one rendered object, as YAML.
type Document struct {
	// Template is the template file that rendered it, e.g. postgrescluster/templates/statefulset.yaml.
	Template string
	// YAML is the object.
	YAML string
}

// Rendered is the output of one render.
type Rendered struct {
	// Documents are the rendered objects in template name order, empty documents left out.
	Documents []Document
	// Notes is the rendered NOTES.txt.
	Notes string
}

// Render renders ch with opts like the operator's Helm manager does: the plan is made
// from the values and opts.Observed (plan.ChartValues, the manager's value translator
// without its reads), values are coalesced with the chart's values.yaml and checked
// against its values.schema.json, and the chart's kubeVersion constraint is checked.
func Render(ch *helmchart.Chart, opts Options) (*Rendered, error) {
	kubeVersion := opts.KubeVersion
	if kubeVersion == "" {
		kubeVersion = DefaultKubeVersion
	}
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	if ch.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, kv.String()) {
		return nil, fmt.Errorf("chart requires kubeVersion %s, which is incompatible with Kubernetes %s", ch.Metadata.KubeVersion, kv.String())
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	caps.APIVersions = append(chartutil.VersionSet{}, caps.APIVersions...)
	caps.APIVersions = append(caps.APIVersions, opts.APIVersions...)

	values, err := plan.ChartValues(ch, plan.Cluster{Name: opts.Name, Namespace: opts.Namespace}, opts.Values, opts.Observed)
	if err != nil {
		return nil, err
	}
	release := chartutil.ReleaseOptions{Name: opts.Name, Namespace: opts.Namespace, Revision: 1, IsInstall: true}
	renderValues, err := chartutil.ToRenderValues(ch, values, release, caps)
	if err != nil {
		return nil, err
	}

	files, err := engine.Render(ch, renderValues)
	if err != nil {
		return nil, err
	}

	rendered := &Rendered{}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			rendered.Notes = files[name]
			continue
		}
		docs := releaseutil.SplitManifests(files[name])
		keys := make([]string, 0, len(docs))
		for key := range docs {
			keys = append(keys, key)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, key := range keys {
			if strings.TrimSpace(docs[key]) == "" {
				continue
			}
			rendered.Documents = append(rendered.Documents, Document{Template: name, YAML: docs[key]})
		}
	}
	return rendered, nil
}

// Manifest is every document joined the way Helm stores a release's manifest.
func (r *Rendered) Manifest() string {
	var b strings.Builder
	for _, doc := range r.Documents {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", doc.Template, doc.YAML)
	}
	return b.String()
}
