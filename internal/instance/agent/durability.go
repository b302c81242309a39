package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgpilot/pgpilot/internal/protocol/clusterconfig"
)

// A database's or role's synchronous_commit set to local or off (ALTER DATABASE ... SET,
// ALTER ROLE ... SET: allowed to a database's owner and to a role with CREATEROLE) gives
// every new session of that database or role commits the commit gate never sees: they
// are acknowledged by a primary that may no longer hold the Lease, and in synchronous
// mode before any standby has them. So the primary's agent, every lockoutEvery, pins
// synchronous_commit for every login role in every database: a role's setting in a
// database takes precedence over the database's and the role's own, so their overrides
// have no effect at all. An override that replaces a pin (ALTER ROLE ... IN DATABASE
// ... SET) or reaches a role or database not pinned yet is replaced or reset at the next
// look, and the sessions that may have started with it are terminated; the operator
// turns each into a Warning event (DurabilityOverrideReset). With
// spec.postgresql.allowUnsafeDurability nothing is pinned or reset: the overrides are
// reported and kept.

// durabilityResets is what keepDurability did, for the agent's status.
type durabilityResets struct {
	// Count grows with every override reset since the agent started.
	Count int
	// Last says what the last reset removed, and when.
	Last   string
	LastAt time.Time
	// Kept are the overrides allowUnsafeDurability keeps, as last seen.
	Kept []string
}

// pinValue is the synchronous_commit the pins set: spec.postgresql.parameters' when it
// waits for the gate (remote_write, remote_apply), else on.
func pinValue(parameters map[string]string) string {
	for name, value := range parameters {
		v := strings.ToLower(strings.TrimSpace(value))
		if strings.EqualFold(name, "synchronous_commit") && (v == "remote_write" || v == "remote_apply") {
			return v
		}
	}
	return "on"
}

// keepDurability keeps every session's synchronous_commit waiting for the gate, on a
// primary (every lockoutEvery, guardPrimary): it pins synchronous_commit for every login
// role in every database (ALTER ROLE ... IN DATABASE ... SET, which takes precedence over
// a database's and a role's own setting, so ALTER DATABASE/ROLE ... SET local has no
// effect), and replaces or resets the overrides that skip the gate. With
// allowUnsafeDurability it only records them.
func (a *Agent) keepDurability(ctx context.Context, cluster clusterconfig.Config) error {
	gaps, err := a.db.DurabilityGaps(ctx)
	if err != nil {
		return fmt.Errorf("reading synchronous_commit settings (pg_db_role_setting): %w", err)
	}
	if cluster.AllowUnsafeDurability {
		kept := make([]string, 0, len(gaps.Unsafe))
		for _, o := range gaps.Unsafe {
			kept = append(kept, o.String())
		}
		a.mu.Lock()
		a.durability.Kept = kept
		a.mu.Unlock()
		return nil
	}
	pin := pinValue(cluster.Parameters)
	for _, o := range gaps.Unpinned {
		if err := a.db.Pin(ctx, o, pin); err != nil {
			return fmt.Errorf("pinning synchronous_commit for role %s in database %s: %w", o.Role, o.Database, err)
		}
	}
	if len(gaps.Unpinned) > 0 {
		a.log.Info("Pinned synchronous_commit for login roles in databases: a database's or role's own setting cannot loosen it",
			"value", pin, "pairs", len(gaps.Unpinned))
	}
	for _, o := range gaps.Unsafe {
		n, err := a.db.ResetDurabilityOverride(ctx, o, pin)
		if err != nil {
			return fmt.Errorf("resetting %q: %w", o.String(), err)
		}
		msg := fmt.Sprintf("reset %q: commits of its sessions would skip the commit gate, acknowledged by a primary that may "+
			"no longer hold the Lease and, in synchronous mode, before any replica has them; terminated %d session(s) that may "+
			"have started with it. Set spec.postgresql.allowUnsafeDurability to keep such settings", o.String(), n)
		a.log.Info("Reset a synchronous_commit override that skips the commit gate", "override", o.String(), "terminated", n)
		a.mu.Lock()
		a.durability.Count++
		a.durability.Last, a.durability.LastAt = msg, time.Now()
		a.mu.Unlock()
	}
	return nil
}
