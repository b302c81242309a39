package agent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// syncGrace is how long a standby of the synchronous rule may be away before the
// primary takes it out, so that a standby that is down does not block a failover.
const syncGrace = 5 * time.Second

// syncState is a primary's synchronous rule and its record on the Lease. The record is
// always a superset of every rule in force since the Lease last moved: a standby is
// recorded before it enters the rule, and leaves the record only as a bound, after it
// left the rule (docs/failover.md).
type syncState struct {
	// rule is the standbys in synchronous_standby_names after the gate.
	rule []string
	// record is what the next renewal writes.
	record primarylease.SyncSet
	// streamed is when each standby was last seen streaming.
	streamed map[string]time.Time
	// unbound are standbys taken out of the rule whose bound is still to be recorded.
	unbound []string
}

// initSync sets the rule a new primary starts with: the members the Lease records as in
// the rule, when it recorded them for this k, else every other configured instance.
func (a *Agent) initSync(rec *primarylease.SyncSet) {
	k := a.cluster.SynchronousReplicas
	peers := a.peers()
	var rule []string
	if rec != nil && rec.K == k {
		for _, p := range peers {
			if bound, ok := rec.Members[p]; ok && bound == "" {
				rule = append(rule, p)
			}
		}
	} else {
		rule = peers
	}
	if k == 0 {
		rule = nil
	}
	now := time.Now()
	s := syncState{rule: rule, record: primarylease.SyncSet{K: k, Members: map[string]string{}}, streamed: map[string]time.Time{}}
	if rec != nil {
		maps.Copy(s.record.Members, rec.Members)
	}
	for _, m := range rule {
		s.record.Members[m] = ""
		s.streamed[m] = now
	}
	a.mu.Lock()
	a.sync = s
	a.mu.Unlock()
}

// syncRecordForRenewal is the record the next renewal writes.
func (a *Agent) syncRecordForRenewal() *primarylease.SyncSet {
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := primarylease.SyncSet{K: a.sync.record.K, Members: maps.Clone(a.sync.record.Members)}
	return &rec
}

// syncRule is the standbys of the rule now.
func (a *Agent) syncRule() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.sync.rule)
}

// desiredRule is the rule a primary wants: every configured standby that streams or
// streamed within syncGrace, never fewer than k while any can be kept.
func desiredRule(k int, peers, current []string, streaming map[string]bool, streamed map[string]time.Time, now time.Time) []string {
	if k == 0 {
		return nil
	}
	var want []string
	for _, p := range peers {
		if streaming[p] || now.Sub(streamed[p]) < syncGrace {
			want = append(want, p)
		}
	}
	// Keep the most recently streaming members of the current rule up to k: commits
	// wait either way, and a shorter rule would not make any commit safer.
	rest := slices.DeleteFunc(slices.Clone(current), func(m string) bool {
		return slices.Contains(want, m) || !slices.Contains(peers, m)
	})
	slices.SortStableFunc(rest, func(x, y string) int { return streamed[y].Compare(streamed[x]) })
	for _, m := range rest {
		if len(want) >= k {
			break
		}
		want = append(want, m)
	}
	slices.SortFunc(want, func(x, y string) int { return slices.Index(peers, x) - slices.Index(peers, y) })
	return want
}

// maintainSync keeps the primary's synchronous rule to its standbys: one that streams
// enters it (recorded on the Lease first), one away for syncGrace or no longer
// configured leaves it (the rule first, its bound recorded at the next step).
func (a *Agent) maintainSync(ctx context.Context) error {
	k := a.cluster.SynchronousReplicas
	a.mu.Lock()
	s := &a.sync
	if s.streamed == nil {
		s.streamed = map[string]time.Time{}
	}
	pending := slices.Clone(s.unbound)
	a.mu.Unlock()
	if len(pending) > 0 {
		flushed, err := a.db.FlushLSN(ctx)
		if err != nil {
			return err
		}
		a.mu.Lock()
		for _, m := range pending {
			s.record.Members[m] = flushed
		}
		s.unbound = nil
		a.mu.Unlock()
		a.kickLease()
	}
	streaming, err := a.db.StreamingStandbys(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	a.mu.Lock()
	for m := range streaming {
		s.streamed[m] = now
	}
	current := slices.Clone(s.rule)
	want := desiredRule(k, a.peers(), current, streaming, s.streamed, now)
	a.mu.Unlock()
	if slices.Equal(want, current) && s.record.K == k {
		return nil
	}
	added := slices.DeleteFunc(slices.Clone(want), func(m string) bool { return slices.Contains(current, m) })
	if len(added) > 0 || s.record.K != k {
		// Recorded before postgres may count its acknowledgements.
		next := a.syncRecordForRenewal()
		next.K = k
		for _, m := range added {
			next.Members[m] = ""
		}
		view := a.lease.View()
		// Bounded as a renewal is: an API server that does not answer must not hold up
		// the agent's steps (a Lease that moved on, seen later, means a step down).
		rctx, cancel := context.WithTimeout(ctx, renewTimeout)
		err := a.lease.Apply(rctx, primarylease.Renew(a.cfg.PodName, view.Term, next))
		cancel()
		if err != nil {
			return fmt.Errorf("recording the synchronous set before changing it: %w", err)
		}
		a.mu.Lock()
		s.record = *next
		a.mu.Unlock()
	}
	if err := a.applyRule(ctx, want, pgconf.AsPrimary, ""); err != nil {
		return err
	}
	removed := slices.DeleteFunc(current, func(m string) bool { return slices.Contains(want, m) })
	a.mu.Lock()
	s.unbound = append(s.unbound, removed...)
	a.mu.Unlock()
	a.log.Info("Changed the synchronous rule", "k", k, "standbys", want, "added", added, "removed", removed)
	return nil
}

// applyRule writes the rule into postgresql.conf (of a primary, or of a standby of
// upstream about to be promoted), reloads, and checks that a new session sees it: from
// then on every walsender postgres starts uses it.
func (a *Agent) applyRule(ctx context.Context, rule []string, as pgconf.Role, upstream string) error {
	a.mu.Lock()
	a.sync.rule = slices.Clone(rule)
	a.mu.Unlock()
	in := a.confInput(as, upstream)
	in.SyncRule = rule
	want := pgconf.SynchronousStandbyNames(in.Cluster.SynchronousReplicas, rule)
	if got, err := a.db.Setting(ctx, "synchronous_standby_names"); err == nil && got == want {
		// In force already (a standby carries the rule it would have as primary): a
		// promotion need not wait for a reload.
		return nil
	}
	if err := a.writeConfig(in); err != nil {
		return err
	}
	if err := a.db.Reload(ctx); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := a.db.Setting(ctx, "synchronous_standby_names")
		if err == nil && got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not take the synchronous rule %q (it has %q, %v)", want, got, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
