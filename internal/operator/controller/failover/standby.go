package failover

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/pgpilot/pgpilot/internal/operator/clusterpods"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// renewalRecorder records, in every replica of the controller and not only in the
// leader, when each holder's renewal of its primary Lease was seen. I2's wait counts
// from the last renewal the controller saw happen: a leader that started with no such
// record would wait T + margin from its first read of the Lease before it could fail a
// primary over. A standby replica that takes over from a leader that died knows the
// renewals it saw until then, so a primary that died with the leader can fail over at
// once (docs/failover.md, "The operator's own availability").
//
// A record is what this process saw on its own clock, as the leader's are: a renewal
// its watch delivered late makes the wait end later, never sooner, and the revocation
// is conditional on the Lease version read, so a renewal it did not see yet makes the
// revocation fail rather than go ahead.
type renewalRecorder struct {
	r     *Reconciler
	cache cache.Cache
}

// NeedLeaderElection is false: the recorder runs in standby replicas too.
func (renewalRecorder) NeedLeaderElection() bool { return false }

// Start records renewals until ctx ends.
func (rr renewalRecorder) Start(ctx context.Context) error {
	inf, err := rr.cache.GetInformer(ctx, &coordinationv1.Lease{})
	if err != nil {
		return fmt.Errorf("the Lease informer, to record renewals: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { rr.r.sawLease(obj) },
		UpdateFunc: func(_, obj any) { rr.r.sawLease(obj) },
	})
	if err != nil {
		return fmt.Errorf("recording renewals: %w", err)
	}
	<-ctx.Done()
	return inf.RemoveEventHandler(reg)
}

// sawLease records the renewal of a cluster's primary Lease, as it is now, when it is
// not the one recorded already: the first one seen is only a first read
// (renewObserved false), the next ones renewals seen happen.
func (r *Reconciler) sawLease(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	for _, req := range clusterpods.ClusterOf(context.Background(), l) {
		mem := r.remember(req.NamespacedName)
		rec := primarylease.Parse(l)
		r.mu.Lock()
		mem.sawRenewal(rec.RenewTime, r.clock.Now())
		r.mu.Unlock()
	}
}

// EarliestSighting is the earliest moment, on the controller's clock, by which an agent
// that answered had seen the Lease's renewal renewTime: each agent says how long before
// it answered it first read that renewTime (RenewalSeen), and now, after every answer
// came, minus that is no earlier than the read, which came after the renewal. So the
// renewal was made no later than the returned time, and I2's wait may count from it
// (docs/failover.md, "The operator's own availability"). ok is false when no agent
// that answered saw it change.
func EarliestSighting(renewTime time.Time, instances []Instance, now time.Time) (at time.Time, ok bool) {
	if renewTime.IsZero() {
		return time.Time{}, false
	}
	for _, i := range instances {
		rs := i.Status.RenewalSeen
		if !i.Reachable || rs == nil || !rs.RenewTime.Equal(renewTime) || rs.AgoMillis < 0 {
			continue
		}
		if t := now.Add(-time.Duration(rs.AgoMillis) * time.Millisecond); !ok || t.Before(at) {
			at, ok = t, true
		}
	}
	return at, ok
}

// agentsSawRenewal takes in what the agents that just answered (fresh, not statuses
// carried by a quiet cycle: their ages are of another moment) saw of the holder's last
// renewal, when one saw it before this controller did: a controller that has watched
// the Lease only since it started (a restart, a takeover) then counts I2's wait from
// the agents' sight instead of from its own first read.
func (c *cycle) agentsSawRenewal(fresh []Instance) {
	now := c.r.clock.Now()
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if c.mem.renewSeen.IsZero() {
		return
	}
	if at, ok := EarliestSighting(c.mem.renewTime, fresh, now); ok && at.Before(c.mem.renewSeen) {
		c.mem.renewSeen, c.mem.renewObserved = at, true
	}
}
