package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// confirmation is a primary's right to acknowledge commits (I1 in docs/failover.md):
// valid until T after the last confirmation was sent, for one term.
type confirmation struct {
	mu    sync.Mutex
	term  int32
	until time.Time // monotonic
	via   string
}

func (c *confirmation) confirm(term int32, sent time.Time, via string) (first bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	until := sent.Add(primarylease.Duration)
	first = term != c.term || c.until.IsZero()
	if first || until.After(c.until) {
		c.term, c.until, c.via = term, until, via
	}
	return first
}

// drop ends the confirmation at once: the Lease moved on.
func (c *confirmation) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.until = time.Time{}
}

// valid reports whether commits may be acknowledged in term now.
// confirmedIn reports whether any confirmation was given in term.
func (c *confirmation) confirmedIn(term int32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.term == term && !c.until.IsZero()
}

func (c *confirmation) valid(term int32, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.term == term && now.Before(c.until)
}

func (c *confirmation) status(term int32, now time.Time) *agentapi.Confirmation {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.term != term || c.until.IsZero() {
		return &agentapi.Confirmation{}
	}
	left := c.until.Sub(now)
	return &agentapi.Confirmation{Valid: left > 0, Via: c.via, RemainingMillis: max(left, 0).Milliseconds()}
}

// keepLease confirms this instance's right to write every RenewInterval while the Lease
// names it, and at once when kicked, until ctx ends.
func (a *Agent) keepLease(ctx context.Context) {
	t := time.NewTicker(primarylease.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.kick:
		}
		a.confirmOnce(ctx)
	}
}

// kickLease asks for a renewal now (a new primary, a changed synchronous set).
func (a *Agent) kickLease() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// renewTimeout bounds a renewal: a slow API server leaves time for the failsafe round
// within T of the previous confirmation.
const renewTimeout = 1500 * time.Millisecond

// confirmOnce renews the Lease, or when the API server does not answer, asks the peers.
func (a *Agent) confirmOnce(ctx context.Context) {
	view := a.lease.View()
	if view.Holder != a.cfg.PodName || a.handingOver.Load() || a.fencedNow.Load() {
		return
	}
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, renewTimeout)
	err := a.lease.Apply(rctx, primarylease.Renew(a.cfg.PodName, view.Term, a.syncRecordForRenewal()))
	cancel()
	switch {
	case err == nil:
		if a.conf.confirm(view.Term, sent, "api") {
			msg := "Confirmed the primary Lease in a new term: commits may be acknowledged"
			if a.following() != "" {
				msg = "Holds the primary Lease in a new term as the replica cluster's designated primary: it follows the source"
			}
			a.log.Info(msg, "term", view.Term, "via", "api", "renewalTook", time.Since(sent).Round(time.Millisecond).String())
		}
	case errors.Is(err, primarylease.ErrNotHolder):
		a.conf.drop()
		a.log.Info("The primary Lease moved on: stopped acknowledging commits")
		a.wake()
	default:
		sent = time.Now()
		if a.failsafe(ctx, view) {
			if a.conf.confirm(view.Term, sent, "peers") {
				a.log.Info("Confirmed the primary Lease in a new term: commits may be acknowledged", "term", view.Term,
					"via", "peers", "renewalError", err.Error())
			}
			return
		}
		if a.conf.valid(view.Term, time.Now()) || !a.conf.confirmedIn(view.Term) {
			a.log.Info("Cannot renew the primary Lease and not every other instance confirms this primary", "error", err.Error())
		}
	}
}

// failsafe asks every other configured instance whether it still follows this primary
// in term; true only when all answer yes. A single-instance cluster has nobody to
// promote, so it needs nobody's confirmation.
func (a *Agent) failsafe(ctx context.Context, view LeaseView) bool {
	a.mu.Lock()
	running := a.proc != nil && a.role == agentapi.RolePrimary
	peers := a.peers()
	a.mu.Unlock()
	if !running {
		return false
	}
	if len(peers) == 0 {
		return true
	}
	fctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	answers := make(chan error, len(peers))
	for _, p := range peers {
		go func() {
			answers <- a.peerClient(p).Confirm(fctx, agentapi.ConfirmRequest{Primary: a.cfg.PodName, Term: view.Term})
		}()
	}
	ok := true
	for range peers {
		if err := <-answers; err != nil {
			ok = false
		}
	}
	return ok
}

// peers are the other configured instances.
func (a *Agent) peers() []string { return pgconf.OtherInstances(a.cluster, a.cfg.PodName) }

func (a *Agent) peerClient(pod string) *agentapi.Client {
	return agentapi.NewClient(a.cfg.PeerURL(pod), a.cfg.Credentials.PeerToken(), a.peerHTTP.For(a.cfg.PeerName(pod), "", a.cfg.TLS.Roots))
}

// Confirm implements agentapi.Instance: a standby confirms a primary that cannot reach
// the API server only while it streams from it, is not frozen, and its own view of the
// Lease names it in that term. The answer is given under the agent's lock, so a Freeze
// that returned has stopped every later confirmation.
func (a *Agent) Confirm(_ context.Context, req agentapi.ConfirmRequest) error {
	view := a.lease.View()
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.proc == nil || a.role != agentapi.RoleReplica:
		return fmt.Errorf("%w: postgres is %s, not a running standby", agentapi.ErrConflict, a.role)
	case a.frozen:
		return fmt.Errorf("%w: frozen for a failover", agentapi.ErrConflict)
	case a.upstream != req.Primary:
		return fmt.Errorf("%w: this standby follows %q", agentapi.ErrConflict, a.upstream)
	case view.Holder != req.Primary || view.Term != req.Term:
		return fmt.Errorf("%w: the Lease names %q in term %d", agentapi.ErrConflict, view.Holder, view.Term)
	}
	a.failsafeGiven = failsafeGiven{primary: req.Primary, term: req.Term, at: time.Now()}
	return nil
}

// failsafeGiven is a standby's last failsafe confirmation.
type failsafeGiven struct {
	primary string
	term    int32
	at      time.Time
}
