package agent

import (
	"fmt"

	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Observation is everything one step of the agent decides from: the Lease as last seen
// and the instance as it is. It is read under the agent's lock, then decided on
// without it.
type Observation struct {
	// Me is this instance's pod name.
	Me   string
	View LeaseView
	// Running: the postmaster is up.
	Running bool
	// pgconf.Role is the agentapi role the agent gave postgres.
	Role string
	// pgconf.Upstream is the primary a running standby streams from; "" when frozen.
	Upstream string
	// FencedTerm is the term in which the instance was fenced (stopped on request or
	// after a handover); it stays down while the Lease names it in that term.
	Fenced     bool
	FencedTerm int32
	// FrozenTerm is the term in which a standby was frozen; it stays frozen until the
	// Lease names a holder in a later term.
	Frozen     bool
	FrozenTerm int32
	// Data is what the data directory holds; read only when postgres is not running.
	Data postgres.DataState
	// Source is the host of the cluster this replica cluster follows
	// (clusterconfig.Config.Following); "" when it follows none.
	Source string
}

// Act is what a step does.
type Act int

const (
	// Idle — nothing to do now.
	Idle Act = iota
	// KeepPrimary — a running primary the Lease names; keep its slots and synchronous rule.
	KeepPrimary
	// KeepStandby — a running standby that follows the right primary, or stays frozen.
	KeepStandby
	// StartPrimary — initialise, restore or start postgres as the primary.
	StartPrimary
	// StartStandby — clone, rewind or start postgres as a standby of Target ("" starts it
	// frozen: no upstream).
	StartStandby
	// Promote the running standby.
	Promote
	// Follow — point the running standby at Target.
	Follow
	// Freeze — stop the running standby's WAL receiver.
	Freeze
	// StepDown — a running primary the Lease no longer names stops (and later rejoins).
	StepDown
	// Stop — the Lease keeps this instance down (fenced, or the holder of a hibernating
	// cluster): postgres stops cleanly, and a holder keeps the Lease.
	Stop
	// Demote — the running primary of a cluster made a replica cluster stops cleanly,
	// keeping the Lease, and follows Target, the source.
	Demote
)

func (a Act) String() string {
	return [...]string{"Idle", "KeepPrimary", "KeepStandby", "StartPrimary", "StartStandby", "Promote", "Follow", "Freeze", "StepDown", "Stop", "Demote"}[a]
}

// Decision is an Act with its target and why.
type Decision struct {
	Act    Act
	Target string
	Reason string
}

// Decide is the agent's step, as a pure function of what it observed
// (docs/failover.md). The holder's agent runs the primary; while the Lease names no
// holder a primary steps down and standbys freeze, so that the operator can compare
// final positions; any other holder is followed.
func Decide(o Observation) Decision {
	v := o.View
	if !v.Known {
		return Decision{Act: Idle, Reason: "the primary Lease has not been read yet"}
	}
	if why := v.KeepsDown(o.Me); why != "" {
		if o.Running {
			return Decision{Act: Stop, Reason: why}
		}
		return Decision{Act: Idle, Reason: why + ": stays stopped"}
	}
	switch v.Holder {
	case o.Me:
		return decideHolder(o)
	case "":
		return decideVacant(o)
	}
	return decideFollower(o)
}

func decideHolder(o Observation) Decision {
	if o.Source != "" {
		return decideDesignated(o)
	}
	switch {
	case o.Running && o.Role == agentapi.RolePrimary:
		return Decision{Act: KeepPrimary, Reason: "the Lease names this instance"}
	case o.Running && o.Role == agentapi.RoleReplica:
		return Decision{Act: Promote, Reason: fmt.Sprintf("the Lease names this instance in term %d", o.View.Term)}
	case o.Running:
		return Decision{Act: Idle, Reason: "postgres is " + o.Role}
	case o.Fenced && o.FencedTerm == o.View.Term:
		return Decision{Act: Idle, Reason: fmt.Sprintf("fenced in term %d: stays down until the Lease changes", o.FencedTerm)}
	}
	return Decision{Act: StartPrimary, Reason: fmt.Sprintf("the Lease names this instance in term %d", o.View.Term)}
}

func decideVacant(o Observation) Decision {
	v := o.View
	switch {
	case o.Running && o.Role == agentapi.RolePrimary:
		return Decision{Act: StepDown, Reason: "the Lease was revoked"}
	case o.Running && o.Role == agentapi.RoleReplica && !o.Frozen && v.Handover.CleanRelease():
		// The old primary stopped before it released the Lease: no more WAL comes, and
		// a freeze would only delay the promotion the operator is about to ask for.
		return Decision{Act: Idle, Reason: "the old primary stopped cleanly and released the Lease: no freeze needed"}
	case o.Running && o.Role == agentapi.RoleReplica && (!o.Frozen || o.Upstream != ""):
		return Decision{Act: Freeze, Reason: "the Lease names no primary: a failover or handover is under way"}
	case o.Running:
		return Decision{Act: KeepStandby, Reason: "frozen until the Lease names a primary"}
	case o.Data == postgres.DataStandby:
		// Started, a frozen standby reports its position to the operator.
		return Decision{Act: StartStandby, Reason: "the Lease names no primary: starting frozen"}
	}
	return Decision{Act: Idle, Reason: "the Lease names no primary"}
}

func decideFollower(o Observation) Decision {
	h := o.View.Holder
	switch {
	case o.Running && o.Role == agentapi.RolePrimary:
		return Decision{Act: StepDown, Reason: fmt.Sprintf("the Lease names %s", h)}
	case o.Running && o.Role == agentapi.RoleReplica:
		if o.Frozen && o.View.Term <= o.FrozenTerm {
			return Decision{Act: KeepStandby, Reason: fmt.Sprintf("frozen in term %d", o.FrozenTerm)}
		}
		if o.Frozen || o.Upstream != h {
			return Decision{Act: Follow, Target: h, Reason: fmt.Sprintf("the Lease names %s in term %d", h, o.View.Term)}
		}
		return Decision{Act: KeepStandby, Target: h, Reason: "following the primary"}
	case o.Running:
		return Decision{Act: Idle, Reason: "postgres is " + o.Role}
	case o.Frozen && o.View.Term <= o.FrozenTerm:
		// Its position was reported as final: it must not stream from the old holder.
		return Decision{Act: StartStandby, Reason: fmt.Sprintf("frozen in term %d: starting frozen", o.FrozenTerm)}
	}
	return Decision{Act: StartStandby, Target: h, Reason: fmt.Sprintf("the Lease names %s", h)}
}

// decideDesignated is the holder's step in a replica cluster: the Lease names the
// designated primary, which runs as a standby of the source, and the other instances
// follow it as they would a primary. Promoting it is spec.replica.enabled: false,
// which empties Source.
func decideDesignated(o Observation) Decision {
	src := o.Source
	switch {
	case o.Running && o.Role == agentapi.RoleReplica:
		if o.Frozen || o.Upstream != src {
			return Decision{Act: Follow, Target: src, Reason: fmt.Sprintf("the Lease names this instance in term %d: it follows the source %s", o.View.Term, src)}
		}
		return Decision{Act: KeepStandby, Target: src, Reason: "following the source " + src}
	case o.Running && o.Role == agentapi.RolePrimary:
		return Decision{Act: Demote, Target: src, Reason: "spec.replica names a source: this primary stops cleanly and follows " + src}
	case o.Running:
		return Decision{Act: Idle, Reason: "postgres is " + o.Role}
	case o.Fenced && o.FencedTerm == o.View.Term:
		return Decision{Act: Idle, Reason: fmt.Sprintf("fenced in term %d: stays down until the Lease changes", o.FencedTerm)}
	}
	// A primary's data too (a demotion the agent did not finish): started as a standby
	// of the source without a rewind, it streams only if the source has all it wrote.
	return Decision{Act: StartStandby, Target: src, Reason: fmt.Sprintf("the Lease names this instance in term %d: it follows the source %s", o.View.Term, src)}
}
