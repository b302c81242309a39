// Package failover promotes a replica when the primary fails: it observes every
// instance's agent, decides with a pure function, then fences the old primary, moves
// the primary Lease and asks the chosen replica's agent to promote.
package failover

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgpilot/pgpilot/internal/agentapi"
)

// Instance is one instance as the failover controller last observed it.
type Instance struct {
	Name string
	// Reachable is whether its agent answered /status.
	Reachable bool
	// Status is what its agent answered; valid when Reachable.
	Status agentapi.Status
}

// Input is everything a failover decision is made from.
type Input struct {
	// Holder is the primary Lease's holder.
	Holder string
	// Instances are every instance pod of the cluster.
	Instances []Instance
	// Enabled is spec.failover.enabled.
	Enabled bool
	// Delay is how long the primary must be failed before a failover.
	Delay time.Duration
	// SynchronousReplicas is spec.postgresql.synchronousReplicas.
	SynchronousReplicas int
	// SyncStandbys are the standbys the primary last reported in sync or quorum state;
	// nil when never observed.
	SyncStandbys []string
	// FailedSince is when the primary was first seen failed, zero if it was healthy at
	// the last observation.
	FailedSince time.Time
	Now         time.Time
}

// Action is what to do.
type Action int

const (
	// None: the primary is healthy, or there is nothing to act on.
	None Action = iota
	// Wait: the primary is failed but not for long enough yet.
	Wait
	// Promote: fence the holder and promote Target.
	Promote
	// Blocked: the primary is failed and no replica can safely take over.
	Blocked
)

func (a Action) String() string { return [...]string{"None", "Wait", "Promote", "Blocked"}[a] }

// Decision is the outcome, with the reason a user reads in events and conditions.
type Decision struct {
	Action Action
	Target string
	Reason string
	// FailedSince is what Input.FailedSince must be at the next decision.
	FailedSince time.Time
	// RequeueAfter is when to decide again at the latest.
	RequeueAfter time.Duration
}

// Decide chooses the failover action.
func Decide(in Input) Decision {
	if in.Holder == "" {
		return Decision{Action: None, Reason: "no primary has been designated yet"}
	}
	failure := primaryFailure(in)
	if failure == "" {
		return Decision{Action: None, Reason: fmt.Sprintf("the primary %s is healthy", in.Holder)}
	}
	since := in.FailedSince
	if since.IsZero() {
		since = in.Now
	}
	d := Decision{FailedSince: since}
	if !in.Enabled {
		d.Action, d.Reason = Blocked, fmt.Sprintf("%s; automatic failover is disabled (spec.failover.enabled)", failure)
		return d
	}
	if waited := in.Now.Sub(since); waited < in.Delay {
		d.Action, d.RequeueAfter = Wait, in.Delay-waited
		d.Reason = fmt.Sprintf("%s for %s; failing over after %s (spec.failover.delay)", failure, waited.Round(time.Millisecond), in.Delay)
		return d
	}
	target, why := chooseTarget(in)
	if target == "" {
		d.Action, d.Reason = Blocked, fmt.Sprintf("%s; no failover: %s", failure, why)
		return d
	}
	d.Action, d.Target = Promote, target
	d.Reason = fmt.Sprintf("%s for %s; promoting %s, %s", failure, in.Now.Sub(since).Round(time.Millisecond), target, why)
	return d
}

// primaryFailure says what is wrong with the holder, "" when it is a healthy primary.
func primaryFailure(in Input) string {
	for _, i := range in.Instances {
		if i.Name != in.Holder {
			continue
		}
		switch {
		case !i.Reachable:
			return fmt.Sprintf("the primary %s's agent does not answer", i.Name)
		case i.Status.Role == agentapi.RolePrimary && i.Status.Ready:
			return ""
		case i.Status.Role == agentapi.RoleStarting:
			// Initialising, recovering or bootstrapping: not a failure of a running primary.
			return ""
		default:
			msg := fmt.Sprintf("the primary %s is %s and not ready", i.Name, i.Status.Role)
			if i.Status.Error != "" {
				msg += " (" + i.Status.Error + ")"
			}
			return msg
		}
	}
	return fmt.Sprintf("the primary %s has no pod", in.Holder)
}

// chooseTarget picks the replica with the most WAL (received, then replayed, then the
// lower name). In synchronous mode only a standby of the synchronous set qualifies, and
// only when enough of that set answers: with ANY k over n standbys an acknowledged
// commit is on at least k of them, so n-k+1 must be compared to be sure one has it.
func chooseTarget(in Input) (string, string) {
	var candidates []Instance
	for _, i := range in.Instances {
		if i.Name == in.Holder || !i.Reachable || i.Status.Role != agentapi.RoleReplica || !i.Status.Running {
			continue
		}
		if _, err := agentapi.ParseLSN(i.Status.ReceivedLSN); err != nil {
			continue
		}
		candidates = append(candidates, i)
	}
	if in.SynchronousReplicas > 0 {
		members := in.SyncStandbys
		if members == nil {
			for _, i := range in.Instances {
				if i.Name != in.Holder {
					members = append(members, i.Name)
				}
			}
		}
		k := min(in.SynchronousReplicas, len(members))
		need := len(members) - k + 1
		var answering []Instance
		for _, c := range candidates {
			if slices.Contains(members, c.Name) {
				answering = append(answering, c)
			}
		}
		if len(answering) < need {
			return "", fmt.Sprintf("synchronous mode needs %d of the synchronous standbys [%s] to compare, to be sure no acknowledged write is lost, and %d answer",
				need, strings.Join(members, ", "), len(answering))
		}
		candidates = answering
	}
	if len(candidates) == 0 {
		return "", "no replica is running and answering"
	}
	best := slices.MaxFunc(candidates, func(a, b Instance) int {
		ra, _ := agentapi.ParseLSN(a.Status.ReceivedLSN)
		rb, _ := agentapi.ParseLSN(b.Status.ReceivedLSN)
		if ra != rb {
			return compare(ra, rb)
		}
		pa, _ := agentapi.ParseLSN(a.Status.ReplayedLSN)
		pb, _ := agentapi.ParseLSN(b.Status.ReplayedLSN)
		if pa != pb {
			return compare(pa, pb)
		}
		return strings.Compare(b.Name, a.Name) // the lower name wins a tie
	})
	return best.Name, fmt.Sprintf("the replica with the most WAL (received %s)", best.Status.ReceivedLSN)
}

func compare(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// MaxSwitchoverLag is how far behind the primary a switchover target may be: a replica
// further behind would make writes wait while it catches up.
const MaxSwitchoverLag = 16 << 20

// CheckSwitchover says why target cannot take over from a healthy holder now, "" when
// it can.
func CheckSwitchover(holder, target string, instances []Instance) string {
	if target == holder {
		return fmt.Sprintf("%s is already the primary", target)
	}
	var primary, candidate *Instance
	for i := range instances {
		switch instances[i].Name {
		case holder:
			primary = &instances[i]
		case target:
			candidate = &instances[i]
		}
	}
	switch {
	case candidate == nil:
		return fmt.Sprintf("%s is not an instance of this cluster", target)
	case primary == nil || !primary.Reachable || primary.Status.Role != agentapi.RolePrimary || !primary.Status.Ready:
		return fmt.Sprintf("the primary %s is not healthy; a failover, not a switchover, will replace it", holder)
	case !candidate.Reachable:
		return fmt.Sprintf("%s's agent does not answer", target)
	case candidate.Status.Role != agentapi.RoleReplica || !candidate.Status.Ready:
		return fmt.Sprintf("%s is %s, not a ready replica", target, candidate.Status.Role)
	}
	write, err1 := agentapi.ParseLSN(primary.Status.WriteLSN)
	received, err2 := agentapi.ParseLSN(candidate.Status.ReceivedLSN)
	if err1 != nil || err2 != nil {
		return fmt.Sprintf("cannot compare %s's WAL position with the primary's", target)
	}
	if write > received && write-received > MaxSwitchoverLag {
		return fmt.Sprintf("%s is %d bytes behind the primary (at most %d for a switchover)", target, write-received, MaxSwitchoverLag)
	}
	return ""
}
