package olm_test

import (
	"testing"

	"github.com/blang/semver/v4"
	"github.com/google/go-cmp/cmp"
	"github.com/operator-framework/api/pkg/lib/version"
	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pgpilot/pgpilot/internal/tools/olm"
)

type bundleOption func(*olm.Bundle)

func inChannels(channels ...string) bundleOption {
	return func(b *olm.Bundle) { b.Channels = channels }
}

func withDescription(d string) bundleOption {
	return func(b *olm.Bundle) { b.CSV.Spec.Description = d }
}

// newBundle is a pgpilot bundle of version v in the stable and candidate channels.
func newBundle(v string, opts ...bundleOption) *olm.Bundle {
	b := &olm.Bundle{Bundle: &manifests.Bundle{
		Package:        "pgpilot",
		Channels:       []string{"candidate", "stable"},
		DefaultChannel: "stable",
		CSV: &v1alpha1.ClusterServiceVersion{
			ObjectMeta: metav1.ObjectMeta{Name: "pgpilot.v" + v},
			Spec: v1alpha1.ClusterServiceVersionSpec{
				Version:     version.OperatorVersion{Version: semver.MustParse(v)},
				DisplayName: "pgpilot",
				Description: "pgpilot " + v,
				Icon:        []v1alpha1.Icon{{Data: "PHN2Zz4=", MediaType: "image/svg+xml"}},
			},
		},
		V1CRDs: []*apiextensionsv1.CustomResourceDefinition{{Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group:    "db.example.com",
			Names:    apiextensionsv1.CustomResourceDefinitionNames{Kind: "PostgresCluster"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true}},
		}}},
	}}
	for _, opt := range opts {
		opt(b)
	}
	return b
}

func image(v string) string { return "example.com/pgpilot-bundle:v" + v }

// add adds each bundle in turn to an empty catalog.
func add(t *testing.T, bundles ...*olm.Bundle) *olm.Catalog {
	t.Helper()
	var c *olm.Catalog
	for _, b := range bundles {
		var err error
		if c, err = olm.Add(c, b, image(b.CSV.Spec.Version.String())); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

type channelView map[string][]olm.ChannelEntry

func channels(c *olm.Catalog) channelView {
	out := channelView{}
	for _, ch := range c.Channels {
		out[ch.Name] = ch.Entries
	}
	return out
}

func TestAddBuildsTheUpgradeGraph(t *testing.T) {
	tests := []struct {
		name        string
		bundles     []*olm.Bundle
		want        channelView
		wantBundles []string
		pkgDesc     string
	}{
		{
			name:        "first release",
			bundles:     []*olm.Bundle{newBundle("0.1.0")},
			want:        channelView{"candidate": {{Name: "pgpilot.v0.1.0"}}, "stable": {{Name: "pgpilot.v0.1.0"}}},
			wantBundles: []string{"pgpilot.v0.1.0"},
			pkgDesc:     "pgpilot 0.1.0",
		},
		{
			name:    "a new version replaces the newest of each channel",
			bundles: []*olm.Bundle{newBundle("0.1.0"), newBundle("0.2.0"), newBundle("0.3.0", inChannels("candidate"))},
			want: channelView{
				"candidate": {{Name: "pgpilot.v0.1.0"}, {Name: "pgpilot.v0.2.0", Replaces: "pgpilot.v0.1.0"}, {Name: "pgpilot.v0.3.0", Replaces: "pgpilot.v0.2.0"}},
				"stable":    {{Name: "pgpilot.v0.1.0"}, {Name: "pgpilot.v0.2.0", Replaces: "pgpilot.v0.1.0"}},
			},
			wantBundles: []string{"pgpilot.v0.1.0", "pgpilot.v0.2.0", "pgpilot.v0.3.0"},
			pkgDesc:     "pgpilot 0.3.0",
		},
		{
			name:    "promoting a candidate to stable",
			bundles: []*olm.Bundle{newBundle("0.1.0"), newBundle("0.2.0", inChannels("candidate")), newBundle("0.2.0")},
			want: channelView{
				"candidate": {{Name: "pgpilot.v0.1.0"}, {Name: "pgpilot.v0.2.0", Replaces: "pgpilot.v0.1.0"}},
				"stable":    {{Name: "pgpilot.v0.1.0"}, {Name: "pgpilot.v0.2.0", Replaces: "pgpilot.v0.1.0"}},
			},
			wantBundles: []string{"pgpilot.v0.1.0", "pgpilot.v0.2.0"},
			pkgDesc:     "pgpilot 0.2.0",
		},
		{
			name:        "adding the same bundle again changes nothing but its content",
			bundles:     []*olm.Bundle{newBundle("0.1.0"), newBundle("0.1.0", withDescription("rebuilt"))},
			want:        channelView{"candidate": {{Name: "pgpilot.v0.1.0"}}, "stable": {{Name: "pgpilot.v0.1.0"}}},
			wantBundles: []string{"pgpilot.v0.1.0"},
			pkgDesc:     "rebuilt",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := add(t, tc.bundles...)
			if diff := cmp.Diff(tc.want, channels(c)); diff != "" {
				t.Errorf("channels (-want +got):\n%s", diff)
			}
			var names []string
			for _, b := range c.Bundles {
				names = append(names, b.Name)
			}
			if diff := cmp.Diff(tc.wantBundles, names); diff != "" {
				t.Errorf("bundles (-want +got):\n%s", diff)
			}
			if c.Package.Description != tc.pkgDesc || c.Package.DefaultChannel != "stable" {
				t.Errorf("package description %q default channel %q, want %q and stable", c.Package.Description, c.Package.DefaultChannel, tc.pkgDesc)
			}
		})
	}
}

// What Marshal writes, Parse reads back, and adding the same bundle again writes the same
// bytes.
func TestMarshalParseRoundTrip(t *testing.T) {
	c := add(t, newBundle("0.1.0"), newBundle("0.2.0"))
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := olm.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	again, err := olm.Add(back, newBundle("0.2.0"), image("0.2.0"))
	if err != nil {
		t.Fatal(err)
	}
	data2, err := again.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(data), string(data2)); diff != "" {
		t.Errorf("(-first +second):\n%s", diff)
	}
}

// A channel's entries form one line of upgrades, newest last: a version older than the
// newest of a channel would make a second head.
func TestAddRefusesAnOlderVersion(t *testing.T) {
	c := add(t, newBundle("0.1.0"), newBundle("0.2.0", inChannels("candidate")))
	if _, err := olm.Add(c, newBundle("0.1.1", inChannels("candidate")), image("0.1.1")); err == nil {
		t.Error("0.1.1 was added to a channel whose newest version is 0.2.0")
	}
	if _, err := olm.Add(c, newBundle("0.1.1", inChannels("stable")), image("0.1.1")); err != nil {
		t.Errorf("0.1.1 was refused in a channel whose newest version is 0.1.0: %v", err)
	}
}

func TestAddRefusesAnotherPackage(t *testing.T) {
	c := add(t, newBundle("0.1.0"))
	other := newBundle("0.2.0")
	other.Package = "other"
	if _, err := olm.Add(c, other, image("0.2.0")); err == nil {
		t.Error("a bundle of another package was added")
	}
}

func TestParseRefusesUnknownSchemas(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown schema": "---\nschema: olm.package\nname: pgpilot\ndefaultChannel: stable\n---\nschema: olm.template.basic\n",
		"no package":     "---\nschema: olm.channel\npackage: pgpilot\nname: stable\nentries: []\n",
		"unknown field":  "---\nschema: olm.package\nname: pgpilot\ndefaultChannel: stable\nsurprise: 1\n",
	} {
		if _, err := olm.Parse([]byte(doc)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}
