// Package hollow stands in for the nodes of a control plane that has none, as
// kubemark's hollow nodes do: a Kubelet creates each StatefulSet's pods, gives each pod
// an address of its own on the loopback network and serves there a hollow instance,
// the agent's real HTTP API (agentapi.Server, TLS with the cluster's certificate, the
// operator's token) over a scripted state instead of PostgreSQL. The primary's
// instance renews the primary Lease every second as an agent does; standbys follow
// whoever the Lease names. The operator under test is the real one, unchanged: it
// finds, asks, freezes and promotes these instances as it would real ones, so its
// observation loop and its failover are measured at a scale no node here could run.
package hollow

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/primarylease"
)

// lsn is where every hollow instance's WAL ends: an idle cluster's never moves.
const lsn = "0/3000060"

// instance is one hollow PostgreSQL instance: what its agent would report, from the
// role the primary Lease gives it.
type instance struct {
	pod, namespace, cluster string
	ip                      string
	// version is server_version_num; system the database system identifier.
	version int
	system  string
	k       *Kubelet
	token   string
	cert    tls.Certificate

	mu sync.Mutex
	// primary: it was promoted (or bootstrapped) and has not been fenced since; its
	// term is the Lease's term it was made primary in.
	primary bool
	term    int32
	// timeline is its current timeline.
	timeline int64
	// frozen: told to stop receiving WAL until the Lease names a holder in a term
	// after frozenTerm.
	frozen     bool
	frozenTerm int32
	fenced     bool
	// dead: killed; it answers nothing and renews nothing.
	dead    bool
	started time.Time
	// renewed is when its last renewal succeeded.
	renewed time.Time
}

var _ agentapi.Instance = (*instance)(nil)

// lease is the cluster's primary Lease as the Kubelet last saw it.
func (in *instance) lease() primarylease.Record {
	return in.k.leaseOf(in.namespace, in.cluster)
}

// isPrimary reports whether the instance acts as the primary of r: made primary in
// r's term (or bootstrapped under it) and not fenced.
func (in *instance) isPrimaryLocked(r primarylease.Record) bool {
	if in.fenced || in.dead {
		return false
	}
	if r.Holder == in.pod && !in.primary && in.k.firstHolder(in) {
		// The first holder of a new cluster starts as primary, as initdb does.
		in.primary, in.term = true, r.Term
	}
	return in.primary
}

// Status implements agentapi.Instance.
func (in *instance) Status(context.Context) agentapi.Status {
	r := in.lease()
	in.mu.Lock()
	if in.frozen && r.Holder != "" && r.Term > in.frozenTerm {
		in.frozen = false
	}
	started := in.started
	st := agentapi.Status{
		Pod: in.pod, Running: true, Ready: true, Timeline: in.timeline,
		PostgresVersion: in.version, StartedAt: &started, Connections: 3, ConnectionLimit: 97,
		Term: r.Term, Holder: r.Holder, Position: lsn, SystemIdentifier: in.system,
		CheckpointTimeline: in.timeline,
	}
	switch {
	case in.fenced:
		st.Role, st.Running, st.Ready, st.Fenced = agentapi.RoleFenced, false, false, true
	case in.isPrimaryLocked(r):
		st.Role, st.WriteLSN = agentapi.RolePrimary, lsn
		if r.Holder == in.pod && r.Term == in.term {
			st.Gate = agentapi.GateAcking
			st.Confirmation = &agentapi.Confirmation{Valid: true, Via: "api", RemainingMillis: 4000}
		} else {
			st.Gate = agentapi.GateWithholding
			st.Confirmation = &agentapi.Confirmation{}
		}
	default:
		st.Role, st.ReceivedLSN, st.ReplayedLSN = agentapi.RoleReplica, lsn, lsn
		st.Frozen = in.frozen
		rs := &agentapi.ReceiverStatus{
			State: agentapi.ReceiverStreaming, Since: started, Upstream: r.Holder, LastMessageMillisAgo: 20,
			Healthy: true, MaxLagMillis: 30000,
		}
		if in.frozen {
			rs.State, rs.Upstream = agentapi.ReceiverFrozen, ""
		}
		st.Receiver = rs
	}
	in.mu.Unlock()
	if st.Role == agentapi.RolePrimary {
		// Outside in's lock: a peer's lock is taken, and two instances may both think
		// themselves primary for a moment.
		for _, peer := range in.k.peersOf(in) {
			st.Replicas = append(st.Replicas, agentapi.ReplicaStatus{
				Name: peer, State: "streaming", SyncState: "async", SentLSN: lsn, FlushLSN: lsn, ReplayLSN: lsn,
			})
		}
	}
	return st
}

// following reports whether the instance streams from the Lease's holder: a running,
// unfrozen standby.
func (in *instance) following() bool {
	r := in.lease()
	in.mu.Lock()
	defer in.mu.Unlock()
	return !in.dead && !in.fenced && !in.isPrimaryLocked(r) && (!in.frozen || (r.Holder != "" && r.Term > in.frozenTerm)) && r.Holder != "" && r.Holder != in.pod
}

// Ready implements agentapi.Instance.
func (in *instance) Ready(context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.fenced || in.dead {
		return errors.New("not running")
	}
	return nil
}

// Promote implements agentapi.Instance: once the Lease names this instance, it is the
// primary on the timeline the Lease reserved.
func (in *instance) Promote(ctx context.Context) error {
	r := in.lease()
	if r.Holder != in.pod {
		// The operator moved the Lease a moment ago: read it as the agent would.
		var err error
		if r, err = in.k.readLease(ctx, in); err != nil {
			return err
		}
	}
	if r.Holder != in.pod {
		return fmt.Errorf("%w: the Lease names %q, not this instance", agentapi.ErrConflict, r.Holder)
	}
	in.promoteFrom(r)
	return nil
}

// promoteFrom makes the instance primary if r names it and it is a standby that can be:
// alive, not fenced, and its cluster's first primary was made.
func (in *instance) promoteFrom(r primarylease.Record) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.primary || in.dead || in.fenced || r.Holder != in.pod || !in.k.bootstrapped(in) {
		return
	}
	in.primary, in.frozen, in.term = true, false, r.Term
	in.timeline = max(in.timeline+1, r.Timeline)
	in.k.promoted(in, time.Now())
}

// Fence implements agentapi.Instance.
func (in *instance) Fence(context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.primary {
		in.fenced = true
	}
	return nil
}

// Demote implements agentapi.Instance: the handover of a switchover, the Lease released
// with this instance's final position.
func (in *instance) Demote(ctx context.Context) error {
	r := in.lease()
	in.mu.Lock()
	if !in.primary || r.Holder != in.pod {
		in.mu.Unlock()
		return nil
	}
	in.primary = false
	timeline := in.timeline
	in.mu.Unlock()
	return in.k.release(ctx, in, primarylease.Handover{Clean: true, FinalLSN: lsn, Timeline: timeline})
}

// Freeze implements agentapi.Instance.
func (in *instance) Freeze(context.Context) error {
	r := in.lease()
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.isPrimaryLocked(r) {
		in.frozen, in.frozenTerm = true, r.Term
	}
	return nil
}

// Restart implements agentapi.Instance.
func (in *instance) Restart(context.Context) error { return nil }

// Confirm implements agentapi.Instance.
func (in *instance) Confirm(_ context.Context, req agentapi.ConfirmRequest) error {
	r := in.lease()
	if !in.following() || r.Holder != req.Primary || r.Term != req.Term {
		return agentapi.ErrConflict
	}
	return nil
}

var _ agentapi.RolesInstance = (*instance)(nil)

// ApplyRoles implements agentapi.RolesInstance: on the primary every role, database and
// password is as asked, nothing needed doing.
func (in *instance) ApplyRoles(_ context.Context, req agentapi.RolesRequest) (agentapi.RolesResult, error) {
	r := in.lease()
	in.mu.Lock()
	primary := in.isPrimaryLocked(r)
	in.mu.Unlock()
	if !primary {
		return agentapi.RolesResult{}, fmt.Errorf("%w: not the primary", agentapi.ErrConflict)
	}
	var res agentapi.RolesResult
	for _, role := range req.Roles {
		res.Roles = append(res.Roles, agentapi.ItemResult{Name: role.Name})
	}
	for _, db := range req.Databases {
		res.Databases = append(res.Databases, agentapi.ItemResult{Name: db.Name})
	}
	for _, p := range req.Passwords {
		res.Passwords = append(res.Passwords, agentapi.ItemResult{Name: p.Role})
	}
	return res, nil
}
