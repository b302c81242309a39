package helmmanager

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func cond(t, status string, extra ...string) map[string]any {
	c := map[string]any{"type": t, "status": status}
	for i := 0; i+1 < len(extra); i += 2 {
		c[extra[i]] = extra[i+1]
	}
	return c
}

func TestMergeHelmStatus(t *testing.T) {
	server := map[string]any{
		"phase":          "Healthy",
		"currentPrimary": "db-0",
		"instances":      []any{map[string]any{"name": "db-0", "role": "primary"}},
		"conditions": []any{
			cond("Initialized", "True"),
			map[string]any{"type": "Ready", "status": "True", "reason": "AllInstancesReady", "observedGeneration": int64(4)},
			cond("Deployed", "True", "reason", "InstallSuccessful"),
			cond("ReleaseFailed", "True", "reason", "UpgradeError"),
		},
		"deployedRelease": map[string]any{"name": "db", "manifest": "old"},
	}
	for _, tc := range []struct {
		name   string
		server map[string]any
		helm   map[string]any
		want   map[string]any
	}{
		{
			name:   "Helm's conditions replace, drop and add its own; the controller's fields and conditions stay",
			server: server,
			helm: map[string]any{
				// As helm-operator-plugins writes it: the controller's condition decoded
				// without the fields its struct lacks.
				"conditions": []any{
					cond("Initialized", "True"),
					cond("Ready", "True", "reason", "AllInstancesReady"),
					cond("Deployed", "True", "reason", "UpgradeSuccessful"),
					cond("Irreconcilable", "True", "reason", "ReconcileError"),
				},
				"deployedRelease": map[string]any{"name": "db", "manifest": "new"},
			},
			want: map[string]any{
				"phase":          "Healthy",
				"currentPrimary": "db-0",
				"instances":      []any{map[string]any{"name": "db-0", "role": "primary"}},
				"conditions": []any{
					cond("Initialized", "True"),
					map[string]any{"type": "Ready", "status": "True", "reason": "AllInstancesReady", "observedGeneration": int64(4)},
					cond("Deployed", "True", "reason", "UpgradeSuccessful"),
					cond("Irreconcilable", "True", "reason", "ReconcileError"),
				},
				"deployedRelease": map[string]any{"name": "db", "manifest": "new"},
			},
		},
		{
			name:   "an uninstall removes the release",
			server: map[string]any{"phase": "Healthy", "deployedRelease": map[string]any{"name": "db"}},
			helm:   map[string]any{"conditions": []any{cond("Deployed", "False", "reason", "UninstallSuccessful")}},
			want: map[string]any{
				"phase":      "Healthy",
				"conditions": []any{cond("Deployed", "False", "reason", "UninstallSuccessful")},
			},
		},
		{
			name: "a cluster without status gets Helm's",
			helm: map[string]any{"conditions": []any{cond("Initialized", "True")}},
			want: map[string]any{"conditions": []any{cond("Initialized", "True")}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := cmp.Diff(nil, tc.server)
			got := mergeHelmStatus(tc.server, tc.helm)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("merged status (-want +got):\n%s", diff)
			}
			if after := cmp.Diff(nil, tc.server); after != before {
				t.Errorf("the server's status was modified")
			}
		})
	}
}
