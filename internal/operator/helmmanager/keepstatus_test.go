package helmmanager

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
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
			name:   "Helm's conditions replace, drop and add its own; the controller's fields and conditions stay; no manifest",
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
				"deployedRelease": map[string]any{"name": "db"},
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

// A status write that would change nothing is not sent; one that changes something is
// sent without the release's manifest.
func TestStatusWriteOnlyWhenChanged(t *testing.T) {
	gvk := dbv1.GroupVersion.WithKind("PostgresCluster")
	stored := &unstructured.Unstructured{}
	stored.SetGroupVersionKind(gvk)
	stored.SetNamespace("ns")
	stored.SetName("db")
	stored.Object["status"] = map[string]any{
		"phase":           "Healthy",
		"conditions":      []any{cond("Deployed", "True", "reason", "InstallSuccessful")},
		"deployedRelease": map[string]any{"name": "db"},
	}
	var sent []map[string]any
	c := fake.NewClientBuilder().WithObjects(stored).WithStatusSubresource(stored).
		WithInterceptorFuncs(interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			sent = append(sent, obj.(*unstructured.Unstructured).Object["status"].(map[string]any))
			return c.SubResource(sub).Update(ctx, obj, opts...)
		}}).Build()
	w := keepStatus(c, c, gvk).Status()

	write := func(helm map[string]any) {
		t.Helper()
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "db"}, u); err != nil {
			t.Fatal(err)
		}
		u.Object["status"] = helm
		if err := w.Update(context.Background(), u); err != nil {
			t.Fatal(err)
		}
	}
	write(map[string]any{
		"conditions":      []any{cond("Deployed", "True", "reason", "InstallSuccessful")},
		"deployedRelease": map[string]any{"name": "db", "manifest": "kind: Service"},
	})
	if len(sent) != 0 {
		t.Errorf("a status that changed nothing but the manifest was sent: %v", sent)
	}
	write(map[string]any{
		"conditions":      []any{cond("Deployed", "True", "reason", "UpgradeSuccessful")},
		"deployedRelease": map[string]any{"name": "db", "manifest": "kind: Service"},
	})
	if len(sent) != 1 {
		t.Fatalf("%d status writes sent for a changed condition, want 1", len(sent))
	}
	want := map[string]any{
		"phase":           "Healthy",
		"conditions":      []any{cond("Deployed", "True", "reason", "UpgradeSuccessful")},
		"deployedRelease": map[string]any{"name": "db"},
	}
	if diff := cmp.Diff(want, sent[0]); diff != "" {
		t.Errorf("status sent (-want +got):\n%s", diff)
	}
}
