package storage

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/claims"
)

const gi = 1 << 30

func claim(name, requested, capacity string) claims.Claim {
	c := claims.Claim{Name: name, Requested: resource.MustParse(requested)}
	if capacity != "" {
		c.Capacity = resource.MustParse(capacity)
	}
	return c
}

func TestAutoGrow(t *testing.T) {
	spec := dbv1.StorageSpec{Size: ptr.To(resource.MustParse("4Gi")),
		AutoGrow: &dbv1.AutoGrowSpec{MaxSize: resource.MustParse("10Gi"), Threshold: 80, Increment: 25}}
	at := func(size string) []claims.Claim {
		return []claims.Claim{claim("a", size, size), claim("b", size, size)}
	}
	usage := func(total, used int64) []Usage {
		return []Usage{{Instance: "db-0", Bytes: total, FreeBytes: total - used}, {Instance: "db-1", Bytes: total, FreeBytes: total}}
	}
	for _, tc := range []struct {
		name   string
		spec   dbv1.StorageSpec
		want   string
		claims []claims.Claim
		usage  []Usage
		size   string // "" for no growth
		atMax  bool
		reason string
	}{
		{name: "below the threshold", spec: spec, want: "4Gi", claims: at("4Gi"), usage: usage(4*gi, 3*gi)},
		{name: "above it: by a quarter, rounded up to Gi", spec: spec, want: "4Gi", claims: at("4Gi"), usage: usage(4*gi, 4*gi-100<<20),
			size: "5Gi", reason: "db-0 98% used (above 80%): growing the volumes from 4Gi to 5Gi (autoGrow.maxSize 10Gi)"},
		{name: "never beyond maxSize", spec: spec, want: "9Gi", claims: at("9Gi"), usage: usage(9*gi, 9*gi-1<<20), size: "10Gi"},
		{name: "at maxSize", spec: spec, want: "10Gi", claims: at("10Gi"), usage: usage(10*gi, 10*gi-1<<20), atMax: true,
			reason: "at autoGrow.maxSize 10Gi already"},
		{name: "a claim still expanding", spec: spec, want: "5Gi", claims: []claims.Claim{claim("a", "5Gi", "4Gi"), claim("b", "5Gi", "5Gi")},
			usage: usage(4*gi, 4*gi-1<<20)},
		{name: "a file system not resized yet", spec: spec, want: "5Gi", claims: at("5Gi"), usage: usage(4*gi, 4*gi-1<<20)},
		{name: "no autoGrow", spec: dbv1.StorageSpec{Size: spec.Size}, want: "4Gi", claims: at("4Gi"), usage: usage(4*gi, 4*gi)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := AutoGrow(tc.spec, resource.MustParse(tc.want), tc.claims, tc.usage)
			switch {
			case tc.size == "" && !g.Size.IsZero():
				t.Errorf("grows to %s (%s), want no growth", g.Size.String(), g.Reason)
			case tc.size != "" && g.Size.Cmp(resource.MustParse(tc.size)) != 0:
				t.Errorf("grows to %s (%s), want %s", g.Size.String(), g.Reason, tc.size)
			case g.AtMax != tc.atMax || !strings.Contains(g.Reason, tc.reason):
				t.Errorf("atMax %v, reason %q; want %v and a reason containing %q", g.AtMax, g.Reason, tc.atMax, tc.reason)
			}
		})
	}
}
