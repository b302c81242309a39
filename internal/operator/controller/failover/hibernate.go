package failover

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// Hibernation's fixed times (docs/operations.md, "Hibernation").
const (
	// StopCatchUp is how long a stopping cluster waits for its running standbys to
	// receive the stopped primary's final WAL before its pods go anyway: a standby
	// that lacks some catches up from the same primary when the cluster resumes.
	StopCatchUp = 30 * time.Second
	// StopTimeout is how long a stopping cluster waits for its primary to report a
	// clean stop before its pods go anyway: the primary's agent stops it cleanly at the
	// pod's SIGTERM too, keeping the Lease.
	StopTimeout = time.Minute
	// ResumeTimeout is how long a resuming cluster waits for its primary to be back
	// before the failover rules apply to it again.
	ResumeTimeout = 5 * time.Minute
)

// HibernationInput is what a hibernation step is decided from. The Lease names a
// holder (a vacant Lease is the failover rules' business first).
type HibernationInput struct {
	// Stopped is spec.stopped.
	Stopped   bool
	Lease     primarylease.Record
	Instances []Instance
	Now       time.Time
}

// HibernationDecision is a hibernation step.
type HibernationDecision struct {
	// Write: record Next on the Lease (nil removes the record).
	Write bool
	Next  *primarylease.Hibernation
	// Active: the hibernation holds the cluster, and no failover, switchover or
	// scale-down may run (the holder is meant to be down).
	Active bool
	// Event is the reason of the event that says what was written (Warning when
	// Warning), Reason its message; a decision to wait only has a Reason.
	Event   string
	Warning bool
	Reason  string
	// RequeueAfter is when to decide again at the latest (0: the poll period).
	RequeueAfter time.Duration
}

// DecideHibernation takes spec.stopped one step (docs/operations.md, "Hibernation"):
//
//	running ─stopped─▶ stopping ─primary stopped, standbys have its final WAL─▶ stopped
//	   ▲                  │                                                        │
//	   └─primary back── resuming ◀──────────────── not stopped ────────────────────┘
//
// The primary keeps the Lease throughout: resuming starts the same primary, and
// nothing is promoted while the record holds it down.
func DecideHibernation(in HibernationInput) HibernationDecision {
	rec, h := in.Lease, in.Lease.Hibernation
	current := h != nil && h.Holder == rec.Holder && h.Term == rec.Term
	switch {
	case in.Stopped && (!current || h.Phase == primarylease.Resuming):
		return HibernationDecision{Write: true, Active: true, Event: dbv1.ReasonStopping,
			Next:   &primarylease.Hibernation{Phase: primarylease.Stopping, Holder: rec.Holder, Term: rec.Term, Since: metav1.NewTime(in.Now)},
			Reason: fmt.Sprintf("Stopping the cluster (spec.stopped): the primary %s stops first and keeps its role, then every pod goes", rec.Holder)}
	case in.Stopped && h.Phase == primarylease.Stopping:
		return decideStopping(in, *h)
	case in.Stopped:
		return HibernationDecision{Active: true, Reason: fmt.Sprintf("stopped; %s resumes as the primary", h.Holder)}
	case h == nil:
		return HibernationDecision{}
	case !current:
		// A record of another holder or term: the Lease moved on (a resume that timed
		// out into a failover). It holds nothing any more.
		return HibernationDecision{Write: true, Reason: "the hibernation record names another primary or term"}
	case h.Phase != primarylease.Resuming:
		next := *h
		next.Phase, next.Since = primarylease.Resuming, metav1.NewTime(in.Now)
		return HibernationDecision{Write: true, Next: &next, Active: true, Event: dbv1.ReasonResuming,
			Reason: fmt.Sprintf("Resuming the cluster: %s starts again as the primary, the replicas follow it", h.Holder)}
	}
	return decideResuming(in, *h)
}

// decideStopping waits for the holder to stop cleanly and for the running standbys to
// have its final WAL, then lets the pods go.
func decideStopping(in HibernationInput, h primarylease.Hibernation) HibernationDecision {
	wait := HibernationDecision{Active: true, RequeueAfter: 200 * time.Millisecond}
	waited := in.Now.Sub(h.Since.Time)
	final, timeline, stopped := stoppedAt(find(in.Instances, h.Holder), h.Term)
	next := h
	next.Phase, next.Since = primarylease.Stopped, metav1.NewTime(in.Now)
	done := HibernationDecision{Write: true, Next: &next, Active: true, Event: dbv1.ReasonStopped}
	if !stopped {
		if waited < StopTimeout {
			wait.Reason = fmt.Sprintf("waiting for the primary %s to stop", h.Holder)
			return wait
		}
		done.Warning = true
		done.Reason = fmt.Sprintf("The primary %s did not report a clean stop within %s; every pod goes now, and its agent stops postgres cleanly at the pod's termination, keeping its role", h.Holder, StopTimeout)
		return done
	}
	next.FinalLSN, next.Timeline = agentapi.FormatLSN(final), timeline
	lacking := lackingFinalWAL(in.Instances, in.Lease, h.Holder, final, timeline)
	if len(lacking) > 0 && waited < StopCatchUp {
		wait.Reason = fmt.Sprintf("the primary %s stopped at %s; waiting for %s to receive its final WAL", h.Holder, next.FinalLSN, strings.Join(lacking, ", "))
		return wait
	}
	done.Reason = fmt.Sprintf("Stopped: the primary %s stopped at %s (timeline %d) and keeps its role; every running standby has its final WAL", h.Holder, next.FinalLSN, timeline)
	if len(lacking) > 0 {
		done.Warning = true
		done.Reason = fmt.Sprintf("Stopped: the primary %s stopped at %s (timeline %d) and keeps its role; %s did not receive its final WAL within %s and catches up when the cluster resumes",
			h.Holder, next.FinalLSN, timeline, strings.Join(lacking, ", "), StopCatchUp)
	}
	return done
}

// stoppedAt is where a stopped holder's WAL ends: its clean stop in term when its agent
// reports one, else the last checkpoint of its data directory (an agent restarted
// since). ok is false while its postgres runs or its agent does not answer.
func stoppedAt(holder *Instance, term int32) (final uint64, timeline int64, ok bool) {
	if holder == nil || !holder.Reachable || holder.Status.Running {
		return 0, 0, false
	}
	st := holder.Status
	if h := st.Handover; h != nil && h.Term == term && h.Clean {
		final, _ = agentapi.ParseLSN(h.FinalLSN)
		return final, h.Timeline, true
	}
	final, _ = agentapi.ParseLSN(st.Position)
	return final, st.Timeline, true
}

// lackingFinalWAL are the running standbys (not fenced) that have not received final
// on timeline.
func lackingFinalWAL(instances []Instance, rec primarylease.Record, holder string, final uint64, timeline int64) []string {
	var lacking []string
	for _, s := range standbys(instances, holder, false) {
		if rec.IsFenced(s.Name) {
			continue
		}
		if s.Status.Timeline != timeline || position(s) < final {
			lacking = append(lacking, s.Name)
		}
	}
	slices.Sort(lacking)
	return lacking
}

// decideResuming removes the record once the holder serves as the primary again, or,
// after ResumeTimeout, hands the cluster back to the failover rules.
func decideResuming(in HibernationInput, h primarylease.Hibernation) HibernationDecision {
	holder := find(in.Instances, h.Holder)
	if holder != nil && holder.Reachable && holder.Status.Role == agentapi.RolePrimary && holder.Status.Ready {
		return HibernationDecision{Write: true, Event: dbv1.ReasonResumed,
			Reason: fmt.Sprintf("Resumed: %s is the primary again, %s after the cluster was asked to resume", h.Holder, in.Now.Sub(h.Since.Time).Round(time.Second))}
	}
	if waited := in.Now.Sub(h.Since.Time); waited >= ResumeTimeout {
		return HibernationDecision{Write: true, Event: dbv1.ReasonResumed, Warning: true,
			Reason: fmt.Sprintf("The primary %s is not back as the primary %s after the cluster was asked to resume; the failover rules apply again", h.Holder, ResumeTimeout)}
	}
	return HibernationDecision{Active: true, RequeueAfter: time.Second, Reason: fmt.Sprintf("resuming: waiting for %s to start as the primary", h.Holder)}
}

// hibernate takes spec.stopped one step for a Lease that names a holder, and reports
// whether the hibernation holds the cluster (no failover, switchover or scale-down
// then) and when to come back.
func (c *cycle) hibernate(ctx context.Context, rec primarylease.Record) (bool, time.Duration, error) {
	d := DecideHibernation(HibernationInput{Stopped: c.cluster.Spec.Stopped, Lease: rec, Instances: c.instances, Now: c.r.clock.Now()})
	if d.Write {
		l, err := c.apply(ctx, primarylease.SetHibernation(rec.Holder, rec.Term, d.Next))
		if err != nil {
			return true, 0, fmt.Errorf("recording the hibernation on the primary Lease: %w", err)
		}
		c.lease = l
		phase := "removed"
		if d.Next != nil {
			phase = d.Next.Phase
		}
		c.log("Hibernation", "phase", phase, "primary", rec.Holder, "reason", d.Reason)
		if d.Event != "" {
			kind := corev1.EventTypeNormal
			if d.Warning {
				kind = corev1.EventTypeWarning
			}
			c.r.recorder.Event(c.cluster, kind, d.Event, d.Reason)
		}
	}
	if d.Active && c.cluster.Annotations[dbv1.AnnotationSwitchoverTo] != "" {
		c.r.recorder.Eventf(c.cluster, corev1.EventTypeWarning, dbv1.ReasonSwitchoverRefused, "Switchover to %s refused: the cluster is stopping, stopped or resuming (spec.stopped)",
			c.cluster.Annotations[dbv1.AnnotationSwitchoverTo])
		return true, 0, c.clearSwitchover(ctx)
	}
	return d.Active, d.RequeueAfter, nil
}
