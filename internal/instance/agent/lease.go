package agent

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// AnnotationBootstrapped on the primary Lease says the cluster's first primary came up
// (the controller sets it). From then on, an empty data directory on the Lease's holder is
// a lost volume, never a reason to run initdb.
const AnnotationBootstrapped = dbv1.AnnotationBootstrapped

// LeaseView is the primary Lease as the agent last saw it: what its decisions depend
// on. The holder's renewals do not change it.
type LeaseView struct {
	// Known is false until the Lease was read once.
	Known bool
	// Holder is the primary's pod name; "" when none.
	Holder string
	// Term grows at every change of holder.
	Term int32
	// Bootstrapped mirrors AnnotationBootstrapped.
	Bootstrapped bool
	// Handover says why Holder is "", when it is.
	Handover *primarylease.Handover
	// Hibernation is where spec.stopped stands (nil while the cluster runs), and
	// Fenced the instances the user fenced: both keep postgres stopped (KeepsDown).
	Hibernation *primarylease.Hibernation
	Fenced      []string
}

// KeepsDown says why the Lease keeps pod's postgres stopped, "" when it does not: the
// user fenced it, or it is the holder of a cluster that is stopping or stopped.
func (v LeaseView) KeepsDown(pod string) string {
	r := primarylease.Record{Holder: v.Holder, Term: v.Term, Hibernation: v.Hibernation, Fenced: v.Fenced}
	switch {
	case !r.KeepsDown(pod):
		return ""
	case r.IsFenced(pod):
		return "fenced (" + dbv1.AnnotationFencedInstances + ")"
	}
	return "hibernating (spec.stopped): the primary keeps its role, stopped"
}

// LeaseFollower keeps the latest view of the primary Lease with get and watch, and
// writes the two changes an agent makes: the holder's renewal and its release (the
// pods' pgconf.Role grants get, watch and update of that one Lease, nothing more). When the
// API server cannot be reached it keeps the last view.
type LeaseFollower struct {
	client    kubernetes.Interface
	namespace string
	name      string
	log       logr.Logger

	mu      sync.Mutex
	view    LeaseView
	record  primarylease.Record
	lease   *coordinationv1.Lease // the newest read, the base of the next write
	version uint64                // resourceVersion of the Lease behind view
	seen    time.Time
	changed chan struct{}
	// renewTime is the Lease's renewTime as last read, first read at renewSeen;
	// renewChanged: it changed while followed (a renewal seen happen, not a first read).
	renewTime    time.Time
	renewSeen    time.Time
	renewChanged bool
}

// NewLeaseFollower returns a follower of Lease namespace/name.
func NewLeaseFollower(c kubernetes.Interface, namespace, name string, log logr.Logger) *LeaseFollower {
	return &LeaseFollower{client: c, namespace: namespace, name: name, log: log, changed: make(chan struct{}, 1)}
}

// View returns the latest view.
func (f *LeaseFollower) View() LeaseView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.view
}

// LastSeen is when the API server last answered about the Lease.
func (f *LeaseFollower) LastSeen() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen
}

// RenewalSeen returns the Lease's renewTime as last read and when this follower first
// read it; ok only once it saw the renewTime change (a renewal seen happen).
func (f *LeaseFollower) RenewalSeen() (renewTime, seen time.Time, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renewTime, f.renewSeen, f.renewChanged && !f.renewTime.IsZero()
}

// Changed receives a value after the view changed.
func (f *LeaseFollower) Changed() <-chan struct{} { return f.changed }

// Record is the newest Lease read, parsed.
func (f *LeaseFollower) Record() primarylease.Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.record
}

// Apply writes change on the newest Lease read (optimistic concurrency, retried after a
// conflict on a fresh read) and takes in the result.
func (f *LeaseFollower) Apply(ctx context.Context, change primarylease.Change) error {
	f.mu.Lock()
	base := f.lease
	f.mu.Unlock()
	store := primarylease.ClientsetStore{Client: f.client, Namespace: f.namespace, Name: f.name}
	written, err := primarylease.Apply(ctx, store, base, time.Now, change)
	if err != nil {
		if errors.Is(err, primarylease.ErrNotHolder) {
			_, _ = f.Refresh(ctx)
		}
		return err
	}
	f.set(written)
	return nil
}

// Refresh reads the Lease now, bypassing the watch.
func (f *LeaseFollower) Refresh(ctx context.Context) (LeaseView, error) {
	lease, err := f.client.CoordinationV1().Leases(f.namespace).Get(ctx, f.name, metav1.GetOptions{})
	if err != nil {
		return f.View(), err
	}
	f.set(lease)
	return f.View(), nil
}

// set takes in a Lease read by a get or a watch event. The periodic get, the watch and
// Refresh race one another, so a read that answers late can carry an older Lease than
// the view already holds; it only counts as a sign of life then. (The agent once
// promoted itself on a fresh read and demoted itself a moment later on a stale one.)
func (f *LeaseFollower) set(l *coordinationv1.Lease) {
	r := primarylease.Parse(l)
	v := LeaseView{Known: true, Holder: r.Holder, Term: r.Term, Bootstrapped: r.Bootstrapped, Handover: r.Handover,
		Hibernation: r.Hibernation, Fenced: r.Fenced}
	version, versioned := resourceVersion(l)
	f.mu.Lock()
	old := f.view
	f.seen = time.Now()
	if versioned && version < f.version {
		f.mu.Unlock()
		return
	}
	f.view, f.record, f.lease, f.version = v, r, l, version
	if !r.RenewTime.Equal(f.renewTime) {
		f.renewChanged = !f.renewSeen.IsZero()
		f.renewTime, f.renewSeen = r.RenewTime, f.seen
	}
	f.mu.Unlock()
	if !sameView(old, v) {
		select {
		case f.changed <- struct{}{}:
		default:
		}
	}
}

// Run follows the Lease until ctx ends: a get, then a watch from its resourceVersion,
// again after every interruption; and a get every probe period, so that LastSeen says
// when the API server last answered even while nothing changes.
func (f *LeaseFollower) Run(ctx context.Context, probe time.Duration) {
	go func() {
		t := time.NewTicker(probe)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				getCtx, cancel := context.WithTimeout(ctx, probe)
				_, _ = f.Refresh(getCtx)
				cancel()
			}
		}
	}()
	for ctx.Err() == nil {
		if err := f.follow(ctx); err != nil && ctx.Err() == nil {
			f.log.Info("Cannot follow the primary Lease; retrying", "error", err.Error())
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (f *LeaseFollower) follow(ctx context.Context) error {
	lease, err := f.client.CoordinationV1().Leases(f.namespace).Get(ctx, f.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	f.set(lease)
	timeout := int64(300)
	w, err := f.client.CoordinationV1().Leases(f.namespace).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", f.name).String(),
		ResourceVersion: lease.ResourceVersion,
		TimeoutSeconds:  &timeout,
	})
	if err != nil {
		return err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Added, watch.Modified:
			if l, ok := ev.Object.(*coordinationv1.Lease); ok {
				f.set(l)
			}
		case watch.Deleted:
			// A deleted Lease is a lost record, not a revocation: the view stands, so a
			// primary's renewals fail and it turns to its peers (the failsafe), and the
			// standbys keep confirming it, until the operator recreates the Lease from
			// what the agents report (docs/failover.md, "The cluster's record"). The
			// recreated Lease has a new resourceVersion history to start from.
			f.mu.Lock()
			f.version, f.lease = 0, nil
			last := f.view
			f.mu.Unlock()
			f.log.Info("The primary Lease was deleted; keeping its last view until it is recreated",
				"holder", last.Holder, "term", last.Term)
		case watch.Error:
			return nil
		}
	}
	return nil
}

// sameView compares what decisions depend on.
func sameView(a, b LeaseView) bool {
	ha, hb := a.Handover, b.Handover
	return a.Known == b.Known && a.Holder == b.Holder && a.Term == b.Term && a.Bootstrapped == b.Bootstrapped &&
		(ha == nil) == (hb == nil) && (ha == nil || *ha == *hb) &&
		a.KeepsDown(a.Holder) == b.KeepsDown(b.Holder) && slices.Equal(a.Fenced, b.Fenced)
}

// resourceVersion returns the Lease's resourceVersion as a number. Kubernetes calls it
// opaque, but every API server backed by etcd hands out its revision, which only grows;
// one that does not parse is taken as newest, as before this check existed.
func resourceVersion(l *coordinationv1.Lease) (uint64, bool) {
	v, err := strconv.ParseUint(l.ResourceVersion, 10, 64)
	return v, err == nil
}
