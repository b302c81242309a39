package pooler

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// LeaseWatch keeps the newest primary Lease read: a get, then a watch from its
// resourceVersion, again after every interruption. The pooler's ServiceAccount may get
// and watch that one Lease, nothing else. Cut off from the API server, it keeps the last
// Lease read: the pool stays on the last holder, whose fence refuses writes once it is
// deposed (docs/failover.md), so a late move costs clients errors, never data.
type LeaseWatch struct {
	client          kubernetes.Interface
	namespace, name string
	log             logr.Logger

	mu      sync.Mutex
	rec     primarylease.Record
	read    bool
	version uint64
	changed chan struct{}
}

// NewLeaseWatch returns a watch of Lease namespace/name; Run starts it.
func NewLeaseWatch(c kubernetes.Interface, namespace, name string, log logr.Logger) *LeaseWatch {
	return &LeaseWatch{client: c, namespace: namespace, name: name, log: log, changed: make(chan struct{}, 1)}
}

// Record is the newest Lease read; an error before the first.
func (w *LeaseWatch) Record(context.Context) (primarylease.Record, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.read {
		return primarylease.Record{}, errors.New("the primary Lease was not read yet")
	}
	return w.rec, nil
}

// Changed receives after the holder or the term changed.
func (w *LeaseWatch) Changed() <-chan struct{} { return w.changed }

// Run follows the Lease until ctx ends.
func (w *LeaseWatch) Run(ctx context.Context) {
	for ctx.Err() == nil {
		wait := 100 * time.Millisecond // a watch that ended: a new one, not at once
		if err := w.follow(ctx); err != nil && ctx.Err() == nil {
			w.log.Info("Cannot follow the primary Lease; retrying", "error", err.Error())
			wait = time.Second
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

func (w *LeaseWatch) follow(ctx context.Context) error {
	leases := w.client.CoordinationV1().Leases(w.namespace)
	l, err := leases.Get(ctx, w.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	w.set(l)
	timeout := int64(300)
	watcher, err := leases.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", w.name).String(),
		ResourceVersion: l.ResourceVersion,
		TimeoutSeconds:  &timeout,
	})
	if err != nil {
		return err
	}
	defer watcher.Stop()
	for ev := range watcher.ResultChan() {
		switch ev.Type {
		case watch.Added, watch.Modified:
			if l, ok := ev.Object.(*coordinationv1.Lease); ok {
				w.set(l)
			}
		case watch.Deleted:
			// The operator recreates it from what the agents report, with a new history
			// of resourceVersions: the last holder stands until then.
			w.mu.Lock()
			w.version = 0
			w.mu.Unlock()
		case watch.Error:
			return nil
		}
	}
	return nil
}

// set takes in a Lease read, unless it is older than the one held (a get that
// answered after a watch event).
func (w *LeaseWatch) set(l *coordinationv1.Lease) {
	r := primarylease.Parse(l)
	version, err := strconv.ParseUint(l.ResourceVersion, 10, 64)
	w.mu.Lock()
	if err == nil && version < w.version {
		w.mu.Unlock()
		return
	}
	moved := !w.read || r.Holder != w.rec.Holder || r.Term != w.rec.Term
	w.rec, w.read = r, true
	if err == nil {
		w.version = version
	}
	w.mu.Unlock()
	if moved {
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
}
