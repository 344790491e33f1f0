package idemmigrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Migrate applies the pending migrations of dialect to db, in version
// order, and records each in the table idem_schema_migrations (version,
// name, applied_at), which it creates when missing.
//
// Each migration runs in its own transaction where the dialect allows it
// (PostgreSQL and SQLite; MySQL commits every DDL statement by itself, which
// is why the MySQL files are written to be re-run safely).
// A PostgreSQL or SQLite file must therefore be able to run inside a
// transaction (no CREATE INDEX CONCURRENTLY).
//
// Two processes starting at once are safe: the run holds a lock that lets
// one migrate while the other waits and then finds nothing left to do
// (PostgreSQL pg_advisory_lock per schema, MySQL GET_LOCK per database,
// SQLite BEGIN IMMEDIATE around each migration). Versions recorded in the
// database but unknown to this build (a newer release migrated first) are
// left alone.
func Migrate(ctx context.Context, db *sql.DB, dialect Dialect) error {
	_, err := Apply(ctx, db, dialect)
	return err
}

// Apply is Migrate, and returns the names of the migrations this call
// applied, in order: none when another process applied them while this one
// waited for the lock (what `idem migrate` prints). On error, the names
// are those applied before it.
func Apply(ctx context.Context, db *sql.DB, dialect Dialect) ([]string, error) {
	all, err := migrations(dialect)
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("idemmigrate: %w", err)
	}
	defer conn.Close()

	d := dialects[dialect]
	unlock, err := d.lock(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("idemmigrate: lock: %w", err)
	}
	defer unlock()

	if _, err := conn.ExecContext(ctx, d.createTable); err != nil {
		return nil, fmt.Errorf("idemmigrate: create idem_schema_migrations: %w", err)
	}
	var applied []string
	for _, m := range all {
		did, err := d.apply(ctx, conn, m)
		if err != nil {
			return applied, fmt.Errorf("idemmigrate: %s/%s.sql: %w", dialect, m.name, err)
		}
		if did {
			applied = append(applied, m.name)
		}
	}
	return applied, nil
}

// Pending returns the names (such as "0001_idem_keys") of the migrations
// that Migrate would apply to db, in order, without changing anything:
// what `idem migrate --dry-run` prints.
func Pending(ctx context.Context, db *sql.DB, dialect Dialect) ([]string, error) {
	all, err := migrations(dialect)
	if err != nil {
		return nil, err
	}
	d := dialects[dialect]
	var exists bool
	if err := db.QueryRowContext(ctx, d.tableExists).Scan(&exists); err != nil {
		return nil, fmt.Errorf("idemmigrate: %w", err)
	}
	applied := map[int64]bool{}
	if exists {
		if applied, err = appliedVersions(ctx, db); err != nil {
			return nil, err
		}
	}
	var out []string
	for _, m := range all {
		if !applied[m.version] {
			out = append(out, m.name)
		}
	}
	return out, nil
}

// querier is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func appliedVersions(ctx context.Context, q querier) (map[int64]bool, error) {
	rows, err := q.QueryContext(ctx, "SELECT version FROM idem_schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("idemmigrate: read idem_schema_migrations: %w", err)
	}
	defer rows.Close()
	applied := map[int64]bool{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		applied[v] = true
	}
	return applied, rows.Err()
}

func isApplied(ctx context.Context, q querier, placeholder string, version int64) (bool, error) {
	var one int
	err := q.QueryRowContext(ctx, "SELECT 1 FROM idem_schema_migrations WHERE version = "+placeholder, version).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
