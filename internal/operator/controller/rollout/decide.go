// Package rollout applies a changed instance template to a cluster's pods. The
// StatefulSet uses the OnDelete strategy, so nothing restarts a pod by itself: this
// controller deletes outdated pods one at a time, replicas first, and the primary last:
// its agent hands the role over as it stops, the way it does when a node is drained.
package rollout

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Pod is one instance as the plan sees it.
type Pod struct {
	Name string
	// Revision is the pod's controller-revision-hash label.
	Revision string
	// Ready is the pod's Ready condition; Terminating a deletion in progress.
	Ready, Terminating bool
	// Ordinal is the StatefulSet ordinal.
	Ordinal int
	// Fenced: the user fenced the instance. Its postgres is stopped, so it is never
	// ready: it is restarted like a replica (and stays fenced), and never given the
	// primary's role.
	Fenced bool
}

// Action is what the plan says to do now.
type Action int

const (
	// Done — every pod runs the update revision (or there is none to apply).
	Done Action = iota
	// Wait — a pod is missing, starting or terminating; one at a time.
	Wait
	// DeleteReplica restarts an outdated replica (Target).
	DeleteReplica
	// HandOver restarts the primary (Target) once every other instance runs the update
	// revision: its agent hands the role over as it stops (docs/failover.md, "Handover"),
	// and the operator promotes the most advanced standby, an updated one.
	HandOver
	// DeletePrimary restarts the primary of a single-instance cluster: there is no
	// replica to hand the role to, so writes stop while it restarts.
	DeletePrimary
)

// Decision is an Action with its pod and a reason for people.
type Decision struct {
	Action Action
	Target string
	Reason string
}

// Decide decides the next step of a rollout of updateRevision over pods (replicas is the
// number the cluster wants; primary the Lease's holder).
func Decide(pods []Pod, replicas int, primary, updateRevision string) Decision {
	if updateRevision == "" {
		return Decision{Action: Done}
	}
	var outdated []Pod
	for _, p := range pods {
		if p.Revision != updateRevision {
			outdated = append(outdated, p)
		}
	}
	if len(outdated) == 0 {
		return Decision{Action: Done}
	}
	if primary == "" {
		// The role is moving: which pod is the primary decides the order.
		return Decision{Action: Wait, Reason: "the primary Lease names no holder"}
	}
	if len(pods) < replicas {
		return Decision{Action: Wait, Reason: fmt.Sprintf("%d of %d instances exist", len(pods), replicas)}
	}
	for _, p := range pods {
		if !p.Ready && !p.Fenced || p.Terminating {
			return Decision{Action: Wait, Reason: fmt.Sprintf("%s is not ready", p.Name)}
		}
	}
	// Replicas first, from the highest ordinal, like a StatefulSet's own rolling update.
	sort.Slice(outdated, func(i, j int) bool { return outdated[i].Ordinal > outdated[j].Ordinal })
	for _, p := range outdated {
		if p.Name != primary || p.Fenced {
			return Decision{Action: DeleteReplica, Target: p.Name,
				Reason: fmt.Sprintf("restarting replica %s with the new instance template", p.Name)}
		}
	}
	// Only the primary is left. Every replica runs the update revision now, so whichever
	// the operator promotes after the primary's handover is an updated one.
	var updated []string
	for _, p := range pods {
		if p.Name != primary && !p.Fenced {
			updated = append(updated, p.Name)
		}
	}
	if len(updated) == 0 {
		return Decision{Action: DeletePrimary, Target: primary,
			Reason: fmt.Sprintf("restarting %s, the only instance, with the new instance template: writes stop until it is back", primary)}
	}
	sort.Strings(updated)
	return Decision{Action: HandOver, Target: primary,
		Reason: fmt.Sprintf("restarting the primary %s with the new instance template: it hands its role over as it stops, to the most advanced of %s",
			primary, strings.Join(updated, ", "))}
}

// RouteSettle is how long after the primary role moved (the Lease's acquire time) no
// pod is deleted. The read-write Service routes by the role label, which the failover
// controller takes off the old primary as it hands over; every node's kube-proxy
// applies that change up to its minSyncPeriod (1 s by default) after the EndpointSlice
// reaches it. A pod deleted before then takes its IP away while some node still sends
// the Service's connections to it: they are dropped, not refused, and a client waits
// its whole connect timeout (make olm-e2e: a 4.3 s write gap, where the gap was 2.8 s
// when the old primary's pod outlived the routes to it). Refused, it tries again at
// once and reaches the new primary.
const RouteSettle = 2 * time.Second

// settleLeft is how long a pod deletion must still wait after the primary role moved
// at acquired (zero: none), as of now.
func settleLeft(acquired, now time.Time) time.Duration {
	if acquired.IsZero() {
		return 0
	}
	return max(0, acquired.Add(RouteSettle).Sub(now))
}

// Admission is how many clusters may roll at once: a new agent image after an operator
// upgrade changes every cluster's template at the same moment, and restarting them all
// together would put every primary's switchover in the same minute.
type Admission struct {
	// Max is the most clusters that roll at once; 0 is no limit.
	Max int
	// rolling are the clusters that began their rollout and have not finished it.
	rolling map[string]bool
}

// Admit says whether cluster may take a rollout step now. A cluster that began (it
// was admitted, or some of its pods run the new template already: an operator
// restarted in the middle) always may: a rollout is never left half done for the
// limit's sake. Another may while fewer than Max roll.
func (a *Admission) Admit(cluster string, begun bool) bool {
	if a.rolling == nil {
		a.rolling = map[string]bool{}
	}
	if a.rolling[cluster] || begun || a.Max <= 0 || len(a.rolling) < a.Max {
		a.rolling[cluster] = true
		return true
	}
	return false
}

// Done records that cluster has no rollout now.
func (a *Admission) Done(cluster string) { delete(a.rolling, cluster) }

// Rolling counts the clusters admitted and not done.
func (a *Admission) Rolling() int { return len(a.rolling) }

// Begun reports whether some pod already runs updateRevision while another does not.
func Begun(pods []Pod, updateRevision string) bool {
	updated, outdated := false, false
	for _, p := range pods {
		if p.Revision == updateRevision {
			updated = true
		} else {
			outdated = true
		}
	}
	return updated && outdated
}
