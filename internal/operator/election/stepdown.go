package election

import (
	"context"
	"time"

	"github.com/go-logr/logr"
)

// StepDown is a runnable of the leader that ends its leadership when it has been cut
// off from every agent for After: it reaches the API server (it still renews its
// election Lease) but no agent of any cluster answers it, while their kubelets report
// them ready. Such a leader can fail no primary over; the standby replica, on another
// node, likely can (docs/failover.md, O6). Stop ends the process's manager, which
// releases the election Lease, so the standby takes over at its next try; the
// container starts again as a standby.
//
// A leader steps down only if an agent answered it since it was elected: one that
// never reached any agent has no reason to believe the cut is its own (a network
// fault of every node, a policy that drops the operator's traffic to the only
// cluster's pods), and its successor would fare no better; without this rule
// leadership would change hands, and a container restart, every few seconds. And it
// steps down only once it has led for MinTenure. By O1, a change of leader never
// risks data; it only costs the time to take over.
type StepDown struct {
	// CutOff is how long, at now, every question to a ready agent has gone unanswered
	// (fleet.Reach.CutOff).
	CutOff func(now time.Time) time.Duration
	// Answered is when an agent last answered this process (fleet.Reach.Answered).
	Answered  func() time.Time
	After     time.Duration
	MinTenure time.Duration
	// Period is how often CutOff is read.
	Period time.Duration
	// Stop ends the manager.
	Stop func()
	Log  logr.Logger
}

// NeedLeaderElection is true: only a leader steps down.
func (*StepDown) NeedLeaderElection() bool { return true }

// Start watches from the moment this replica is elected until the context ends or it
// steps down.
func (s *StepDown) Start(ctx context.Context) error {
	elected := time.Now()
	tick := time.NewTicker(s.Period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			if !s.due(elected, now) {
				continue
			}
			s.Log.Info("Stepping down: no agent answers this replica while their pods are ready and the API server answers; the standby replica takes over",
				"cutOffFor", s.CutOff(now).Round(100*time.Millisecond).String(), "ledFor", now.Sub(elected).Round(time.Second).String())
			s.Stop()
			return nil
		}
	}
}

// due reports whether a leader elected at elected steps down at now.
func (s *StepDown) due(elected, now time.Time) bool {
	return now.Sub(elected) >= s.MinTenure && s.CutOff(now) >= s.After && s.Answered().After(elected)
}
