// Package idemmigrate creates and upgrades the tables of the SQL stores
// (idempg, idemsql): the idempotency records, idem_keys, and the record of
// applied migrations, idem_schema_migrations.
//
// # Running the migrations
//
// Call Migrate when the service starts, or run `idem migrate`:
//
//	if err := idemmigrate.Migrate(ctx, db, idemmigrate.Postgres); err != nil {
//		return err
//	}
//
// Migrate is safe when several instances start at once: they take a lock
// (PostgreSQL pg_advisory_lock, MySQL GET_LOCK, SQLite BEGIN IMMEDIATE),
// one applies what is pending and the others find nothing left to do.
// Pending lists what Migrate would apply, for a dry run.
//
// # Bringing your own migration tool
//
// Files returns the plain SQL files of a dialect, named NNNN_name.sql, for
// teams that already run goose, golang-migrate, Atlas or Flyway: copy them
// into that tool's directory and apply them in name order. idem never
// needs idem_schema_migrations at run time; only Migrate and Pending read
// it.
//
// # Dialects
//
// The three dialects hold the same columns with the same meaning; only the
// types differ where the databases differ:
//
//   - Postgres: timestamptz times from now(), bytea, jsonb headers; and
//     the function idem_complete (0002), idempg's one-round-trip fenced
//     completion.
//   - MySQL (and MariaDB), InnoDB: DATETIME(6) times holding UTC from
//     UTC_TIMESTAMP(6); VARBINARY tenant and key, so that they compare
//     byte for byte whatever the server's collation; tenants up to 512
//     bytes. MySQL commits DDL implicitly, so its migrations are written to
//     be re-run safely (IF NOT EXISTS) rather than relying on a
//     transaction.
//   - SQLite 3.42 or later: integer Unix microseconds computed by SQLite
//     from 'now'.
package idemmigrate
