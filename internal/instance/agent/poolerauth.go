package agent

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgpilot/pgpilot/internal/instance/postgres"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
)

// The pooler authenticates its clients with auth_query (docs/pooler.md): PgBouncer logs
// in to the primary as poolerauth.Role, by its client certificate (pg_hba.conf), and
// calls the lookup function in the database the client asks for. While config.json has
// a pooler block, the primary's agent makes sure the role exists as it must be and the
// function is in every database a client may connect to, template1 included so that a
// database created from it has the function from its first moment.
//
// Turning the pooler off (the block gone) leaves the role and the functions in place: a
// pooler pod still draining its clients looks them up until it stops, and dropping the
// functions under it would fail their logins. They give nobody anything while no
// pooler runs: the role logs in only with a certificate of the cluster's CA issued for
// it, and only it may call the function.

const (
	// poolerAuthEvery is how often the primary looks for databases without the lookup
	// function: one query of pg_database, on a pooled session; a database is set up
	// once per time this agent is primary.
	poolerAuthEvery = 2 * time.Second
	// poolerRetryEvery is how long a database where the setup failed waits before it
	// is tried again (a session of its own each time).
	poolerRetryEvery = 30 * time.Second
)

// poolerAuth is what the primary's agent did for the pooler's lookup.
type poolerAuth struct {
	// running is set while a pass runs (in the background: a new primary with many
	// databases opens a session in each, which the loop must not wait for);
	// started is when the last began and armed whether it ran with a pooler
	// configured (both the loop's only).
	running atomic.Bool
	started time.Time
	armed   bool

	// mu runs one pass at a time and guards what follows.
	mu sync.Mutex
	// stint is the primary's run the state below is for: a pass in another (postgres
	// started again, promoted again, another pooler block) starts afresh.
	stint    poolerStint
	roleMade bool
	// done are the databases, by OID, set up in this stint; failed those whose setup
	// failed, with why and when.
	done   map[uint32]bool
	failed map[uint32]poolerFailure
	// reported is the last failure logged per database ("" for the role and the
	// databases' list): a failure is logged when it starts or changes.
	reported map[string]string

	// failures are the failed databases' reasons by name, for PUT /roles' answer.
	failuresMu sync.Mutex
	failures   map[string]string
}

// poolerStint is one run of this agent's postgres as primary, with one pooler block.
type poolerStint struct {
	proc   *postgres.Process
	since  time.Time
	pooler *clusterconfig.Pooler
}

func (s poolerStint) same(o poolerStint) bool {
	return s.proc == o.proc && s.since.Equal(o.since) && reflect.DeepEqual(s.pooler, o.pooler)
}

type poolerFailure struct {
	database, reason string
	at               time.Time
}

// reset starts stint afresh (mu held).
func (p *poolerAuth) reset(stint poolerStint) {
	p.stint, p.roleMade = stint, false
	p.done, p.failed, p.reported = map[uint32]bool{}, map[uint32]poolerFailure{}, map[string]string{}
	p.publish()
}

// changed records msg as key's last failure ("" for none) and reports whether it is a
// new failure (mu held).
func (p *poolerAuth) changed(key, msg string) bool {
	if p.reported[key] == msg {
		return false
	}
	p.reported[key] = msg
	return msg != ""
}

// publish copies the failures for failureOf (mu held).
func (p *poolerAuth) publish() {
	out := map[string]string{}
	for _, f := range p.failed {
		out[f.database] = f.reason
	}
	p.failuresMu.Lock()
	p.failures = out
	p.failuresMu.Unlock()
}

// failureOf is why the lookup function could not be set up in database at the last
// try, "" when it was or was not tried.
func (p *poolerAuth) failureOf(database string) string {
	p.failuresMu.Lock()
	defer p.failuresMu.Unlock()
	return p.failures[database]
}

// keepPoolerAuth starts a pass of poolerAuthPass in the background at most every
// poolerAuthEvery, while a pooler is configured, and once more after it no longer is
// (to forget what the last stint did). From the loop, on a primary.
func (a *Agent) keepPoolerAuth(ctx context.Context) {
	p := &a.pooler
	configured := a.cluster.Pooler != nil
	if (!configured && !p.armed) || time.Since(p.started) < poolerAuthEvery || !p.running.CompareAndSwap(false, true) {
		return
	}
	p.started, p.armed = time.Now(), configured
	go func() {
		defer p.running.Store(false)
		a.poolerAuthPass(ctx)
	}()
}

// poolerAuthPass makes sure, on a primary whose Lease is confirmed, that the lookup
// role is as it must be (once per stint) and that every database a client may connect
// to has the lookup function (each once per stint; one whose setup failed is tried
// again after poolerRetryEvery, and the others go on). A failure is logged when it
// starts or changes, and a database's is reported in PUT /roles' answer for it.
func (a *Agent) poolerAuthPass(ctx context.Context) {
	a.mu.Lock()
	stint := poolerStint{proc: a.proc, since: a.primarySince, pooler: a.cluster.Pooler}
	primary := a.role == agentapi.RolePrimary
	a.mu.Unlock()
	p := &a.pooler
	p.mu.Lock()
	defer p.mu.Unlock()
	if stint.pooler == nil {
		p.reset(poolerStint{})
		return
	}
	// A primary that may not acknowledge commits writes nothing of its own either.
	if !primary || stint.proc == nil || !a.allowed() {
		return
	}
	if !p.stint.same(stint) {
		p.reset(stint)
	}
	// An error after this instance stopped being this primary is the stop's, not the
	// pass's: it is left unsaid.
	moved := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return ctx.Err() != nil || a.role != agentapi.RolePrimary || a.proc != stint.proc
	}
	if !p.roleMade {
		if err := a.db.EnsurePoolerRole(ctx); err != nil {
			if !moved() && p.changed("", err.Error()) {
				a.log.Error(err, "Could not make the pooler's lookup role; trying again", "role", poolerauth.Role)
			}
			return
		}
		p.roleMade = true
		p.changed("", "")
	}
	dbs, err := a.db.PoolerDatabases(ctx)
	if err != nil {
		if !moved() && p.changed("", err.Error()) {
			a.log.Error(err, "Could not list the databases for the pooler's lookup function; trying again")
		}
		return
	}
	p.changed("", "")
	defer p.publish()
	var made []string
	exists := map[uint32]bool{}
	for _, db := range dbs {
		exists[db.OID] = true
		if p.done[db.OID] {
			continue
		}
		if f, ok := p.failed[db.OID]; ok && time.Since(f.at) < poolerRetryEvery {
			continue
		}
		err := a.db.SetUpPoolerLookup(ctx, db.Name)
		if err != nil && moved() {
			return
		}
		if err != nil {
			p.failed[db.OID] = poolerFailure{database: db.Name, reason: err.Error(), at: time.Now()}
			if p.changed(db.Name, err.Error()) {
				a.log.Info("Could not set up the pooler's lookup function in a database; the others go on, and this one is tried again every 30 s",
					"database", db.Name, "reason", err.Error())
			}
			continue
		}
		delete(p.failed, db.OID)
		p.done[db.OID] = true
		p.changed(db.Name, "")
		made = append(made, db.Name)
	}
	// Dropped databases are forgotten, their failures with them.
	for oid, f := range p.failed {
		if !exists[oid] {
			delete(p.failed, oid)
			delete(p.reported, f.database)
		}
	}
	for oid := range p.done {
		if !exists[oid] {
			delete(p.done, oid)
		}
	}
	if len(made) > 0 {
		a.log.Info("Set up the pooler's lookup function", "role", poolerauth.Role, "databases", made)
	}
}

// addPoolerAuthFailures adds to each database of a PUT /roles answer why the pooler's
// lookup function could not be set up in it, if it could not: the roles controller
// makes the item failed in status.databases and a DatabaseFailed event of it.
func (a *Agent) addPoolerAuthFailures(res *agentapi.RolesResult) {
	for i, d := range res.Databases {
		why := a.pooler.failureOf(d.Name)
		if why == "" {
			continue
		}
		msg := "the pooler's lookup function could not be set up in it (spec.pooler): " + why
		res.Databases[i].Error = strings.Join(slices.DeleteFunc([]string{d.Error, msg}, func(s string) bool { return s == "" }), "; ")
	}
}
