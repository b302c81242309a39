// Package poolerauth is how the pooler authenticates clients (docs/pooler.md): PgBouncer
// logs in as Role and runs Query, which calls a function that the instances' agent
// creates in every database (SetupSQL). The role is granted nothing but that function
// (it keeps what every role has: connecting, reading the catalogs). The function
// answers with SCRAM secrets of ordinary login roles only: never a superuser, a
// replication, row-security-bypassing or role-creating role, a member of one (who could
// SET ROLE to it), or pgpilot's own roles; a role whose password is not a SCRAM secret
// is not answered either.
package poolerauth

// Role is the login PgBouncer runs Query as.
const Role = "pgpilot_pooler"

// Query is PgBouncer's auth_query: a client's name and password (its SCRAM secret).
const Query = "SELECT usename, passwd FROM pgpilot.pooler_lookup($1)"

// SetupSQL makes, in the database it runs in, the schema and the lookup function Query
// calls, callable by Role alone; it can run again. Role must exist.
func SetupSQL() []string {
	return []string{
		// A schema pgpilot made by anyone but a superuser (a database owner may create
		// schemas) could hold a function of theirs that PgBouncer would call instead:
		// refused, with what to do.
		`DO $$
BEGIN
  IF EXISTS (SELECT FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner
             WHERE n.nspname = 'pgpilot' AND NOT r.rolsuper) THEN
    RAISE EXCEPTION 'the schema pgpilot in database % is not owned by a superuser: pgpilot keeps the pooler''s lookup function there; rename or drop it', pg_catalog.current_database();
  END IF;
END $$`,
		"CREATE SCHEMA IF NOT EXISTS pgpilot",
		"REVOKE ALL ON SCHEMA pgpilot FROM PUBLIC",
		`CREATE OR REPLACE FUNCTION pgpilot.pooler_lookup(name text, OUT usename name, OUT passwd text)
RETURNS SETOF record LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT a.rolname, a.rolpassword
  FROM pg_catalog.pg_authid a
  WHERE a.rolname = name AND a.rolcanlogin AND pg_catalog.left(a.rolname, 8) <> 'pgpilot_'
    AND a.rolpassword LIKE 'SCRAM-SHA-256$%'
    AND (a.rolvaliduntil IS NULL OR a.rolvaliduntil > pg_catalog.now())
    AND NOT EXISTS (SELECT FROM pg_catalog.pg_roles p
                    WHERE (p.rolsuper OR p.rolreplication OR p.rolbypassrls OR p.rolcreaterole)
                      AND pg_catalog.pg_has_role(a.oid, p.oid, 'MEMBER'))
$$`,
		"ALTER FUNCTION pgpilot.pooler_lookup(text) OWNER TO CURRENT_USER",
		"REVOKE ALL ON FUNCTION pgpilot.pooler_lookup(text) FROM PUBLIC",
		"GRANT USAGE ON SCHEMA pgpilot TO " + Role,
		"GRANT EXECUTE ON FUNCTION pgpilot.pooler_lookup(text) TO " + Role,
	}
}
