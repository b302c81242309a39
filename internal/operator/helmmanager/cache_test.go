package helmmanager

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

func TestCheckCached(t *testing.T) {
	tests := []struct {
		gvk schema.GroupVersionKind
		ok  bool
	}{
		{dbv1.GroupVersion.WithKind("PostgresCluster"), true},
		{dbv1.GroupVersion.WithKind("PostgresBackup"), true},
		{dbv1.GroupVersion.WithKind("PostgresPooler"), false},
		{schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "PostgresCluster"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.gvk.String(), func(t *testing.T) {
			if err := checkCached(tt.gvk); (err == nil) != tt.ok {
				t.Errorf("checkCached = %v, want ok %t", err, tt.ok)
			}
		})
	}
}
