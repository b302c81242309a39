// Package restart applies the settings that PostgreSQL takes only at a restart
// (shared_buffers, max_connections, ...): each agent reports which of its settings wait
// for one, and this controller restarts the standbys in place one at a time, then moves
// the primary's role to a restarted standby by a switchover, so that the old primary
// comes back as a standby with a new postmaster. A primary is never restarted under its
// clients, except the only instance of a cluster, which has nobody to hand over to.
package restart

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/pgpilot/pgpilot/internal/operator/fleet"
	"github.com/pgpilot/pgpilot/internal/operator/switchover"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Instance is one instance as the plan sees it.
type Instance struct {
	Name    string
	Ordinal int
	// Reachable: its agent answered; Status is what it said.
	Reachable bool
	Status    agentapi.Status
	// Terminating: its pod is being deleted. Outdated: its pod does not run the
	// StatefulSet's update revision, so a rolling update will restart it anyway.
	Terminating, Outdated bool
}

// Input is everything a decision is made from.
type Input struct {
	// Instances are the instances that have a pod.
	Instances []Instance
	// Replicas is the number of instances the cluster wants.
	Replicas int
	// Primary is the primary Lease's holder.
	Primary string
	// Switchover is the switchover requested on the cluster, "" when none.
	Switchover string
	// Fenced are the instances the user fenced: stopped, they take their settings at
	// their next start, and take no part in the plan.
	Fenced []string
}

// Action is what the plan says to do now.
type Action int

const (
	// Done — no instance reports a setting waiting for a restart.
	Done Action = iota
	// Wait — something must settle first (an instance not ready or not streaming, a
	// switchover or rolling update under way).
	Wait
	// Blocked — the pending settings cannot be applied replicas first.
	Blocked
	// RestartStandby restarts the standby Target in place.
	RestartStandby
	// Switchover moves the primary's role to Target, a restarted standby.
	Switchover
	// RestartPrimary restarts Target, the only instance, in place.
	RestartPrimary
)

func (a Action) String() string {
	return [...]string{"Done", "Wait", "Blocked", "RestartStandby", "Switchover", "RestartPrimary"}[a]
}

// Decision is an Action with its instance and a reason for people; Pending says what
// waits for a restart, "" when nothing does.
type Decision struct {
	Action  Action
	Target  string
	Reason  string
	Pending string
}

// atLeastPrimarys are the settings a standby must have at least as high as the
// primary it replays WAL from: PostgreSQL refuses to start a hot standby with less
// ("insufficient parameter settings"), and pauses recovery when the primary raises one
// past it.
var atLeastPrimarys = []string{"max_connections", "max_worker_processes", "max_wal_senders", "max_prepared_transactions", "max_locks_per_transaction"}

// Decide decides the next step towards every instance running with its configured
// settings: standbys first, from the highest ordinal, each only once every instance is
// ready and every standby streams (so the one restarted before is back); then a
// switchover to a restarted standby; the only instance of a cluster is restarted in
// place.
func Decide(in Input) Decision {
	pending := Pending(in.Instances, in.Primary)
	if pending == "" {
		return Decision{Action: Done, Reason: "no setting waits for a restart"}
	}
	d := next(in)
	d.Pending = pending
	return d
}

func next(in Input) Decision {
	in = withoutFenced(in)
	if why := rejected(in.Instances); why != "" {
		return Decision{Action: Blocked, Reason: why}
	}
	// A single instance has no standby to keep at least its values.
	if why := lowered(in.Instances); why != "" && in.Replicas > 1 {
		return Decision{Action: Blocked, Reason: why}
	}
	if why := unsettled(in); why != "" {
		return Decision{Action: Wait, Reason: why}
	}
	standbys := slices.DeleteFunc(slices.Clone(in.Instances), func(i Instance) bool { return i.Name == in.Primary })
	sort.Slice(standbys, func(i, j int) bool { return standbys[i].Ordinal > standbys[j].Ordinal })
	for _, s := range standbys {
		if len(s.Status.PendingRestart) > 0 {
			return Decision{Action: RestartStandby, Target: s.Name, Reason: fmt.Sprintf("restarting standby %s in place to apply %s", s.Name, names(s))}
		}
	}
	primary := find(in.Instances, in.Primary)
	if len(standbys) == 0 {
		return Decision{Action: RestartPrimary, Target: primary.Name,
			Reason: fmt.Sprintf("restarting %s, the only instance, in place to apply %s: writes stop until it is back", primary.Name, names(*primary))}
	}
	target := standbys[len(standbys)-1] // the lowest ordinal
	// The failover controller's own check: never ask for a switchover it would refuse.
	if why := switchover.Check(primary.Name, target.Name, asFleet(in.Instances)); why != "" {
		return Decision{Action: Wait, Reason: "the switchover to " + target.Name + " waits: " + why}
	}
	return Decision{Action: Switchover, Target: target.Name,
		Reason: fmt.Sprintf("switching over from %s to %s, which runs with the new settings, so that %s restarts as a standby to apply %s", primary.Name, target.Name, primary.Name, names(*primary))}
}

// unsettled says why no instance may be restarted now, "" when one may.
// withoutFenced is in without the fenced instances, which it counts as none of the
// instances it waits for.
func withoutFenced(in Input) Input {
	kept := slices.DeleteFunc(slices.Clone(in.Instances), func(i Instance) bool { return slices.Contains(in.Fenced, i.Name) })
	in.Replicas -= len(in.Instances) - len(kept)
	in.Instances = kept
	return in
}

func unsettled(in Input) string {
	if in.Switchover != "" {
		return fmt.Sprintf("a switchover to %s is under way", in.Switchover)
	}
	if len(in.Instances) < in.Replicas {
		return fmt.Sprintf("%d of %d instances exist", len(in.Instances), in.Replicas)
	}
	for _, i := range in.Instances {
		switch {
		case i.Outdated:
			return fmt.Sprintf("a rolling update of the instance template is under way (%s is outdated): it restarts every instance anyway", i.Name)
		case !i.Reachable || i.Terminating || !i.Status.Ready:
			return fmt.Sprintf("%s is not ready", i.Name)
		}
	}
	// Which settings wait for a restart is measured by each agent against the settings
	// it has taken: one that has not taken the change yet reports nothing pending, and
	// would look like an instance already running with the new settings.
	var first *Instance
	for k := range in.Instances {
		switch i := &in.Instances[k]; {
		case i.Status.ParametersHash == "": // an agent that does not say
		case first == nil:
			first = i
		case i.Status.ParametersHash != first.Status.ParametersHash:
			return fmt.Sprintf("the instances have not all taken the same settings yet (%s and %s differ)", first.Name, i.Name)
		}
	}
	primary := find(in.Instances, in.Primary)
	if primary == nil || primary.Status.Role != agentapi.RolePrimary {
		return fmt.Sprintf("the primary %q is not running as primary", in.Primary)
	}
	for _, i := range in.Instances {
		if i.Name != in.Primary && !streams(primary.Status, i.Name) {
			return fmt.Sprintf("%s does not stream from the primary %s yet", i.Name, primary.Name)
		}
	}
	return ""
}

func streams(primary agentapi.Status, standby string) bool {
	return slices.ContainsFunc(primary.Replicas, func(r agentapi.ReplicaStatus) bool {
		return r.Name == standby && r.State == "streaming"
	})
}

// rejected says which instance cannot use its settings, "" when every one can: postgres
// rejects them and would not start again, or they do not fit its memory, so no instance
// is restarted with them until they are fixed.
func rejected(instances []Instance) string {
	for _, i := range instances {
		if i.Status.ConfigRejected != "" {
			return fmt.Sprintf("%s cannot use its settings (%s), so no instance was restarted; fix spec.postgresql.parameters",
				i.Name, i.Status.ConfigRejected)
		}
	}
	return ""
}

// lowered says which setting of atLeastPrimarys an instance would restart with lower
// than it runs with now, "" when none: replicas first, a restarted standby would have
// less than its primary and could not start, so nothing is restarted.
func lowered(instances []Instance) string {
	for _, i := range instances {
		for _, p := range i.Status.PendingRestart {
			if !slices.Contains(atLeastPrimarys, p.Name) {
				continue
			}
			now, err1 := strconv.Atoi(p.Value)
			next, err2 := strconv.Atoi(p.Pending)
			if err1 == nil && err2 == nil && next < now {
				return fmt.Sprintf("%s is lowered from %d to %d on %s: a standby must run with at least the primary's %s, so it cannot be applied standbys first and no instance was restarted; "+
					"set it back to %d, or see docs/operations.md (\"Changing settings\") for how to lower it", p.Name, now, next, i.Name, p.Name, now)
			}
		}
	}
	return ""
}

// Pending says which settings wait for a restart on which instances, "" when none do:
// "shared_buffers (128MB → 160MB) waiting for a restart on c-0 (primary), c-1".
func Pending(instances []Instance, primary string) string {
	settings := map[string]string{}
	var waiting []string
	for _, i := range instances {
		if !i.Reachable || len(i.Status.PendingRestart) == 0 {
			continue
		}
		name := i.Name
		if i.Name == primary {
			name += " (primary)"
		}
		waiting = append(waiting, name)
		for _, p := range i.Status.PendingRestart {
			settings[p.Name] = fmt.Sprintf("%s (%s → %s)", p.Name, p.Value, p.Pending)
		}
	}
	if len(waiting) == 0 {
		return ""
	}
	var list []string
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		list = append(list, settings[k])
	}
	slices.Sort(waiting)
	return fmt.Sprintf("%s waiting for a restart on %s", strings.Join(list, ", "), strings.Join(waiting, ", "))
}

func names(i Instance) string {
	var out []string
	for _, p := range i.Status.PendingRestart {
		out = append(out, p.Name)
	}
	return strings.Join(out, ", ")
}

func asFleet(instances []Instance) []fleet.Instance {
	out := make([]fleet.Instance, len(instances))
	for k, i := range instances {
		out[k] = fleet.Instance{Name: i.Name, Reachable: i.Reachable, Status: i.Status, Terminating: i.Terminating}
	}
	return out
}

func find(instances []Instance, name string) *Instance {
	for k := range instances {
		if instances[k].Name == name {
			return &instances[k]
		}
	}
	return nil
}
