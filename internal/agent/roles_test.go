package agent

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pgpilot/pgpilot/internal/agentapi"
)

func TestPlanRoles(t *testing.T) {
	old := scramVerifier("old", []byte("0123456789abcdef"), 4096)
	fake := func(pw string) (string, error) { return "SCRAM-SHA-256$4096:c2FsdA==$" + pw, nil }
	pw := func(s string) *string { return &s }
	login := func(name string) agentapi.Role {
		return agentapi.Role{Name: name, Login: true, Inherit: true, ConnectionLimit: -1}
	}
	existing := CatalogRole{Login: true, Inherit: true, ConnectionLimit: -1, Verifier: old}
	with := func(r agentapi.Role, f func(*agentapi.Role)) agentapi.Role { f(&r); return r }
	reserved := []string{"postgres", "pgpilot_replication", "app"}

	for _, tc := range []struct {
		name    string
		req     agentapi.RolesRequest
		cat     Catalog
		want    []Step
		refused map[string]string
	}{
		{
			name: "a new role with a password and memberships",
			req:  agentapi.RolesRequest{Roles: []agentapi.Role{with(login("alice"), func(r *agentapi.Role) { r.Password = pw("s3cret"); r.InRoles = []string{"readers"} })}},
			want: []Step{
				{Kind: KindRole, Name: "alice", Phase: phaseRoles, Done: "created",
					SQL: []string{`CREATE ROLE "alice" WITH LOGIN NOCREATEDB NOCREATEROLE INHERIT CONNECTION LIMIT -1 PASSWORD 'SCRAM-SHA-256$4096:c2FsdA==$s3cret'`}},
				{Kind: KindRole, Name: "alice", Phase: phaseMembers, Done: "memberships set", SQL: []string{`GRANT "readers" TO "alice"`}},
			},
		},
		{
			name: "a role as it should be: nothing to do",
			req:  agentapi.RolesRequest{Roles: []agentapi.Role{with(login("alice"), func(r *agentapi.Role) { r.Password = pw("old") })}},
			cat:  Catalog{Roles: map[string]CatalogRole{"alice": existing}},
		},
		{
			name: "a changed password and attributes, an extra membership revoked",
			req: agentapi.RolesRequest{Roles: []agentapi.Role{with(login("alice"), func(r *agentapi.Role) {
				r.Password, r.CreateDB, r.ConnectionLimit = pw("new"), true, 5
			})}},
			cat: Catalog{Roles: map[string]CatalogRole{"alice": func() CatalogRole { r := existing; r.MemberOf = []string{"admins"}; return r }()}},
			want: []Step{
				{Kind: KindRole, Name: "alice", Phase: phaseRoles, Done: "attributes set, password set", SQL: []string{
					`ALTER ROLE "alice" WITH LOGIN CREATEDB NOCREATEROLE INHERIT CONNECTION LIMIT 5`,
					`ALTER ROLE "alice" PASSWORD 'SCRAM-SHA-256$4096:c2FsdA==$new'`}},
				{Kind: KindRole, Name: "alice", Phase: phaseMembers, Done: "memberships set", SQL: []string{`REVOKE "admins" FROM "alice"`}},
			},
		},
		{
			name: "no password Secret any more: the password goes",
			req:  agentapi.RolesRequest{Roles: []agentapi.Role{login("alice")}},
			cat:  Catalog{Roles: map[string]CatalogRole{"alice": existing}},
			want: []Step{{Kind: KindRole, Name: "alice", Phase: phaseRoles, Done: "password removed", SQL: []string{`ALTER ROLE "alice" PASSWORD NULL`}}},
		},
		{
			name: "an unreadable Secret keeps the password",
			req:  agentapi.RolesRequest{Roles: []agentapi.Role{with(login("alice"), func(r *agentapi.Role) { r.KeepPassword = true })}},
			cat:  Catalog{Roles: map[string]CatalogRole{"alice": existing}},
		},
		{
			name: "a name is quoted, never interpreted",
			req:  agentapi.RolesRequest{Roles: []agentapi.Role{login(`x" SUPERUSER; --`)}},
			want: []Step{{Kind: KindRole, Name: `x" SUPERUSER; --`, Phase: phaseRoles, Done: "created",
				SQL: []string{`CREATE ROLE "x"" SUPERUSER; --" WITH LOGIN NOCREATEDB NOCREATEROLE INHERIT CONNECTION LIMIT -1`}}},
		},
		{
			name:    "reserved and superuser roles are refused",
			req:     agentapi.RolesRequest{Roles: []agentapi.Role{login("postgres"), login("app"), login("pg_monitor"), login("boss")}},
			cat:     Catalog{Roles: map[string]CatalogRole{"boss": {Superuser: true}}},
			refused: map[string]string{"role/postgres": "role postgres is reserved: pgpilot manages it itself", "role/app": "role app is reserved: pgpilot manages it itself", "role/pg_monitor": "role pg_monitor is reserved: pgpilot manages it itself", "role/boss": "role boss is a superuser or replication role: pgpilot does not manage those"},
		},
		{
			name: "absent: dropped when present, databases before roles",
			req: agentapi.RolesRequest{Roles: []agentapi.Role{{Name: "gone", Absent: true}, {Name: "never", Absent: true}},
				Databases: []agentapi.Database{{Name: "olddb", Absent: true}}},
			cat: Catalog{Roles: map[string]CatalogRole{"gone": existing}, Databases: map[string]CatalogDatabase{"olddb": {Owner: "gone"}}},
			want: []Step{
				{Kind: KindDatabase, Name: "olddb", Phase: phaseDropDatabases, Done: "dropped", SQL: []string{`DROP DATABASE "olddb"`}},
				{Kind: KindRole, Name: "gone", Phase: phaseDropRoles, Done: "dropped", SQL: []string{`DROP ROLE "gone"`}},
			},
		},
		{
			name: "a new database with extensions; its owner is made first",
			req: agentapi.RolesRequest{Roles: []agentapi.Role{login("alice")},
				Databases: []agentapi.Database{{Name: "shop", Owner: "alice", Extensions: []string{"citext", "uuid-ossp"}}}},
			cat: Catalog{Databases: map[string]CatalogDatabase{}},
			want: []Step{
				{Kind: KindRole, Name: "alice", Phase: phaseRoles, Done: "created", SQL: []string{`CREATE ROLE "alice" WITH LOGIN NOCREATEDB NOCREATEROLE INHERIT CONNECTION LIMIT -1`}},
				{Kind: KindDatabase, Name: "shop", Phase: phaseDatabases, Done: "created", SQL: []string{`CREATE DATABASE "shop" OWNER "alice"`}},
				{Kind: KindDatabase, Name: "shop", Phase: phaseExtensions, Database: "shop", Done: "extensions created",
					SQL: []string{`CREATE EXTENSION IF NOT EXISTS "citext"`, `CREATE EXTENSION IF NOT EXISTS "uuid-ossp"`}},
			},
		},
		{
			name: "an existing database: owner set, only missing extensions, none dropped",
			req:  agentapi.RolesRequest{Databases: []agentapi.Database{{Name: "shop", Owner: "bob", Extensions: []string{"citext", "pg_trgm"}}}},
			cat:  Catalog{Databases: map[string]CatalogDatabase{"shop": {Owner: "alice", Extensions: []string{"plpgsql", "citext", "hstore"}}}},
			want: []Step{
				{Kind: KindDatabase, Name: "shop", Phase: phaseDatabases, Done: "owner set", SQL: []string{`ALTER DATABASE "shop" OWNER TO "bob"`}},
				{Kind: KindDatabase, Name: "shop", Phase: phaseExtensions, Database: "shop", Done: "extensions created", SQL: []string{`CREATE EXTENSION IF NOT EXISTS "pg_trgm"`}},
			},
		},
		{
			name: "pgpilot's own passwords: set where they differ, skipped for a missing role",
			req:  agentapi.RolesRequest{Passwords: []agentapi.Password{{Role: "postgres", Password: "old"}, {Role: "app", Password: "fresh"}, {Role: "nobody", Password: "x"}}},
			cat:  Catalog{Roles: map[string]CatalogRole{"postgres": existing, "app": existing}},
			want: []Step{{Kind: KindPassword, Name: "app", Phase: phasePasswords, Done: "password set",
				SQL: []string{`ALTER ROLE "app" PASSWORD 'SCRAM-SHA-256$4096:c2FsdA==$fresh'`}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PlanRoles(tc.req, tc.cat, reserved, fake)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Steps); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			if tc.refused == nil {
				tc.refused = map[string]string{}
			}
			if diff := cmp.Diff(tc.refused, got.Refused); diff != "" {
				t.Errorf("refused (-want +got):\n%s", diff)
			}
		})
	}
}

// One item's failure skips its later steps and no other item's.
func TestRolesResults(t *testing.T) {
	req := agentapi.RolesRequest{
		Roles:     []agentapi.Role{{Name: "a"}, {Name: "b"}, {Name: "c"}},
		Databases: []agentapi.Database{{Name: "d", Owner: "nobody"}},
	}
	plan := RolesPlan{Refused: map[string]string{"role/c": "reserved"}}
	var r Results
	r.Record(Step{Kind: KindRole, Name: "a", Done: "created"}, nil)
	r.Record(Step{Kind: KindRole, Name: "a", Done: "memberships set"}, nil)
	r.Record(Step{Kind: KindDatabase, Name: "d", Done: "created"}, errors.New(`ERROR: role "nobody" does not exist (SQLSTATE 42704)`))
	if !r.Failed(KindDatabase, "d") || r.Failed(KindRole, "a") {
		t.Errorf("Failed: d %v, a %v", r.Failed(KindDatabase, "d"), r.Failed(KindRole, "a"))
	}
	want := agentapi.RolesResult{
		Roles:     []agentapi.ItemResult{{Name: "a", Done: "created, memberships set"}, {Name: "b"}, {Name: "c", Error: "reserved"}},
		Databases: []agentapi.ItemResult{{Name: "d", Error: `ERROR: role "nobody" does not exist (SQLSTATE 42704)`}},
	}
	if diff := cmp.Diff(want, r.Summarize(req, plan)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
