package backup

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
)

// A backup that ends (here: recorded Completed by whoever imported it) between the
// reconciler's read and its label patch keeps its end: the reconciler does not fail it
// for naming a cluster that does not exist, on the state the patch answered with.
func TestBackupThatEndedMeanwhileKeepsItsEnd(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := dbv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := &dbv1.PostgresBackup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nightly"},
		Spec: dbv1.PostgresBackupSpec{Cluster: dbv1.LocalObjectReference{Name: "old-db"}}}
	completed := false
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(b).WithStatusSubresource(b).
		WithInterceptorFuncs(interceptor.Funcs{
			Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
				if !completed {
					completed = true
					var now dbv1.PostgresBackup
					if err := cl.Get(ctx, client.ObjectKeyFromObject(obj), &now); err != nil {
						return err
					}
					now.Status = dbv1.PostgresBackupStatus{Phase: dbv1.BackupCompleted, BackupID: "20250601T000000Z"}
					if err := cl.Status().Update(ctx, &now); err != nil {
						return err
					}
				}
				return cl.Patch(ctx, obj, patch, opts...)
			},
		}).Build()
	r := NewReconciler(c, record.NewFakeRecorder(10), clocktesting.NewFakePassiveClock(metav1.Now().Time), nil)
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(b)}); err != nil {
		t.Fatal(err)
	}
	var got dbv1.PostgresBackup
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(b), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != dbv1.BackupCompleted || got.Labels[dbv1.LabelCluster] != "old-db" {
		t.Errorf("phase %q (%s), labels %v; want Completed, labelled with its cluster", got.Status.Phase, got.Status.Error, got.Labels)
	}
}
