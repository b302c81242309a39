package pgsql

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

func TestPlanRoles(t *testing.T) {
	old, err := pgconf.ScramVerifier("old", strings.NewReader("0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
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
				{Kind: KindRole, Name: "alice", Phase: phaseRoles, Done: "created", Secret: true,
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
				{Kind: KindRole, Name: "alice", Phase: phaseRoles, Done: "attributes set, password set", Secret: true, SQL: []string{
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
			want: []Step{{Kind: KindPassword, Name: "app", Phase: phasePasswords, Done: "password set", Secret: true,
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

// A role of the spec is never granted a role that runs programs, reads or writes files,
// is pgpilot's or reaches a superuser, even when the CRD's rule was bypassed; one it
// holds already is revoked. CREATEROLE is refused before PostgreSQL 16.
func TestPlanRolesRefusesUnsafeMemberships(t *testing.T) {
	fake := func(pw string) (string, error) { return "SCRAM-SHA-256$4096:c2FsdA==$" + pw, nil }
	member := func(name string, in ...string) agentapi.Role {
		return agentapi.Role{Name: name, Login: true, Inherit: true, ConnectionLimit: -1, InRoles: in}
	}
	existing := CatalogRole{Login: true, Inherit: true, ConnectionLimit: -1}
	reaches := map[string][]ReachedRole{
		"readers":    {{Name: "readers"}},
		"admins":     {{Name: "admins"}, {Name: "postgres", Superuser: true}},
		"shell":      {{Name: "shell"}, {Name: "pg_execute_server_program"}},
		"repl":       {{Name: "repl", Replication: true}},
		"rls":        {{Name: "rls", BypassRLS: true}},
		"creators":   {{Name: "creators", CreateRole: true}},
		"boss":       {{Name: "boss", Superuser: true}},
		"pg_monitor": {{Name: "pg_monitor"}},
	}
	for _, tc := range []struct {
		name    string
		role    agentapi.Role
		version int
		have    []string
		want    []Step
		refused string
	}{
		{name: "a role's own and pg_monitor: granted", role: member("alice", "readers", "pg_monitor"), version: 150000,
			want: []Step{{Kind: KindRole, Name: "alice", Phase: phaseMembers, Done: "memberships set",
				SQL: []string{`GRANT "readers" TO "alice"`, `GRANT "pg_monitor" TO "alice"`}}}},
		{name: "pg_execute_server_program", role: member("alice", "pg_execute_server_program"), version: 150000,
			refused: "role alice cannot be a member of pg_execute_server_program (the superuser, pgpilot's own roles and the roles that run programs or read or write files are never granted): grant the role privileges on the objects it needs instead"},
		{name: "pg_read_server_files, held already: revoked", role: member("alice", "pg_read_server_files"), version: 150000, have: []string{"pg_read_server_files", "readers"},
			want: []Step{{Kind: KindRole, Name: "alice", Phase: phaseMembers, Done: "unsafe memberships revoked",
				SQL: []string{`REVOKE "pg_read_server_files" FROM "alice"`}}},
			refused: "role alice cannot be a member of pg_read_server_files (the superuser, pgpilot's own roles and the roles that run programs or read or write files are never granted): grant the role privileges on the objects it needs instead"},
		{name: "the superuser", role: member("alice", "postgres"), version: 160000,
			refused: "role alice cannot be a member of postgres (the superuser, pgpilot's own roles and the roles that run programs or read or write files are never granted): grant the role privileges on the objects it needs instead"},
		{name: "pgpilot's monitoring role", role: member("alice", "pgpilot_monitor"), version: 160000,
			refused: "role alice cannot be a member of pgpilot_monitor (the superuser, pgpilot's own roles and the roles that run programs or read or write files are never granted): grant the role privileges on the objects it needs instead"},
		{name: "a role made by hand that reaches the superuser", role: member("alice", "admins"), version: 160000,
			refused: "role alice cannot be a member of admins, a member of postgres, which is a superuser: grant the role privileges on the objects it needs instead"},
		{name: "a role made by hand that reaches a program role", role: member("alice", "shell"), version: 170000,
			refused: "role alice cannot be a member of shell, a member of pg_execute_server_program, which runs programs, reads or writes files or is pgpilot's: grant the role privileges on the objects it needs instead"},
		{name: "superuser, replication and bypassrls roles", role: member("alice", "boss", "repl", "rls"), version: 160000,
			refused: "role alice cannot be a member of boss which is a superuser; repl which is a replication role; rls which bypasses row security: grant the role privileges on the objects it needs instead"},
		{name: "a CREATEROLE role before 16", role: member("alice", "creators"), version: 150004,
			refused: "role alice cannot be a member of creators which has CREATEROLE (before PostgreSQL 16, it can grant itself any role): grant the role privileges on the objects it needs instead"},
		{name: "a CREATEROLE role from 16", role: member("alice", "creators"), version: 160000,
			want: []Step{{Kind: KindRole, Name: "alice", Phase: phaseMembers, Done: "memberships set", SQL: []string{`GRANT "creators" TO "alice"`}}}},
		{name: "CREATEROLE before 16", role: func() agentapi.Role { r := member("alice"); r.CreateRole = true; return r }(), version: 150004,
			refused: "role alice cannot have CREATEROLE on PostgreSQL before 16: it could grant itself pg_execute_server_program and run programs in the database container; grant what the role needs instead"},
		{name: "CREATEROLE from 16", role: func() agentapi.Role { r := member("alice"); r.CreateRole = true; return r }(), version: 160000,
			want: []Step{{Kind: KindRole, Name: "alice", Phase: phaseRoles, Done: "attributes set",
				SQL: []string{`ALTER ROLE "alice" WITH LOGIN NOCREATEDB CREATEROLE INHERIT CONNECTION LIMIT -1`}}}},
		{name: "a role named like pgpilot's", role: member("pgpilot_monitor"), version: 160000,
			refused: "role pgpilot_monitor is reserved: pgpilot manages it itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			have := existing
			have.MemberOf = tc.have
			cat := Catalog{Roles: map[string]CatalogRole{tc.role.Name: have}, Reaches: reaches, ServerVersion: tc.version}
			got, err := PlanRoles(agentapi.RolesRequest{Roles: []agentapi.Role{tc.role}}, cat, []string{"postgres"}, fake)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Steps); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.refused, got.Refused[ItemKey(KindRole, tc.role.Name)]); diff != "" {
				t.Errorf("refused (-want +got):\n%s", diff)
			}
		})
	}
}
