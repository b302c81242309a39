package agent

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/pgpilot/pgpilot/internal/instance/gate"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/instance/pgsql"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// ApplyRoles makes the primary's roles and databases what req says (PUT /roles): it
// reads the catalog, plans with PlanRoles, and runs each step, one item's failure
// leaving the others to run. A database of req where the pooler's lookup function
// could not be set up says so in its result (poolerauth.go). Only a primary does; any
// other instance answers ErrConflict, and the operator sends it again to the next
// primary.
func (a *Agent) ApplyRoles(ctx context.Context, req agentapi.RolesRequest) (agentapi.RolesResult, error) {
	a.mu.Lock()
	role := a.role
	reserved := []string{a.creds.Superuser.Username, a.creds.Replication.Username, a.cluster.Bootstrap.Owner, gate.GateName}
	a.mu.Unlock()
	if role != agentapi.RolePrimary {
		return agentapi.RolesResult{}, fmt.Errorf("%w: roles are set on the primary, and this instance is %s", agentapi.ErrConflict, role)
	}
	// One request at a time: two would plan from the same catalog and both create.
	a.rolesMu.Lock()
	defer a.rolesMu.Unlock()
	cat, err := a.db.ReadCatalog(ctx, req)
	if err != nil {
		return agentapi.RolesResult{}, fmt.Errorf("reading the roles and databases: %w", err)
	}
	plan, err := pgsql.PlanRoles(req, cat, reserved, func(pw string) (string, error) { return pgconf.ScramVerifier(pw, rand.Reader) })
	if err != nil {
		return agentapi.RolesResult{}, err
	}
	var res pgsql.Results
	for _, s := range plan.Steps {
		if res.Failed(s.Kind, s.Name) {
			continue
		}
		err := a.db.RunStep(ctx, s)
		res.Record(s, err)
		if err != nil {
			a.log.Info("Failed to reconcile a role or database", "kind", s.Kind, "name", s.Name, "error", err.Error())
		} else {
			a.log.Info("Reconciled a role or database", "kind", s.Kind, "name", s.Name, "done", s.Done)
		}
	}
	out := res.Summarize(req, plan)
	a.addPoolerAuthFailures(&out)
	return out, ctx.Err()
}
