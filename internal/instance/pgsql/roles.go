package pgsql

import (
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	dbv1 "github.com/pgpilot/pgpilot/api/v1"
	"github.com/pgpilot/pgpilot/internal/instance/pgconf"
	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// Catalog is what PostgreSQL holds of the roles and databases a RolesRequest names.
type Catalog struct {
	// Roles by name.
	Roles map[string]CatalogRole
	// Databases by name: the owner's name, and the extensions when the request names
	// the database.
	Databases map[string]CatalogDatabase
	// Reaches are, for each role a request's inRoles name or its roles are members of,
	// that role and every role it is a member of, directly or not: a member can SET
	// ROLE to any of them.
	Reaches map[string][]ReachedRole
	// ServerVersion is server_version_num (150004).
	ServerVersion int
}

// ReachedRole is a role of pg_roles a membership reaches, with the attributes that make
// it unsafe to grant.
type ReachedRole struct {
	Name                                          string
	Superuser, Replication, BypassRLS, CreateRole bool
}

// createRoleIsLimited is the first server_version_num where a CREATEROLE role can grant
// only the roles it has ADMIN OPTION on (PostgreSQL 16). Before, it can grant itself
// any role but a superuser, pg_execute_server_program included.
const createRoleIsLimited = 160000

// CatalogRole is one role of pg_authid.
type CatalogRole struct {
	Superuser, Replication               bool
	Login, CreateDB, CreateRole, Inherit bool
	ConnectionLimit                      int32
	// Verifier is rolpassword: a SCRAM verifier, or "" for none.
	Verifier string
	// MemberOf are the roles it is a member of.
	MemberOf []string
}

// CatalogDatabase is one database of pg_database.
type CatalogDatabase struct {
	Owner      string
	Extensions []string
}

// Phases of a roles plan: every item's steps of one phase run before the next phase,
// so a membership finds the roles it names made, a database its owner, and a role is
// dropped after the databases it owned.
const (
	phasePasswords = iota
	phaseRoles
	phaseMembers
	phaseDatabases
	phaseExtensions
	phaseDropDatabases
	phaseDropRoles
)

// Item kinds of a plan.
const (
	KindRole     = "role"
	KindDatabase = "database"
	KindPassword = "password"
)

// Step is statements for one item, run in order on one database until one fails.
type Step struct {
	Kind, Name string
	Phase      int
	// Database the statements run in; "" is the postgres database.
	Database string
	SQL      []string
	// Done says what the statements change, for the item's result.
	Done string
	// Secret: a statement holds a password verifier, so the step runs in a session
	// that logs no statement (QuietSettings).
	Secret bool
}

// RolesPlan is what PlanRoles decided.
type RolesPlan struct {
	Steps []Step
	// Refused are items the request may not change, by kind and name, with the reason.
	Refused map[string]string
}

// ItemKey names an item of a plan in Refused.
func ItemKey(kind, name string) string { return kind + "/" + name }

// PlanRoles decides the statements that make cat what req says. reserved are role
// names never managed (the superuser, the replication role, the bootstrap owner:
// theirs are Passwords only); verifier makes a SCRAM verifier of a password. A password
// is set only when the role's verifier is not one of it, so sending the same request
// again plans nothing.
func PlanRoles(req agentapi.RolesRequest, cat Catalog, reserved []string, verifier func(string) (string, error)) (RolesPlan, error) {
	p := RolesPlan{Refused: map[string]string{}}
	for _, pw := range req.Passwords {
		r, ok := cat.Roles[pw.Role]
		if !ok || pgconf.ScramMatches(r.Verifier, pw.Password) {
			continue
		}
		v, err := verifier(pw.Password)
		if err != nil {
			return p, err
		}
		p.add(KindPassword, pw.Role, phasePasswords, "", "password set", alterPassword(pw.Role, &v))
		p.Steps[len(p.Steps)-1].Secret = true
	}
	for _, want := range req.Roles {
		if why := refusedRole(want.Name, cat, reserved); why != "" {
			p.Refused[ItemKey(KindRole, want.Name)] = why
			continue
		}
		if why := refusedAttributes(want, cat); why != "" {
			p.Refused[ItemKey(KindRole, want.Name)] = why
			continue
		}
		if why, revoke := refusedMemberships(want, cat); why != "" {
			p.Refused[ItemKey(KindRole, want.Name)] = why
			if len(revoke) > 0 {
				p.add(KindRole, want.Name, phaseMembers, "", "unsafe memberships revoked", revoke...)
			}
			continue
		}
		if err := p.planRole(want, cat, verifier); err != nil {
			return p, err
		}
	}
	for _, want := range req.Databases {
		p.planDatabase(want, cat)
	}
	slices.SortStableFunc(p.Steps, func(a, b Step) int { return a.Phase - b.Phase })
	return p, nil
}

func refusedRole(name string, cat Catalog, reserved []string) string {
	switch r, ok := cat.Roles[name]; {
	case slices.Contains(reserved, name) || strings.HasPrefix(name, "pg_") || strings.HasPrefix(name, dbv1.OwnRolePrefix):
		return "role " + name + " is reserved: pgpilot manages it itself"
	case ok && (r.Superuser || r.Replication):
		return "role " + name + " is a superuser or replication role: pgpilot does not manage those"
	}
	return ""
}

// refusedAttributes says why a role may not have the attributes want asks for: on
// PostgreSQL 14 and 15 CREATEROLE can grant itself pg_execute_server_program, and so
// run programs as the database's OS user (the CRD refuses it too).
func refusedAttributes(want agentapi.Role, cat Catalog) string {
	if want.Absent || !want.CreateRole || cat.ServerVersion >= createRoleIsLimited {
		return ""
	}
	return "role " + want.Name + " cannot have CREATEROLE on PostgreSQL before 16: it could grant itself pg_execute_server_program " +
		"and run programs in the database container; grant what the role needs instead"
}

// refusedMemberships says why want may not be a member of one of its inRoles, and the
// statements that revoke the unsafe memberships the role holds already. A membership is
// unsafe when it names pgpilot's or PostgreSQL's program and file roles
// (dbv1.IsUnsafeMembership), or reaches, through the roles it is a member of, one of
// those or a superuser, a replication role (which reads files for pg_rewind), a
// BYPASSRLS role, or, before PostgreSQL 16, a CREATEROLE role: a member can SET ROLE to
// any of them.
func refusedMemberships(want agentapi.Role, cat Catalog) (string, []string) {
	if want.Absent {
		return "", nil
	}
	var why []string
	for _, r := range want.InRoles {
		if reason := unsafeGrant(r, cat); reason != "" {
			why = append(why, reason)
		}
	}
	if len(why) == 0 {
		return "", nil
	}
	var revoke []string
	for _, r := range cat.Roles[want.Name].MemberOf {
		if unsafeGrant(r, cat) != "" {
			revoke = append(revoke, "REVOKE "+pgx.Identifier{r}.Sanitize()+" FROM "+pgx.Identifier{want.Name}.Sanitize())
		}
	}
	return "role " + want.Name + " cannot be a member of " + strings.Join(why, "; ") +
		": grant the role privileges on the objects it needs instead", revoke
}

// unsafeGrant says why role may not be granted through spec.roles, "" when it may.
func unsafeGrant(role string, cat Catalog) string {
	if dbv1.IsUnsafeMembership(role) {
		return role + " (the superuser, pgpilot's own roles and the roles that run programs or read or write files are never granted)"
	}
	for _, r := range cat.Reaches[role] {
		via := role
		if r.Name != role {
			via = role + ", a member of " + r.Name + ","
		}
		switch {
		case r.Superuser:
			return via + " which is a superuser"
		case r.Replication:
			return via + " which is a replication role"
		case r.BypassRLS:
			return via + " which bypasses row security"
		case r.CreateRole && cat.ServerVersion < createRoleIsLimited:
			return via + " which has CREATEROLE (before PostgreSQL 16, it can grant itself any role)"
		case dbv1.IsUnsafeMembership(r.Name):
			return via + " which runs programs, reads or writes files or is pgpilot's"
		}
	}
	return ""
}

func (p *RolesPlan) add(kind, name string, phase int, db, done string, sql ...string) {
	p.Steps = append(p.Steps, Step{Kind: kind, Name: name, Phase: phase, Database: db, SQL: sql, Done: done})
}

func (p *RolesPlan) planRole(want agentapi.Role, cat Catalog, verifier func(string) (string, error)) error {
	have, exists := cat.Roles[want.Name]
	id := pgx.Identifier{want.Name}.Sanitize()
	if want.Absent {
		if exists {
			p.add(KindRole, want.Name, phaseDropRoles, "", "dropped", "DROP ROLE "+id)
		}
		return nil
	}
	var password *string
	if !want.KeepPassword && want.Password != nil && (!exists || !pgconf.ScramMatches(have.Verifier, *want.Password)) {
		v, err := verifier(*want.Password)
		if err != nil {
			return err
		}
		password = &v
	}
	attrs := roleAttributes(want)
	if !exists {
		sql := "CREATE ROLE " + id + " WITH " + attrs
		if password != nil {
			sql += " PASSWORD '" + *password + "'"
		}
		p.add(KindRole, want.Name, phaseRoles, "", "created", sql)
		p.Steps[len(p.Steps)-1].Secret = password != nil
	} else {
		var sql, done []string
		if attrs != roleAttributes(agentapi.Role{Login: have.Login, CreateDB: have.CreateDB, CreateRole: have.CreateRole,
			Inherit: have.Inherit, ConnectionLimit: have.ConnectionLimit}) {
			sql, done = append(sql, "ALTER ROLE "+id+" WITH "+attrs), append(done, "attributes set")
		}
		switch {
		case password != nil:
			sql, done = append(sql, alterPassword(want.Name, password)), append(done, "password set")
		case !want.KeepPassword && want.Password == nil && have.Verifier != "":
			sql, done = append(sql, alterPassword(want.Name, nil)), append(done, "password removed")
		}
		if len(sql) > 0 {
			p.add(KindRole, want.Name, phaseRoles, "", strings.Join(done, ", "), sql...)
			p.Steps[len(p.Steps)-1].Secret = password != nil
		}
	}
	var grants []string
	for _, r := range want.InRoles {
		if !slices.Contains(have.MemberOf, r) {
			grants = append(grants, "GRANT "+pgx.Identifier{r}.Sanitize()+" TO "+id)
		}
	}
	for _, r := range have.MemberOf {
		if !slices.Contains(want.InRoles, r) {
			grants = append(grants, "REVOKE "+pgx.Identifier{r}.Sanitize()+" FROM "+id)
		}
	}
	if len(grants) > 0 {
		p.add(KindRole, want.Name, phaseMembers, "", "memberships set", grants...)
	}
	return nil
}

// roleAttributes are the attributes of CREATE or ALTER ROLE ... WITH, all of them, so
// that two equal strings are two equal roles.
func roleAttributes(r agentapi.Role) string {
	flag := func(on bool, name string) string {
		if on {
			return name
		}
		return "NO" + name
	}
	return strings.Join([]string{flag(r.Login, "LOGIN"), flag(r.CreateDB, "CREATEDB"), flag(r.CreateRole, "CREATEROLE"),
		flag(r.Inherit, "INHERIT"), "CONNECTION LIMIT " + strconv.Itoa(int(r.ConnectionLimit))}, " ")
}

// alterPassword sets a role's password to a SCRAM verifier, or none for nil. A
// verifier is base64 and "$:" only: nothing in it needs escaping, and the password
// itself never appears in SQL, logs or pg_stat_activity.
func alterPassword(role string, verifier *string) string {
	if verifier == nil {
		return "ALTER ROLE " + pgx.Identifier{role}.Sanitize() + " PASSWORD NULL"
	}
	return "ALTER ROLE " + pgx.Identifier{role}.Sanitize() + " PASSWORD '" + *verifier + "'"
}

func (p *RolesPlan) planDatabase(want agentapi.Database, cat Catalog) {
	have, exists := cat.Databases[want.Name]
	id := pgx.Identifier{want.Name}.Sanitize()
	if want.Absent {
		if exists {
			p.add(KindDatabase, want.Name, phaseDropDatabases, "", "dropped", "DROP DATABASE "+id)
		}
		return
	}
	owner := pgx.Identifier{want.Owner}.Sanitize()
	switch {
	case !exists:
		// CREATE DATABASE cannot run in a transaction: a step of its own.
		p.add(KindDatabase, want.Name, phaseDatabases, "", "created", "CREATE DATABASE "+id+" OWNER "+owner)
	case have.Owner != want.Owner:
		p.add(KindDatabase, want.Name, phaseDatabases, "", "owner set", "ALTER DATABASE "+id+" OWNER TO "+owner)
	}
	var ext []string
	for _, e := range want.Extensions {
		if !slices.Contains(have.Extensions, e) {
			ext = append(ext, "CREATE EXTENSION IF NOT EXISTS "+pgx.Identifier{e}.Sanitize())
		}
	}
	if len(ext) > 0 {
		p.add(KindDatabase, want.Name, phaseExtensions, want.Name, "extensions created", ext...)
	}
}

// Results are the outcome of running a plan's steps: the first error of each item,
// and what was done.
type Results struct {
	errs map[string]string
	done map[string][]string
}

// Failed reports whether the item already failed (its later steps are skipped).
func (r *Results) Failed(kind, name string) bool { _, ok := r.errs[ItemKey(kind, name)]; return ok }

// Record records a step's outcome.
func (r *Results) Record(s Step, err error) {
	if r.errs == nil {
		r.errs, r.done = map[string]string{}, map[string][]string{}
	}
	k := ItemKey(s.Kind, s.Name)
	if err != nil {
		r.errs[k] = err.Error()
		return
	}
	r.done[k] = append(r.done[k], s.Done)
}

// Result is the item's result, in the API's terms.
func (r *Results) Result(kind, name string, refused map[string]string) agentapi.ItemResult {
	k := ItemKey(kind, name)
	out := agentapi.ItemResult{Name: name, Done: strings.Join(r.done[k], ", ")}
	if why, ok := refused[k]; ok {
		out.Error = why
	} else if e, ok := r.errs[k]; ok {
		out.Error = e
	}
	return out
}

// Summarize is the RolesResult of req after the plan ran.
func (r *Results) Summarize(req agentapi.RolesRequest, p RolesPlan) agentapi.RolesResult {
	var out agentapi.RolesResult
	for _, x := range req.Roles {
		out.Roles = append(out.Roles, r.Result(KindRole, x.Name, p.Refused))
	}
	for _, x := range req.Databases {
		out.Databases = append(out.Databases, r.Result(KindDatabase, x.Name, p.Refused))
	}
	for _, x := range req.Passwords {
		out.Passwords = append(out.Passwords, r.Result(KindPassword, x.Role, p.Refused))
	}
	return out
}
