package failover

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/operator/switchover"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// FencingInput is what the user's fencing is decided from. The Lease names a holder.
type FencingInput struct {
	// Requested is the cluster's db.example.com/fenced-instances annotation.
	Requested string
	Lease     primarylease.Record
	Instances []Instance
	// Cluster is the cluster's name and Replicas its spec.replicas.
	Cluster  string
	Replicas int
}

// FencingDecision is what the Lease records as fenced, and what has to happen first.
type FencingDecision struct {
	// Fenced is what the Lease must record, sorted.
	Fenced []string
	// SwitchoverTo is the instance the fenced primary hands over to first; Waiting
	// says why it cannot yet, when no instance can take over.
	SwitchoverTo string
	Waiting      string
	// Ignored are requested names that are no instance of the cluster.
	Ignored []string
}

// DecideFencing reads the user's fencing (docs/operations.md, "Fencing"): every
// instance named, or all of them for "*". A fenced standby is recorded at once, and its
// agent stops postgres. The primary is recorded only when every instance is fenced:
// otherwise it hands over first, by a switchover to the most advanced instance that is
// not fenced, and is recorded once it no longer holds the Lease.
func DecideFencing(in FencingInput) FencingDecision {
	var d FencingDecision
	instances := instanceNames(in)
	want, ignored := parseFencing(in.Requested, instances)
	d.Ignored = ignored
	holder := in.Lease.Holder
	others := slices.ContainsFunc(instances, func(i string) bool { return !want[i] })
	if want[holder] && others {
		delete(want, holder)
		d.SwitchoverTo, d.Waiting = fenceTarget(in, want)
	}
	for name := range want {
		d.Fenced = append(d.Fenced, name)
	}
	slices.Sort(d.Fenced)
	return d
}

// parseFencing reads the annotation's names, or "*" for every instance: the instances
// named, and the names that are no instance.
func parseFencing(requested string, instances []string) (map[string]bool, []string) {
	want := map[string]bool{}
	var ignored []string
	for _, name := range strings.Split(requested, ",") {
		switch name = strings.TrimSpace(name); {
		case name == "":
		case name == "*":
			for _, i := range instances {
				want[i] = true
			}
		case slices.Contains(instances, name):
			want[name] = true
		default:
			ignored = append(ignored, name)
		}
	}
	return want, ignored
}

// RequestedFencing is every instance the annotation fences, sorted: the primary too,
// which DecideFencing records only after it handed over.
func RequestedFencing(in FencingInput) []string {
	want, _ := parseFencing(in.Requested, instanceNames(in))
	return slices.Sorted(maps.Keys(want))
}

// instanceNames are the cluster's instances: spec.replicas of them, and any pod beyond.
func instanceNames(in FencingInput) []string {
	n := dbv1.NamesOf(in.Cluster)
	var names []string
	for i := range in.Replicas {
		names = append(names, n.Instance(i))
	}
	for _, i := range in.Instances {
		if _, ok := n.Ordinal(i.Name); ok && !slices.Contains(names, i.Name) {
			names = append(names, i.Name)
		}
	}
	return names
}

// fenceTarget is the instance a fenced primary switches over to: the most advanced of
// those not fenced that CheckSwitchover accepts; or why there is none.
func fenceTarget(in FencingInput, fenced map[string]bool) (string, string) {
	var best *Instance
	var why []string
	for i := range in.Instances {
		c := &in.Instances[i]
		if c.Name == in.Lease.Holder || fenced[c.Name] {
			continue
		}
		if reason := switchover.Check(in.Lease.Holder, c.Name, in.Instances); reason != "" {
			why = append(why, reason)
			continue
		}
		if best == nil || position(*c) > position(*best) {
			best = c
		}
	}
	if best != nil {
		return best.Name, ""
	}
	reason := fmt.Sprintf("the primary %s is fenced and hands over first, but no instance that is not fenced can take over yet", in.Lease.Holder)
	if len(why) > 0 {
		reason += ": " + strings.Join(why, "; ")
	}
	return "", reason
}

// heldBy says why the holder is down on purpose, "" when it is not: the user fenced it
// (with every other instance), or the cluster hibernates. No failover replaces it.
func heldBy(rec primarylease.Record) string {
	switch {
	case rec.IsFenced(rec.Holder):
		return fmt.Sprintf("the primary %s is fenced (%s): no failover replaces it; unfence it to resume writes", rec.Holder, dbv1.AnnotationFencedInstances)
	case rec.Hibernation.Holds(rec.Holder, rec.Term):
		return fmt.Sprintf("the cluster is stopped (spec.stopped): %s keeps the primary role", rec.Holder)
	}
	return ""
}

// notFenced drops the instances the Lease records as fenced, and those the user fences
// (requested): they take no part in an election.
func notFenced(instances []Instance, rec primarylease.Record, requested []string) []Instance {
	var out []Instance
	for _, i := range instances {
		if !rec.IsFenced(i.Name) && !slices.Contains(requested, i.Name) {
			out = append(out, i)
		}
	}
	return out
}

// fence records the user's fencing on the Lease, for a Lease that names a holder; a
// fenced primary is first asked to switch over, through the annotation a user would
// set (RequestSwitchover).
func (c *cycle) fence(ctx context.Context, rec primarylease.Record) error {
	d := DecideFencing(FencingInput{Requested: c.cluster.Annotations[dbv1.AnnotationFencedInstances], Lease: rec,
		Instances: c.instances, Cluster: c.cluster.Name, Replicas: int(c.cluster.Spec.Replicas)})
	if !slices.Equal(d.Fenced, rec.Fenced) {
		l, err := c.apply(ctx, primarylease.SetFenced(rec.Holder, rec.Term, d.Fenced))
		if err != nil {
			return fmt.Errorf("recording the fenced instances on the primary Lease: %w", err)
		}
		c.lease = l
		for _, pod := range d.Fenced {
			if !rec.IsFenced(pod) {
				c.log("Fenced an instance", "pod", pod)
				c.r.recorder.Eventf(c.cluster, corev1.EventTypeNormal, dbv1.ReasonFenced,
					"%s is fenced (%s): its postgres stops and stays stopped, out of the Services and of every election", pod, dbv1.AnnotationFencedInstances)
			}
		}
		for _, pod := range rec.Fenced {
			if !slices.Contains(d.Fenced, pod) {
				c.log("Unfenced an instance", "pod", pod)
			}
		}
	}
	c.reportFencing(d)
	if d.SwitchoverTo != "" && c.cluster.Annotations[dbv1.AnnotationSwitchoverTo] == "" {
		c.log("Switching over before fencing the primary", "from", rec.Holder, "to", d.SwitchoverTo)
		c.r.recorder.Eventf(c.cluster, corev1.EventTypeNormal, dbv1.ReasonFenceWaiting, "The primary %s is fenced: switching over to %s first", rec.Holder, d.SwitchoverTo)
		return client.IgnoreNotFound(switchover.Request(ctx, c.r.client, c.cluster, d.SwitchoverTo))
	}
	return nil
}

// reportFencing says, once per distinct message, why the user's fencing cannot be
// carried out as asked: names that are no instance, a primary that cannot hand over yet.
func (c *cycle) reportFencing(d FencingDecision) {
	var notes []string
	reason := dbv1.ReasonFenceIgnored
	if len(d.Ignored) > 0 {
		notes = append(notes, fmt.Sprintf("%s names no instance of this cluster: %s", dbv1.AnnotationFencedInstances, strings.Join(d.Ignored, ", ")))
	}
	if d.Waiting != "" {
		notes, reason = append(notes, d.Waiting), dbv1.ReasonFenceWaiting
	}
	c.reportOnce(&c.mem.fenceNote, reason, strings.Join(notes, "; "), "Fencing held")
}
