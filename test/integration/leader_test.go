package integration

import (
	"context"
	"flag"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/pgpilot/pgpilot/internal/operator/managerflags"
)

// A controller container killed while it leads restarts in the same pod. With the pod's
// name as its identity it takes its Lease back at once; any other candidate waits for
// the Lease to expire (15 s), and every failover in the cluster waits with it.
func TestRestartedLeaderResumesAtOnce(t *testing.T) {
	ns := newNamespace(t)
	const id = "pgpilot-leader-test"
	// The Lease as the killed container left it: held by the pod, renewed just now.
	now := metav1.NewMicroTime(time.Now())
	create(t, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To("pgpilot-controller-manager-0"), LeaseDurationSeconds: ptr.To[int32](15),
			AcquireTime: &now, RenewTime: &now,
		},
	})
	t.Setenv(managerflags.PodNamespaceEnv, ns)

	elected := func(identity string, within time.Duration) bool {
		t.Setenv(managerflags.PodNameEnv, identity)
		var f managerflags.Flags
		fs := flag.NewFlagSet("controller", flag.ContinueOnError)
		f.Register(fs, "0", "0", id)
		if err := fs.Parse([]string{"--leader-elect"}); err != nil {
			t.Fatal(err)
		}
		opts, err := f.Options(runtime.NewScheme(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		mgr, err := ctrl.NewManager(cfg, opts)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- mgr.Start(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager %s: %v", identity, err)
			}
		}()
		select {
		case <-mgr.Elected():
			return true
		case <-time.After(within):
			return false
		}
	}

	// Another pod must not take over a Lease that is still valid.
	if elected("pgpilot-controller-manager-1", 3*time.Second) {
		t.Fatal("another pod took over a Lease renewed 3 s ago, valid for 15 s")
	}
	// The holder's restarted container resumes long before the Lease expires.
	if !elected("pgpilot-controller-manager-0", 8*time.Second) {
		t.Fatal("the restarted leader was not elected within 8 s of a Lease renewed by its pod: it waited for its own Lease to expire")
	}
}
