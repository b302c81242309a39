// Package failover keeps one writer per cluster (docs/failover.md): it observes every
// instance's agent, decides with pure functions, and revokes, fences, freezes, moves the
// primary Lease and promotes; it is also the one writer of the pods' role labels.
package failover

import (
	"fmt"
	"slices"
	"strings"
	"time"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/fleet"
	"github.com/pgpilot/pgpilot/internal/operator/switchover"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// Instance is one instance as the controller last observed it.
type Instance = fleet.Instance

// Fixed times of the protocol (docs/failover.md).
const (
	// HandoverTimeout is how long a clean handover waits for a standby with the final
	// WAL, or for the old primary to come back, before the failover rules apply.
	HandoverTimeout = 30 * time.Second
	// SwitchoverCatchUp is how long a switchover waits for its target to receive the
	// demoted primary's final WAL before it gives the Lease back.
	SwitchoverCatchUp = 10 * time.Second
	// CrashLoop is how many crashes within a minute make a primary failed at once.
	CrashLoop = 3
	// RenewingWithin: a holder whose renewal was seen this recently is alive, even when
	// its agent does not answer the operator (twice the renewal interval).
	RenewingWithin = 2 * primarylease.RenewInterval
	// PromotionGrace is how long a primary may take to be ready after it became primary
	// in the Lease's term (promoted, or started as the first primary) before that counts
	// as a failure. It confirms its Lease with a renewal, starts its commit gate and has
	// postgres load the pg_hba.conf that lets clients in: a write to the API server and
	// new sessions, which a loaded node makes slow (over 3 s on a CI machine running
	// three clusters' tests at once, where spec.failover.delay, counted from the first
	// sight of the new primary not ready, warned of a failure in a planned switchover).
	// Failing over then would move the same steps to another instance, onto one more
	// timeline.
	PromotionGrace = 10 * time.Second
)

// Input is everything a decision is made from.
type Input struct {
	Lease     primarylease.Record
	Instances []Instance
	// Source is the host a replica cluster's designated primary follows
	// (spec.replica); "" for a cluster of its own.
	Source string
	// Enabled is spec.failover.enabled.
	Enabled bool
	// Delay is how long the primary must be failed before it is replaced.
	Delay time.Duration
	// StartTimeout is how long a primary restarting after a crash may take, in
	// asynchronous mode.
	StartTimeout time.Duration
	// SynchronousReplicas is spec.postgresql.synchronousReplicas.
	SynchronousReplicas int
	// Switchover is the requested switchover target, "" when none.
	Switchover string
	// Fenced are the instances the user fences now (the cluster's
	// db.example.com/fenced-instances, RequestedFencing): they take no part in an
	// election even before the Lease records them (a Lease rebuilt after a deletion, or
	// a primary lost before its fencing was recorded).
	Fenced []string
	// Cluster is the cluster's name and Replicas its spec.replicas: an instance whose
	// ordinal is Replicas or more is being scaled away. Replicas 0 is unknown.
	Cluster  string
	Replicas int
	// FailedSince is when the holder was first seen failed; zero if it was healthy at
	// the last observation. FailedHolder and FailedTerm are the holder and term it was
	// seen failed in: the failure counts only while the Lease still names that holder in
	// that term.
	FailedSince  time.Time
	FailedHolder string
	FailedTerm   int32
	// RenewSeen is when the controller last saw the holder renew the Lease (or started
	// watching it, when it never saw a renewal).
	RenewSeen time.Time
	// RenewObserved is true when RenewSeen is a renewal the controller saw happen, not
	// the moment it first read the Lease.
	RenewObserved bool
	// VacantSince is when the controller first saw the Lease name no holder.
	VacantSince time.Time
	Now         time.Time
}

// Action is what to do.
type Action int

const (
	// None — the primary is healthy, or there is nothing to act on.
	None Action = iota
	// Wait — come back after RequeueAfter.
	Wait
	// Blocked — no replica can safely take over; Reason says why.
	Blocked
	// Revoke the Lease from the failed holder.
	Revoke
	// Demote the holder for a switchover to Target.
	Demote
	// RefuseSwitchover — the switchover to Target cannot happen; Reason says why.
	RefuseSwitchover
	// Move the Lease to Target, a standby.
	Move
	// GiveBack the Lease to Target, the instance that last held it.
	GiveBack
	// ScaleDown — request a switchover to Target, an instance that stays, before a
	// scale-down removes the primary's pod; with no Target, wait (Reason says for what).
	ScaleDown
)

func (a Action) String() string {
	return [...]string{"None", "Wait", "Blocked", "Revoke", "Demote", "RefuseSwitchover", "Move", "GiveBack", "ScaleDown"}[a]
}

// Decision is the outcome, with the reason a user reads in events and conditions.
type Decision struct {
	Action Action
	Target string
	Reason string
	// FailedSince is what Input.FailedSince must be at the next decision, for the
	// Lease's holder and term it was decided on (Input.FailedHolder, FailedTerm).
	FailedSince time.Time
	// RequeueAfter is when to decide again at the latest (0: the poll period).
	RequeueAfter time.Duration
	// Lost says, when a Move may lose acknowledged commits (asynchronous mode after a
	// crash), why; "" when it cannot.
	Lost string
	// Settling, with Wait: the holder is a primary within PromotionGrace of becoming
	// one, not yet ready, or a switchover's target is receiving the final WAL within
	// SwitchoverCatchUp; a wait for either is no failure to warn of.
	Settling bool
}

// Decide decides for a Lease that names a holder: nothing, a switchover, or revoking a
// failed holder's Lease.
func Decide(in Input) Decision {
	if in.Lease.Holder == "" {
		return DecideVacant(in)
	}
	if !in.Lease.Bootstrapped {
		return Decision{Action: None, Reason: "the cluster's first primary is not up yet"}
	}
	if held := heldBy(in.Lease); held != "" {
		if in.Switchover != "" {
			return Decision{Action: RefuseSwitchover, Target: in.Switchover, Reason: held}
		}
		return Decision{Action: None, Reason: held}
	}
	failure := primaryFailure(in)
	if failure == "" {
		if in.Switchover != "" && in.Source != "" {
			return Decision{Action: RefuseSwitchover, Target: in.Switchover, Reason: fmt.Sprintf(
				"a replica cluster has no primary to hand over: its designated primary %s moves only when it fails; promote the cluster first (spec.replica.enabled: false)", in.Lease.Holder)}
		}
		if in.Switchover != "" {
			if in.Lease.IsFenced(in.Switchover) {
				return Decision{Action: RefuseSwitchover, Target: in.Switchover, Reason: fmt.Sprintf("%s is fenced (%s)", in.Switchover, dbv1.AnnotationFencedInstances)}
			}
			if why := switchover.Check(in.Lease.Holder, in.Switchover, in.Instances); why != "" {
				return Decision{Action: RefuseSwitchover, Target: in.Switchover, Reason: why}
			}
			return Decision{Action: Demote, Target: in.Switchover, Reason: fmt.Sprintf("switchover to %s requested", in.Switchover)}
		}
		if leaving(in, in.Lease.Holder) {
			return scaleDown(in)
		}
		return Decision{Action: None, Reason: fmt.Sprintf("the primary %s is healthy", in.Lease.Holder)}
	}
	since := in.FailedSince
	if in.FailedHolder != in.Lease.Holder || in.FailedTerm != in.Lease.Term {
		// Another holder's failure, or this one's in a term it no longer holds: the Lease
		// changed hands since, by a writer other than this controller's move (another
		// operator, a recreated Lease, a Move whose success this controller did not
		// see). A primary just promoted is not ready for a moment: counted from its
		// predecessor's failure it would be revoked at once, and the cluster fail over
		// again onto one more timeline.
		since = time.Time{}
	}
	if since.IsZero() {
		since = in.Now
	}
	// A crash loop is seen as one only at its CrashLoop-th crash, but the primary has
	// been failing since its first: the delay counts from there. Likewise a holder that
	// neither answers nor renews is seen as failed only RenewingWithin after its last
	// renewal, but has been failing since its next renewal was due (make chaos, freeze
	// and network-cut: the delay counted from the detection, 2 to 3 s after the last
	// renewal, and put the failover at 9 s; I2's wait, T + margin after that renewal,
	// still bounds it from below).
	if i := find(in.Instances, in.Lease.Holder); i != nil && i.Reachable && i.Status.RecentCrashes >= CrashLoop {
		if first := in.Now.Add(-time.Duration(i.Status.FirstRecentCrashMillisAgo) * time.Millisecond); first.Before(since) {
			since = first
		}
	} else if i != nil && !i.Reachable && in.RenewObserved {
		if due := in.RenewSeen.Add(primarylease.RenewInterval); due.Before(since) {
			since = due
		}
	}
	patience, delay := in.Delay, "spec.failover.delay"
	at, promoting := promotedAt(in)
	if promoting {
		// Counted from when it became primary, for PromotionGrace at least.
		since = at
		if PromotionGrace > patience {
			patience, delay = PromotionGrace, "a new primary's first seconds"
		}
	}
	d := Decision{FailedSince: since}
	if !in.Enabled {
		d.Action, d.Reason = Blocked, fmt.Sprintf("%s; automatic failover is disabled (spec.failover.enabled)", failure)
		return d
	}
	if waited := in.Now.Sub(since); waited < patience {
		d.Action, d.RequeueAfter, d.Settling = Wait, patience-waited, promoting
		d.Reason = fmt.Sprintf("%s for %s; failing over after %s (%s)", failure, waited.Round(time.Millisecond), patience, delay)
		return d
	}
	// Revoking cuts the old primary off for good: only when some standby could take
	// over, judged by who answers now (their final positions come after the freeze).
	if why := unfit(in); why != "" {
		d.Action, d.Reason = Blocked, fmt.Sprintf("%s; no failover: %s", failure, why)
		return d
	}
	d.Action = Revoke
	d.Reason = fmt.Sprintf("%s for %s", failure, in.Now.Sub(since).Round(time.Millisecond))
	return d
}

// promotedAt is when the holder became primary in the Lease's term, when that was less
// than PromotionGrace ago and it has not been ready since (in no crash loop, which is a
// failure at once); false otherwise. A primary that was ready once and is not any more
// has failed like any other.
func promotedAt(in Input) (time.Time, bool) {
	i := find(in.Instances, in.Lease.Holder)
	if i == nil || i.Pod == nil || !i.Reachable || i.Terminating {
		return time.Time{}, false
	}
	st := i.Status
	if st.Role != agentapi.RolePrimary || st.Ready || st.Term != in.Lease.Term || st.RecentCrashes >= CrashLoop {
		return time.Time{}, false
	}
	promoting := time.Duration(st.PromotingForMillis) * time.Millisecond
	if promoting <= 0 || promoting >= PromotionGrace {
		return time.Time{}, false
	}
	return in.Now.Add(-promoting), true
}

// primaryFailure says what is wrong with the holder, "" when nothing that calls for a
// failover.
func primaryFailure(in Input) string {
	h := in.Lease.Holder
	i := find(in.Instances, h)
	switch {
	case i == nil || i.Pod == nil:
		return fmt.Sprintf("the primary %s has no pod", h)
	case !i.Reachable && in.Now.Sub(in.RenewSeen) <= RenewingWithin:
		// Its agent renews the Lease: alive and confirmed, only slow to answer us (a
		// loaded node) or cut off from the operator alone. Not a reason to fail over.
		return ""
	case !i.Reachable:
		return fmt.Sprintf("the primary %s's agent does not answer and has not renewed the Lease for %s", h,
			in.Now.Sub(in.RenewSeen).Round(100*time.Millisecond))
	case i.Terminating:
		return "" // its agent hands over and releases the Lease
	}
	st := i.Status
	// Three crashes within a minute is a crash loop, even when the last restart is up
	// for a moment: a primary that flaps would otherwise look healthy whenever an
	// observation caught it between crashes (make chaos, crash-loop: once restarts got
	// fast enough to reach ready, a minute of no writes until startTimeout). A handover
	// in progress (gate draining) or a standby being promoted is left alone.
	if st.RecentCrashes >= CrashLoop && st.Role != agentapi.RoleReplica && st.Gate != agentapi.GateDraining {
		return withError(fmt.Sprintf("the primary %s crashed %d times within a minute", h, st.RecentCrashes), st.Error)
	}
	switch st.Role {
	case agentapi.RolePrimary:
		if st.Ready || st.Gate == agentapi.GateDraining {
			return "" // healthy, or handing over: its agent releases the Lease
		}
		return withError(fmt.Sprintf("the primary %s is not ready (commit gate %s)", h, st.Gate), st.Error)
	case agentapi.RoleReplica:
		return "" // promoting
	case agentapi.RoleUpgrading:
		// Its agent runs pg_upgrade and starts postgres again on the old major or the
		// new, within its own bound; its standbys have the old major's final WAL, and
		// stay the way back if its pod dies (then it no longer answers).
		return ""
	case agentapi.RoleFenced:
		return fmt.Sprintf("the primary %s is fenced", h)
	}
	// Stopped or starting.
	down := time.Duration(st.DownForMillis) * time.Millisecond
	switch {
	case in.SynchronousReplicas > 0 && in.Source == "":
		// A synchronous standby has every acknowledged commit: nothing to wait for. A
		// replica cluster's designated primary acknowledges nothing; restarting (a
		// demotion, say), it is given startTimeout as an asynchronous primary is.
		return withError(fmt.Sprintf("the primary %s is %s", h, st.Role), st.Error)
	case down > in.StartTimeout:
		return withError(fmt.Sprintf("the primary %s has been %s for %s, longer than spec.failover.startTimeout", h, st.Role, down.Round(time.Second)), st.Error)
	}
	return ""
}

func withError(msg, err string) string {
	if err != "" {
		return msg + " (" + err + ")"
	}
	return msg
}

func find(instances []Instance, name string) *Instance {
	for i := range instances {
		if instances[i].Name == name {
			return &instances[i]
		}
	}
	return nil
}

// unfit says why no standby could take over even in the best case, "" when one could.
func unfit(in Input) string {
	var running []Instance
	for _, i := range notFenced(in.Instances, in.Lease, in.Fenced) {
		if i.Name != in.Lease.Holder && i.Reachable && !i.Terminating && i.Status.Running && i.Status.Role == agentapi.RoleReplica {
			running = append(running, i)
		}
	}
	if len(running) == 0 {
		return "no replica is running and answering"
	}
	// Positions are not final yet: ask only whether enough members answer.
	if _, why := syncFrontier(in.Lease.Sync, running, true); why != "" {
		return why
	}
	return ""
}

// DecideVacant decides for a Lease that names no holder: wait until the old primary
// cannot acknowledge anything (I2), then choose among the frozen standbys (I3), or give
// the Lease back to the old primary.
func DecideVacant(in Input) Decision {
	h := in.Lease.Handover
	if h == nil {
		h = &primarylease.Handover{}
	}
	if until, why := unsafeUntil(in, h); !until.IsZero() {
		return Decision{Action: Wait, RequeueAfter: until.Sub(in.Now), Reason: why}
	}
	old := find(in.Instances, h.From)
	oldBack := old != nil && old.Reachable && !old.Terminating && old.Pod != nil
	candidates := finalStandbys(notFenced(in.Instances, in.Lease, in.Fenced), h)
	waited := in.Now.Sub(in.VacantSince)

	if h.Clean {
		final, _ := agentapi.ParseLSN(h.FinalLSN)
		var having []Instance
		for _, c := range candidates {
			if c.Status.Timeline == h.Timeline && position(c) >= final {
				having = append(having, c)
			}
		}
		if in.Switchover != "" && h.From != in.Switchover {
			if t := find(having, in.Switchover); t != nil {
				return Decision{Action: Move, Target: t.Name, Reason: fmt.Sprintf("switchover from %s: %s has its final WAL (%s)", h.From, t.Name, h.FinalLSN)}
			}
			if waited < SwitchoverCatchUp {
				// A step of the switchover, with its own bound: no failure to warn of.
				return Decision{Action: Wait, RequeueAfter: 100 * time.Millisecond, Settling: true,
					Reason: fmt.Sprintf("switchover: waiting for %s to receive %s's final WAL (%s)", in.Switchover, h.From, h.FinalLSN)}
			}
			if oldBack {
				return Decision{Action: GiveBack, Target: h.From, Reason: fmt.Sprintf("switchover aborted: %s did not receive %s's final WAL (%s) within %s", in.Switchover, h.From, h.FinalLSN, SwitchoverCatchUp)}
			}
		}
		if len(having) > 0 {
			best := mostAdvanced(having)
			return Decision{Action: Move, Target: best.Name, Reason: fmt.Sprintf("%s stopped and handed over (%s); %s has its final WAL (%s)", h.From, h.Reason, best.Name, h.FinalLSN)}
		}
		if oldBack {
			return Decision{Action: GiveBack, Target: h.From, Reason: fmt.Sprintf("no standby has %s's final WAL (%s); it is back and takes the Lease again", h.From, h.FinalLSN)}
		}
		if waited < HandoverTimeout {
			return Decision{Action: Wait, RequeueAfter: 200 * time.Millisecond,
				Reason: fmt.Sprintf("waiting for a standby with %s's final WAL (%s), or for %s to come back", h.From, h.FinalLSN, h.From)}
		}
	}
	if len(candidates) == 0 {
		if oldBack {
			return Decision{Action: GiveBack, Target: h.From, Reason: fmt.Sprintf("no standby can take over; %s is back", h.From)}
		}
		return Decision{Action: Blocked, Reason: fmt.Sprintf("the Lease names no primary (%s left it: %s) and no frozen standby answers", orUnknown(h.From), h.Reason)}
	}
	required, why := syncFrontier(in.Lease.Sync, candidates, false)
	if why != "" {
		if oldBack {
			return Decision{Action: GiveBack, Target: h.From, Reason: fmt.Sprintf("%s; %s is back", why, h.From)}
		}
		return Decision{Action: Blocked, Reason: why}
	}
	best := mostAdvanced(candidates)
	if position(best) < required {
		return Decision{Action: Blocked, Reason: fmt.Sprintf("synchronous mode: no standby has every acknowledged commit (%s needed, %s is at %s)",
			agentapi.FormatLSN(required), best.Name, best.Status.Position)}
	}
	if in.Switchover != "" && in.Switchover != best.Name {
		if t := find(candidates, in.Switchover); t != nil && position(*t) >= position(best) {
			best = *t
		}
	}
	d := Decision{Action: Move, Target: best.Name, Reason: fmt.Sprintf("%s left the Lease (%s); %s has the most WAL (%s, timeline %d)",
		orUnknown(h.From), h.Reason, best.Name, best.Status.Position, best.Status.Timeline)}
	if in.Lease.Sync == nil || in.Lease.Sync.K == 0 {
		d.Lost = "asynchronous replication: commits the old primary had not sent are lost"
	}
	return d
}

func orUnknown(s string) string {
	if s == "" {
		return "an unknown primary"
	}
	return s
}

// unsafeUntil is, while the old primary may still acknowledge a commit (I2), when that
// ends at the latest, and why; zero when it cannot.
func unsafeUntil(in Input, h *primarylease.Handover) (time.Time, string) {
	if h.Released {
		return time.Time{}, "" // it stopped before it released the Lease
	}
	if old := find(in.Instances, h.From); old != nil && old.Reachable && !old.Status.Running && (old.Status.Fenced || old.Status.Term > h.Term) {
		return time.Time{}, "" // its agent says postgres is down and stays down
	}
	until := in.RenewSeen.Add(primarylease.Duration + primarylease.Margin)
	reason := fmt.Sprintf("waiting until %s cannot acknowledge commits: T + margin after its last renewal", orUnknown(h.From))
	if fs := failsafeUntil(in, h); fs.After(until) {
		until = fs
		reason = fmt.Sprintf("waiting until %s cannot acknowledge commits: T + margin after the last failsafe confirmation of a frozen standby", orUnknown(h.From))
	}
	if !until.After(in.Now) {
		return time.Time{}, ""
	}
	return until, reason
}

// failsafeUntil bounds the old primary's failsafe confirmations: a round succeeded
// only when every other instance confirmed it after the round began, so no round began
// after the latest confirmation a frozen standby gave it in its term (frozen, it gives
// no more). Zero when none gave one.
func failsafeUntil(in Input, h *primarylease.Handover) time.Time {
	var latest time.Time
	for _, c := range frozenStandbys(in.Instances, h.From) {
		fc := c.Status.FailsafeConfirmed
		if fc == nil || fc.Primary != h.From || fc.Term != h.Term {
			continue
		}
		if at := in.Now.Add(-time.Duration(fc.AgoMillis) * time.Millisecond); at.After(latest) {
			latest = at
		}
	}
	if latest.IsZero() {
		return time.Time{}
	}
	return latest.Add(primarylease.Duration + primarylease.Margin)
}

// finalStandbys are the standbys whose position is final. After a clean handover that
// is every running standby: the old primary stopped and released the Lease, so no
// more WAL comes from anywhere and none needs freezing (I3 holds already). Otherwise
// only frozen ones.
func finalStandbys(instances []Instance, h *primarylease.Handover) []Instance {
	if h.CleanRelease() {
		return standbys(instances, h.From, false)
	}
	return standbys(instances, h.From, true)
}

// NeedsFreeze says whether the standbys must be frozen before a target is chosen: not
// after a clean handover (see finalStandbys).
func NeedsFreeze(h *primarylease.Handover) bool { return !h.CleanRelease() }

// frozenStandbys are the standbys whose position is final because they were frozen.
func frozenStandbys(instances []Instance, except string) []Instance {
	return standbys(instances, except, true)
}

// standbys are the running standbys but except, answering and staying (not being
// deleted), frozen ones only when frozen is set.
func standbys(instances []Instance, except string, frozen bool) []Instance {
	var out []Instance
	for _, i := range instances {
		if i.Name != except && i.Reachable && !i.Terminating && i.Status.Running && i.Status.Role == agentapi.RoleReplica && (i.Status.Frozen || !frozen) {
			if _, err := agentapi.ParseLSN(i.Status.Position); err == nil {
				out = append(out, i)
			}
		}
	}
	return out
}

func position(i Instance) uint64 {
	p, _ := agentapi.ParseLSN(i.Status.Position)
	return p
}

// mostAdvanced is the candidate with the highest timeline, then position, then the
// lower name.
func mostAdvanced(candidates []Instance) Instance {
	return slices.MaxFunc(candidates, func(a, b Instance) int {
		if a.Status.Timeline != b.Status.Timeline {
			return compare(uint64(a.Status.Timeline), uint64(b.Status.Timeline))
		}
		if c := compare(position(a), position(b)); c != 0 {
			return c
		}
		return strings.Compare(b.Name, a.Name)
	})
}

// infinite stands for the frontier of a member that cannot be compared.
const infinite = ^uint64(0)

// syncFrontier is the position a target must have to hold every acknowledged commit:
// the k-th highest of the members' frontiers (a compared member's position, an
// uncompared one's bound, or infinite). With reachability only (positions not final),
// it only checks that the frontier is finite. An error says why no target can be safe.
func syncFrontier(set *primarylease.SyncSet, candidates []Instance, reachabilityOnly bool) (uint64, string) {
	if set == nil || set.K == 0 {
		return 0, ""
	}
	var frontiers []uint64
	var unknown []string
	for name, bound := range set.Members {
		f := infinite
		if c := find(candidates, name); c != nil {
			f = position(*c)
		}
		if bound != "" {
			if b, err := agentapi.ParseLSN(bound); err == nil && b < f {
				f = b
			}
		}
		if f == infinite {
			unknown = append(unknown, name)
		}
		frontiers = append(frontiers, f)
	}
	if len(frontiers) < set.K {
		return 0, fmt.Sprintf("synchronous mode: the synchronous set records %d standbys for %d synchronous replicas", len(frontiers), set.K)
	}
	slices.Sort(frontiers)
	slices.Reverse(frontiers)
	kth := frontiers[set.K-1]
	if kth == infinite {
		slices.Sort(unknown)
		return 0, fmt.Sprintf("synchronous mode: every acknowledged commit is on %d of [%s]; %s cannot be compared, so no standby is proven to have them all",
			set.K, strings.Join(sortedMembers(set), ", "), strings.Join(unknown, ", "))
	}
	if reachabilityOnly {
		return 0, ""
	}
	return kth, ""
}

func sortedMembers(set *primarylease.SyncSet) []string {
	var out []string
	for m := range set.Members {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
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

// leaving is whether pod is being scaled away: its ordinal is spec.replicas or more.
func leaving(in Input, pod string) bool {
	ordinal, ok := dbv1.NamesOf(in.Cluster).Ordinal(pod)
	return in.Replicas > 0 && ok && ordinal >= in.Replicas
}

// scaleDown chooses the instance a healthy primary that is being scaled away hands
// over to: the most advanced of the instances that stay and that CheckSwitchover
// accepts, the lowest ordinal first among equals. The StatefulSet keeps the primary's
// pod until then (plan.Replicas), so a scale-down costs one switchover, never a
// failover, and never a chain of handovers through instances that are leaving too.
func scaleDown(in Input) Decision {
	var best *Instance
	var bestAt uint64
	var why []string
	for i := range in.Instances {
		c := &in.Instances[i]
		if leaving(in, c.Name) || c.Name == in.Lease.Holder || in.Lease.IsFenced(c.Name) {
			continue
		}
		if reason := switchover.Check(in.Lease.Holder, c.Name, in.Instances); reason != "" {
			why = append(why, reason)
			continue
		}
		at, _ := agentapi.ParseLSN(c.Status.Position)
		if best == nil || at > bestAt {
			best, bestAt = c, at
		}
	}
	if best == nil {
		reason := fmt.Sprintf("spec.replicas %d removes the primary %s, and no instance that stays can take over yet", in.Replicas, in.Lease.Holder)
		if len(why) > 0 {
			reason += ": " + strings.Join(why, "; ")
		}
		return Decision{Action: ScaleDown, Reason: reason}
	}
	return Decision{Action: ScaleDown, Target: best.Name,
		Reason: fmt.Sprintf("spec.replicas %d removes the primary %s: switching over to %s first", in.Replicas, in.Lease.Holder, best.Name)}
}

// Settled reports whether a cluster may be asked less often than every PollPeriod: its
// Lease names a bootstrapped holder that nothing holds (hibernation, fencing), the
// decision was to do nothing, and every one of its want instances answered, ready, in
// the role the Lease gives it: the holder a primary confirmed in the Lease's term whose
// crash count is zero, the others standbys streaming from it, none frozen, upgrading or
// being deleted, none reporting an error. Anything else, and the cluster is asked every
// PollPeriod until it is settled again.
//
// A settled cluster is asked every QuietPeriod; what makes it unsettled in between
// reaches the controller sooner by a watch: a pod's change (deleted, not ready, a new
// address), a change of the Lease's holder, term or annotations, a change of the
// cluster, and a renewal of the holder that does not come (the renewal watchdog, which
// wakes the cluster RenewingWithin after the last renewal seen: a primary that died
// neither answers nor renews, and is then found failed as before).
func Settled(lease primarylease.Record, d Decision, instances []Instance, want int, source string) bool {
	return Unsettled(lease, d, instances, want, source) == ""
}

// Why a cluster is not settled: the reason label of
// pgpilot_failover_unsettled_cycles_total, the first that applies.
const (
	UnsettledLease       = "lease"       // no holder yet, not bootstrapped, hibernating or fencing
	UnsettledDeciding    = "deciding"    // the decision was to act
	UnsettledInstances   = "instances"   // fewer or more instances than spec.replicas
	UnsettledPod         = "pod"         // a pod missing or being deleted
	UnsettledUnreachable = "unreachable" // an agent did not answer
	UnsettledNotReady    = "not-ready"   // postgres not running or not ready, or restarting after crashes
	UnsettledAgent       = "agent"       // an agent reports an error, a freeze, a fence or an upgrade
	UnsettledTerm        = "term"        // an instance is in another term than the Lease's
	UnsettledPrimary     = "primary"     // the holder is not an acknowledging primary confirmed in its term
	UnsettledStandby     = "standby"     // a standby is not streaming healthily from the holder
	UnsettledRenewal     = "renewal"     // the holder answered but its renewal was not seen within RenewingWithin
	UnsettledError       = "error"       // the cycle failed
)

// Unsettled returns why the cluster is not Settled (one of the Unsettled reasons), or
// "" when it is. In a replica cluster (source set) the holder is settled as a standby
// streaming healthily from the source.
func Unsettled(lease primarylease.Record, d Decision, instances []Instance, want int, source string) string {
	switch {
	case lease.Holder == "" || !lease.Bootstrapped || lease.Hibernation != nil || len(lease.Fenced) > 0:
		return UnsettledLease
	case d.Action != None:
		return UnsettledDeciding
	case len(instances) != want:
		return UnsettledInstances
	}
	for _, in := range instances {
		st := in.Status
		switch {
		case in.Pod == nil || in.Terminating:
			return UnsettledPod
		case !in.Reachable:
			return UnsettledUnreachable
		case !st.Running || !st.Ready || st.RecentCrashes > 0:
			return UnsettledNotReady
		case st.Error != "" || st.Frozen || st.Fenced || st.Upgrade != nil:
			return UnsettledAgent
		case st.Term != lease.Term:
			return UnsettledTerm
		}
		switch {
		case in.Name == lease.Holder && source != "":
			if !streamsFrom(st, source) {
				return UnsettledPrimary
			}
		case in.Name == lease.Holder:
			if st.Role != agentapi.RolePrimary || st.Gate != agentapi.GateAcking || st.Confirmation == nil || !st.Confirmation.Valid {
				return UnsettledPrimary
			}
		case !streamsFrom(st, lease.Holder):
			return UnsettledStandby
		}
	}
	return ""
}

// streamsFrom reports whether st is a standby streaming healthily from upstream.
func streamsFrom(st agentapi.Status, upstream string) bool {
	return st.Role == agentapi.RoleReplica && st.Receiver != nil && st.Receiver.State == agentapi.ReceiverStreaming &&
		st.Receiver.Healthy && st.Receiver.Upstream == upstream
}
