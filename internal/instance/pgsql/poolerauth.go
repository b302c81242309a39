package pgsql

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgpilot/pgpilot/internal/protocol/poolerauth"
)

// PoolerConnectionLimit bounds the sessions of the pooler's lookup role: each pooler
// pod's PgBouncer keeps at most 4 of them (pgbouncer.AuthUserConnections, across the
// databases it looks clients up in) and its agent's probe one more, and a cluster has
// at most 64 pooler pods (32 per pool). A pooler that opened more would crowd out the
// clients.
const PoolerConnectionLimit = 64 * (4 + 1)

// poolerSetupTimeout bounds the setup of the lookup function in one database: its
// session, and each statement (a lock held by someone else is not waited for).
const poolerSetupTimeout = 15 * time.Second

// EnsurePoolerRole makes poolerauth.Role what the pooler needs and nothing more: a login
// without a password (it logs in by its client certificate; pg_hba.conf admits no other
// way), no superuser, database, role, replication or row-security-bypassing right, no
// inherited privileges, and at most PoolerConnectionLimit sessions. It creates the role
// when it is missing, and sets every attribute when it is not, a password someone gave
// it included. On the primary only: standbys get it by replication.
func (d *DB) EnsurePoolerRole(ctx context.Context) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	role := pgx.Identifier{poolerauth.Role}.Sanitize()
	for _, sql := range []string{
		`DO $$ BEGIN
			IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '` + poolerauth.Role + `') THEN
				CREATE ROLE ` + role + `;
			END IF; END $$`,
		"ALTER ROLE " + role + " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS" +
			" CONNECTION LIMIT " + strconv.Itoa(PoolerConnectionLimit) + " PASSWORD NULL",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return err
		}
	}
	return nil
}

// PoolerDatabase is a database the pooler's lookup function belongs in.
type PoolerDatabase struct {
	OID  uint32
	Name string
}

// PoolerDatabases are the databases a client may connect to, template1 included (a
// database created from it gets the function), template0 and databases left invalid by
// an interrupted DROP DATABASE excluded: no session can enter them.
func (d *DB) PoolerDatabases(ctx context.Context) ([]PoolerDatabase, error) {
	conn, err := d.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, `SELECT oid, datname::text FROM pg_catalog.pg_database
		WHERE datallowconn AND datconnlimit <> -2 AND datname <> 'template0' ORDER BY datname`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (PoolerDatabase, error) {
		var db PoolerDatabase
		err := row.Scan(&db.OID, &db.Name)
		return db, err
	})
}

// poolerSetupSettings are the lookup function's setup session's: names resolved in
// pg_catalog only (a database owner's operators or functions in public are never
// picked), writes allowed whatever the database's default, and no wait beyond
// poolerSetupTimeout.
var poolerSetupSettings = map[string]string{
	"search_path":                   "pg_catalog",
	"default_transaction_read_only": "off",
	"statement_timeout":             strconv.Itoa(int(poolerSetupTimeout.Milliseconds())),
	"lock_timeout":                  strconv.Itoa(int(poolerSetupTimeout.Milliseconds())),
}

// SetUpPoolerLookup runs poolerauth.SetupSQL in database, in one transaction: the
// schema pgpilot and the lookup function the pooler's auth_query calls, callable by
// poolerauth.Role alone. The role must exist (EnsurePoolerRole). The error is
// PostgreSQL's, such as SetupSQL's refusal of a schema pgpilot a superuser does not own.
func (d *DB) SetUpPoolerLookup(ctx context.Context, database string) error {
	ctx, cancel := context.WithTimeout(ctx, poolerSetupTimeout)
	defer cancel()
	conn, err := d.dial(ctx, database, poolerSetupSettings)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, sql := range poolerauth.SetupSQL() {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		return nil
	})
}
