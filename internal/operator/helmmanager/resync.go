package helmmanager

import (
	"context"
	"hash/fnv"
	"sync"
	"time"

	"github.com/operator-framework/helm-operator-plugins/pkg/reconciler"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// spreadResync reconciles every custom resource of gvk once per period, each in a
// second of the period of its own (a hash of its namespace and name), so that drift is
// repaired as often as before but never all at once. The reconciler's own period
// requeued each resource period after its last reconcile: the resources created or
// changed together (a fleet installed at once, an operator upgrade that re-renders
// every release) came back together, every period, and a cluster created in that
// minute waited behind all of them (a thousand at 1,000 clusters, four at a time). The
// reconciler is given no period of its own.
func spreadResync(c cache.Cache, gvk schema.GroupVersionKind, period time.Duration) reconciler.ControllerSetupFunc {
	return func(setup reconciler.ControllerSetup) error {
		return setup.Watch(source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			obj := &unstructured.Unstructured{}
			obj.SetGroupVersionKind(gvk)
			informer, err := c.GetInformer(ctx, obj)
			if err != nil {
				return err
			}
			s := newSlots(period)
			if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
				AddFunc: func(o any) { s.add(o) },
				DeleteFunc: func(o any) {
					if key, err := toolscache.DeletionHandlingObjectToName(o); err == nil {
						s.remove(types.NamespacedName{Namespace: key.Namespace, Name: key.Name})
					}
				},
			}); err != nil {
				return err
			}
			go s.run(ctx, q)
			return nil
		}))
	}
}

// slots are the resources by the second of the period they are resynced in.
type slots struct {
	period time.Duration
	mu     sync.Mutex
	keys   map[int]map[types.NamespacedName]bool
}

func newSlots(period time.Duration) *slots {
	return &slots{period: max(period, time.Second), keys: map[int]map[types.NamespacedName]bool{}}
}

// slot is key's second in the period.
func (s *slots) slot(key types.NamespacedName) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key.Namespace + "/" + key.Name))
	return int(h.Sum32() % uint32(s.period/time.Second))
}

func (s *slots) add(o any) {
	key, err := toolscache.ObjectToName(o)
	if err != nil {
		return
	}
	k := types.NamespacedName{Namespace: key.Namespace, Name: key.Name}
	s.mu.Lock()
	defer s.mu.Unlock()
	slot := s.slot(k)
	if s.keys[slot] == nil {
		s.keys[slot] = map[types.NamespacedName]bool{}
	}
	s.keys[slot][k] = true
}

func (s *slots) remove(k types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.keys[s.slot(k)], k)
}

// due are the resources of the second at.
func (s *slots) due(at time.Time) []types.NamespacedName {
	s.mu.Lock()
	defer s.mu.Unlock()
	slot := int(at.Unix() % int64(s.period/time.Second))
	out := make([]types.NamespacedName, 0, len(s.keys[slot]))
	for k := range s.keys[slot] {
		out = append(out, k)
	}
	return out
}

func (s *slots) run(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := time.Now().Unix()
	for {
		select {
		case <-ctx.Done():
			return
		case at := <-tick.C:
			// Every second since the last tick: a late tick skips none.
			for ; last < at.Unix(); last++ {
				s.enqueue(q, time.Unix(last+1, 0))
			}
		}
	}
}

// resyncYieldsAt is the queue length at which the resync gives way: the resources of
// that second are not queued, and come back a period later. A resync is a backstop (the
// dependent watches repair drift as it happens), and at 1,000 clusters on a loaded API
// server it brought more work than the manager could do (1.7 reconciles a second against
// 1.25 done): the queue never emptied, and a new cluster waited behind a thousand
// resyncs.
const resyncYieldsAt = 8

// enqueue queues the resources of the second at, unless the queue is busy with other
// work.
func (s *slots) enqueue(q workqueue.TypedRateLimitingInterface[reconcile.Request], at time.Time) {
	if q.Len() >= resyncYieldsAt {
		return
	}
	for _, k := range s.due(at) {
		q.Add(reconcile.Request{NamespacedName: k})
	}
}
