package idemsql

import (
	"database/sql"

	"github.com/idem-go/idem/idemmigrate"
)

// Dialect is the SQL dialect of the database a Store works on. Use one of
// the package variables SQLite, MySQL and Postgres; the zero Dialect is not
// usable.
type Dialect struct{ d *dialect }

// The supported dialects.
var (
	// SQLite is SQLite 3.42 or later through modernc.org/sqlite (driver
	// "sqlite", no cgo) or another driver; open it with OpenSQLite. Times
	// are integer Unix microseconds from SQLite's own clock.
	SQLite = Dialect{sqliteDialect}
	// MySQL is MySQL 8.0.16+ or MariaDB 10.6+ on InnoDB, through
	// github.com/go-sql-driver/mysql. Times are DATETIME(6) holding UTC
	// from UTC_TIMESTAMP(6). Tenants are limited to 512 bytes.
	MySQL = Dialect{mysqlDialect}
	// Postgres is PostgreSQL through a database/sql driver, such as
	// github.com/jackc/pgx/v5/stdlib (driver "pgx"), for programs built on
	// database/sql, sqlx, ent or gorm. Programs on pgx itself use idempg.
	Postgres = Dialect{postgresDialect}
)

// Name returns the dialect's name: "sqlite", "mysql" or "postgres".
func (d Dialect) Name() string {
	if d.d == nil {
		return ""
	}
	return d.d.name
}

// MigrateDialect returns the idemmigrate dialect whose files create the
// tables this dialect works on.
func (d Dialect) MigrateDialect() idemmigrate.Dialect {
	if d.d == nil {
		return ""
	}
	return d.d.migrate
}

// String returns Name.
func (d Dialect) String() string { return d.Name() }

// dialect holds one dialect's statements, compiled once. Every statement
// takes its arguments by name (see query):
//
//	claim     tenant key fingerprint token lease retention (µs)
//	get       tenant key
//	complete  tenant key token mode status headers body ref
//	extend    tenant key token lease (µs)
//	held      tenant key token
//	release   tenant key token
//	purge     limit
type dialect struct {
	name    string
	migrate idemmigrate.Dialect

	// claim is the one claiming statement. With claimReturns it returns a
	// row when it won (INSERT … ON CONFLICT … RETURNING); without, winning
	// is read from the rows affected (MySQL: 1 inserted, 2 updated, 0 when
	// the existing row was kept).
	claim        query
	claimReturns bool

	get      query
	complete query
	extend   query
	// held selects 1 when the record is in flight under the token; it
	// settles a zero rows-affected count where that is ambiguous.
	held    query
	release query
	purge   query
	// purgeIsolation is the isolation of the purge's transaction, when it
	// needs one (MySQL: READ COMMITTED takes no gap locks).
	purgeIsolation sql.IsolationLevel
	purgeInTx      bool
	// purgePick, when set, picks the batch first (tenant_id, idem_key,
	// locking them, skipping rows other sessions hold) and purge then
	// deletes each picked row (@tenant, @key), in the same
	// transaction: MySQL's DELETE … LIMIT cannot skip locked rows, and
	// would wait on one, holding every row it passed, until its lock wait
	// timed out and undid the whole batch.
	purgePick query

	// deadlock reports an error after which the database rolled the
	// statement's transaction back whole, so that it may simply run again
	// (InnoDB deadlocks between claims and purges); nil when the dialect
	// needs no such retry.
	deadlock func(error) bool

	// changedRows is true when rows affected counts changed rows rather
	// than matched ones (MySQL without CLIENT_FOUND_ROWS), so that an
	// UPDATE writing the values already there reports zero.
	changedRows bool
	// maxTenant is the longest tenant the table holds, in bytes; 0 for no
	// limit. Claim refuses longer ones rather than let a non-strict MySQL
	// truncate them into another tenant's key space.
	maxTenant int
	// utcWall is true when the database returns times as a wall clock in
	// UTC without a zone (MySQL DATETIME).
	utcWall bool
}

// recordColumns is the select list that scanRecord reads.
const recordColumns = `tenant_id, idem_key, fingerprint, state, lease_token, locked_until,
    storage_mode, status_code, response_headers, response_body, resource_ref,
    created_at, completed_at, expires_at`
