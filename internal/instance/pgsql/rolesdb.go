package pgsql

import (
	"context"
	"fmt"
	"maps"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgpilot/pgpilot/internal/protocol/agentapi"
)

// ReadCatalog reads what PostgreSQL holds of the roles and databases req names: the
// roles, their memberships, every database's owner, and the extensions of the
// databases req wants.
func (d *DB) ReadCatalog(ctx context.Context, req agentapi.RolesRequest) (Catalog, error) {
	cat := Catalog{Roles: map[string]CatalogRole{}, Databases: map[string]CatalogDatabase{}}
	conn, err := d.connect(ctx)
	if err != nil {
		return cat, err
	}
	defer conn.Release()
	var names []string
	for _, r := range req.Roles {
		names = append(names, r.Name)
	}
	for _, p := range req.Passwords {
		names = append(names, p.Role)
	}
	rows, err := conn.Query(ctx, `SELECT a.rolname::text, a.rolsuper, a.rolreplication, a.rolcanlogin, a.rolcreatedb,
		a.rolcreaterole, a.rolinherit, a.rolconnlimit, coalesce(a.rolpassword, ''),
		coalesce(array(SELECT m.rolname::text FROM pg_auth_members am JOIN pg_roles m ON m.oid = am.roleid
			WHERE am.member = a.oid ORDER BY 1), '{}')
		FROM pg_authid a WHERE a.rolname = ANY($1)`, names)
	if err != nil {
		return cat, err
	}
	for rows.Next() {
		var name string
		var r CatalogRole
		if err := rows.Scan(&name, &r.Superuser, &r.Replication, &r.Login, &r.CreateDB, &r.CreateRole, &r.Inherit,
			&r.ConnectionLimit, &r.Verifier, &r.MemberOf); err != nil {
			return cat, err
		}
		cat.Roles[name] = r
	}
	if err := rows.Err(); err != nil {
		return cat, err
	}
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&cat.ServerVersion); err != nil {
		return cat, err
	}
	// What the roles may be granted, and what they hold: a refused role's unsafe
	// memberships are revoked.
	var granted []string
	for _, r := range req.Roles {
		granted = append(granted, r.InRoles...)
		granted = append(granted, cat.Roles[r.Name].MemberOf...)
	}
	if cat.Reaches, err = reaches(ctx, conn, granted); err != nil {
		return cat, err
	}
	rows, err = conn.Query(ctx, `SELECT datname::text, pg_get_userbyid(datdba)::text FROM pg_database`)
	if err != nil {
		return cat, err
	}
	for rows.Next() {
		var name string
		var db CatalogDatabase
		if err := rows.Scan(&name, &db.Owner); err != nil {
			return cat, err
		}
		cat.Databases[name] = db
	}
	if err := rows.Err(); err != nil {
		return cat, err
	}
	for _, want := range req.Databases {
		db, ok := cat.Databases[want.Name]
		if !ok || want.Absent || len(want.Extensions) == 0 {
			continue
		}
		if db.Extensions, err = d.extensions(ctx, want.Name); err != nil {
			return cat, fmt.Errorf("reading the extensions of database %s: %w", want.Name, err)
		}
		cat.Databases[want.Name] = db
	}
	return cat, nil
}

// reaches reads, for every role of names, the roles a member of it can SET ROLE to:
// itself and every role it is a member of, directly or not.
func reaches(ctx context.Context, conn *pgxpool.Conn, names []string) (map[string][]ReachedRole, error) {
	out := map[string][]ReachedRole{}
	if len(names) == 0 {
		return out, nil
	}
	rows, err := conn.Query(ctx, `WITH RECURSIVE up(start, oid) AS (
			SELECT oid, oid FROM pg_roles WHERE rolname = ANY($1)
			UNION SELECT up.start, m.roleid FROM up JOIN pg_auth_members m ON m.member = up.oid)
		SELECT s.rolname::text, r.rolname::text, r.rolsuper, r.rolreplication, r.rolbypassrls, r.rolcreaterole
		FROM up JOIN pg_roles s ON s.oid = up.start JOIN pg_roles r ON r.oid = up.oid
		ORDER BY s.rolname, up.start <> up.oid, r.rolname`, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var start string
		var r ReachedRole
		if err := rows.Scan(&start, &r.Name, &r.Superuser, &r.Replication, &r.BypassRLS, &r.CreateRole); err != nil {
			return nil, err
		}
		out[start] = append(out[start], r)
	}
	return out, rows.Err()
}

func (d *DB) extensions(ctx context.Context, database string) ([]string, error) {
	conn, err := d.connectTo(ctx, database)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "SELECT extname::text FROM pg_extension")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// connectTo opens a session in another database than postgres (extensions live in
// each database), as the superuser over the socket; the caller closes it.
func (d *DB) connectTo(ctx context.Context, database string) (*pgx.Conn, error) {
	return d.dial(ctx, database, nil)
}

// QuietSettings keep a statement that holds a password verifier out of the server's
// log and statistics, whatever spec.postgresql.parameters, ALTER ROLE ... SET or ALTER
// DATABASE ... SET say (log_statement = 'all' or 'ddl' would log ALTER ROLE ...
// PASSWORD with its verifier): no statement logged, by kind, duration or sampling, nor
// with its error; no parse tree printed; pg_stat_statements (loaded or not) keeps no
// utility statement. They are given when the session starts, which outranks role and
// database settings and comes before log_transaction_sample_rate samples the first
// transaction.
var QuietSettings = map[string]string{
	"log_statement":                    "none",
	"log_min_duration_statement":       "-1",
	"log_min_duration_sample":          "-1",
	"log_transaction_sample_rate":      "0",
	"log_min_error_statement":          "panic",
	"debug_print_parse":                "off",
	"debug_print_rewritten":            "off",
	"debug_print_plan":                 "off",
	"pg_stat_statements.track_utility": "off",
}

// quietConn opens a session with QuietSettings, for statements that hold a password
// verifier; the caller closes it.
func (d *DB) quietConn(ctx context.Context, database string) (*pgx.Conn, error) {
	return d.dial(ctx, database, QuietSettings)
}

// dial opens a session as the superuser over the socket, with settings besides the
// agent's own.
func (d *DB) dial(ctx context.Context, database string, settings map[string]string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		return nil, err
	}
	if database == "" {
		database = "postgres"
	}
	cfg.Host, cfg.Port, cfg.User, cfg.Database = d.SocketDir, uint16(d.Port), d.User, database
	cfg.RuntimeParams["application_name"] = "pgpilot-agent"
	cfg.RuntimeParams["synchronous_commit"] = "local"
	maps.Copy(cfg.RuntimeParams, settings)
	return pgx.ConnectConfig(ctx, cfg)
}

// RunStep runs a step's statements in order, each on its own (CREATE DATABASE cannot
// run in a transaction), and stops at the first that fails. The error is PostgreSQL's,
// without the statement: a statement may hold a password verifier, and a step that
// does runs in a session of its own with QuietSettings.
func (d *DB) RunStep(ctx context.Context, s Step) error {
	var exec func(sql string) error
	if s.Database == "" && !s.Secret {
		conn, err := d.connect(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		exec = func(sql string) error { _, err := conn.Exec(ctx, sql); return err }
	} else {
		dial := d.connectTo
		if s.Secret {
			dial = d.quietConn
		}
		conn, err := dial(ctx, s.Database)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		exec = func(sql string) error { _, err := conn.Exec(ctx, sql); return err }
	}
	for _, sql := range s.SQL {
		if err := exec(sql); err != nil {
			return err
		}
	}
	return nil
}
