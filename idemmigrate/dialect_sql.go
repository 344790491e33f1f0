package idemmigrate

import (
	"context"
	"database/sql"
	"fmt"
)

// dialectSQL is how the migrator talks to one dialect.
type dialectSQL struct {
	createTable string
	// tableExists selects one boolean: whether idem_schema_migrations
	// exists where unqualified names resolve.
	tableExists string
	// lock serialises concurrent migrators and returns the unlock.
	lock func(ctx context.Context, conn *sql.Conn) (unlock func(), err error)
	// apply runs one migration unless it is already recorded, and records
	// it.
	apply func(ctx context.Context, conn *sql.Conn, m migration) (applied bool, err error)
}

var dialects = map[Dialect]dialectSQL{
	Postgres: {
		createTable: `CREATE TABLE IF NOT EXISTS idem_schema_migrations (
    version    bigint      PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`,
		tableExists: `SELECT to_regclass('idem_schema_migrations') IS NOT NULL`,
		lock:        postgresLock,
		apply:       postgresApply,
	},
	MySQL: {
		createTable: `CREATE TABLE IF NOT EXISTS idem_schema_migrations (
    version    BIGINT       NOT NULL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE = InnoDB`,
		tableExists: `SELECT COUNT(*) > 0 FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = 'idem_schema_migrations'`,
		lock:  mysqlLock,
		apply: mysqlApply,
	},
	SQLite: {
		createTable: `CREATE TABLE IF NOT EXISTS idem_schema_migrations (
    version    INTEGER NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000000) AS INTEGER))
)`,
		tableExists: `SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'idem_schema_migrations'`,
		lock:        sqliteLock,
		apply:       sqliteApply,
	},
}

// postgresLock takes a session advisory lock keyed by the current schema,
// so that migrators of one schema wait for each other and those of other
// schemas in the same database do not.
func postgresLock(ctx context.Context, conn *sql.Conn) (func(), error) {
	const key = `hashtextextended('idem_schema_migrations:' || current_schema(), 0)`
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock(`+key+`)`); err != nil {
		return nil, err
	}
	return func() {
		// Unlock even when ctx has ended; closing the connection would
		// release the lock too, but the pool may keep it open.
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+key+`)`)
	}, nil
}

func postgresApply(ctx context.Context, conn *sql.Conn, m migration) (bool, error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // harmless after Commit
	if done, err := isApplied(ctx, tx, "$1", m.version); err != nil || done {
		return false, err
	}
	// No arguments: the driver sends the script through the simple query
	// protocol, which runs several statements.
	if _, err := tx.ExecContext(ctx, m.sql); err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO idem_schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// mysqlLockWait bounds the wait for another migrator, in seconds; the
// context cancels it earlier.
const mysqlLockWait = 600

// mysqlLock takes a named lock per database. GET_LOCK names are server
// wide and at most 64 characters, so the name carries the database name
// cut to fit: two databases sharing a long prefix merely wait for each
// other.
func mysqlLock(ctx context.Context, conn *sql.Conn) (func(), error) {
	const name = `CONCAT('idem_migrate:', LEFT(COALESCE(DATABASE(), ''), 51))`
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(`+name+`, ?)`, mysqlLockWait).Scan(&got); err != nil {
		return nil, err
	}
	if !got.Valid || got.Int64 != 1 {
		return nil, fmt.Errorf("GET_LOCK: another migrator held the lock for %ds", mysqlLockWait)
	}
	return func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(`+name+`)`)
	}, nil
}

// mysqlApply runs the statements one by one: MySQL commits each DDL
// statement implicitly, so a transaction would promise an atomicity it
// cannot give. The files use IF NOT EXISTS so that a run interrupted
// between a statement and the record is completed by the next run.
func mysqlApply(ctx context.Context, conn *sql.Conn, m migration) (bool, error) {
	if done, err := isApplied(ctx, conn, "?", m.version); err != nil || done {
		return false, err
	}
	for _, stmt := range splitStatements(m.sql) {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return false, err
		}
	}
	_, err := conn.ExecContext(ctx, `INSERT INTO idem_schema_migrations (version, name) VALUES (?, ?)`, m.version, m.name)
	return err == nil, err
}

// sqliteBusyTimeout is the busy timeout, in milliseconds, that the
// migrator sets on its connection when the DSN set none, so that BEGIN
// IMMEDIATE waits for another migrator instead of failing with SQLITE_BUSY.
const sqliteBusyTimeout = 10000

// sqliteLock takes no lock of its own: every migration runs in a BEGIN
// IMMEDIATE transaction, which holds SQLite's single write lock from its
// start. It makes sure that waiting for that lock is possible.
func sqliteLock(ctx context.Context, conn *sql.Conn) (func(), error) {
	var timeout int64
	if err := conn.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&timeout); err != nil {
		return nil, err
	}
	if timeout > 0 {
		return func() {}, nil
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf(`PRAGMA busy_timeout = %d`, sqliteBusyTimeout)); err != nil {
		return nil, err
	}
	return func() {
		// The connection goes back to the pool: give it back as it came.
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA busy_timeout = 0`)
	}, nil
}

// sqliteApply runs one migration in a BEGIN IMMEDIATE transaction, issued
// by hand so that it does not depend on the DSN's _txlock. Whether the
// migration is already recorded is read inside that transaction: another
// process may have applied it while this one waited.
func sqliteApply(ctx context.Context, conn *sql.Conn, m migration) (applied bool, err error) {
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		return false, err
	}
	defer func() {
		if err != nil {
			// It fails only when SQLite already rolled back by itself.
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		}
	}()
	done, err := isApplied(ctx, conn, "?", m.version)
	if err != nil {
		return false, err
	}
	if !done {
		if _, err := conn.ExecContext(ctx, m.sql); err != nil {
			return false, err
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO idem_schema_migrations (version, name) VALUES (?, ?)`, m.version, m.name); err != nil {
			return false, err
		}
	}
	if _, err = conn.ExecContext(ctx, `COMMIT`); err != nil {
		return false, err
	}
	return !done, nil
}
