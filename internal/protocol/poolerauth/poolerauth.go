// Package poolerauth is how the pooler authenticates clients (docs/pooler.md): PgBouncer
// logs in as Role and runs Query, which calls a function that the instances' agent
// creates in every database (SetupSQL). The role can do nothing else, and the function
// answers for ordinary login roles only: never a superuser, a replication or
// row-security-bypassing role, or pgpilot's own roles.
package poolerauth

// Role is the login PgBouncer runs Query as.
const Role = "pgpilot_pooler"

// Query is PgBouncer's auth_query: a client's name and password (its SCRAM secret).
const Query = "SELECT usename, passwd FROM pgpilot.pooler_lookup($1)"

// SetupSQL makes, in the database it runs in, the schema and the lookup function Query
// calls, callable by Role alone; it can run again. Role must exist.
func SetupSQL() []string {
	return []string{
		"CREATE SCHEMA IF NOT EXISTS pgpilot",
		"REVOKE ALL ON SCHEMA pgpilot FROM PUBLIC",
		`CREATE OR REPLACE FUNCTION pgpilot.pooler_lookup(name text, OUT usename name, OUT passwd text)
RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
  SELECT a.rolname, a.rolpassword
  FROM pg_catalog.pg_authid a
  WHERE a.rolname = name AND a.rolcanlogin AND NOT a.rolsuper AND NOT a.rolreplication
    AND NOT a.rolbypassrls AND pg_catalog.left(a.rolname, 8) <> 'pgpilot_' AND a.rolpassword IS NOT NULL
    AND (a.rolvaliduntil IS NULL OR a.rolvaliduntil > pg_catalog.now())
$$`,
		"REVOKE ALL ON FUNCTION pgpilot.pooler_lookup(text) FROM PUBLIC",
		"GRANT USAGE ON SCHEMA pgpilot TO " + Role,
		"GRANT EXECUTE ON FUNCTION pgpilot.pooler_lookup(text) TO " + Role,
	}
}
