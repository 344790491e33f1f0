// Package idemsql is an idem.Store on database/sql, for SQLite
// (modernc.org/sqlite, no cgo), MySQL and MariaDB
// (github.com/go-sql-driver/mysql) and PostgreSQL through a database/sql
// driver (github.com/jackc/pgx/v5/stdlib), so that programs built on
// database/sql, sqlx, ent or gorm keep their business writes and the
// idempotency record in one transaction.
//
// # Setting up
//
// Create the tables with idemmigrate (or copy idemmigrate.Files into your
// own migration tool), then build an engine:
//
//	db, err := idemsql.OpenSQLite("app.db") // or sql.Open("mysql", dsn) / sql.Open("pgx", url)
//	…
//	err = idemmigrate.Migrate(ctx, db, idemsql.SQLite.MigrateDialect())
//	…
//	engine, err := idem.NewEngine(idemsql.New(db, idemsql.SQLite), nil)
//
// # The handler's transaction
//
// Engine.Do runs the function with a context from which Tx returns the
// transaction that will also store the result. Make the business writes in
// it: the completion is an UPDATE of the record in that same transaction,
// fenced by the lease token, so either both commit or neither does. If the
// lease was taken over meanwhile, the UPDATE matches nothing, everything
// is rolled back, and Do returns idem.ErrLeaseLost.
//
// Callers who run their own transaction use Store.CompleteTx, which does
// the fenced completion inside it and leaves commit and rollback to them.
//
// # One statement per claim
//
// A claim is one INSERT … ON CONFLICT (tenant_id, idem_key) DO UPDATE …
// WHERE … RETURNING (SQLite, PostgreSQL) or INSERT … ON DUPLICATE KEY
// UPDATE with IF(…) assignments (MySQL): it inserts a new record, or takes
// over one past its retention (whatever its fingerprint) or one in flight
// whose lease ended (same fingerprint only). A lost claim is followed by
// one read of the record. All times come from the database clock: now()
// on PostgreSQL, UTC_TIMESTAMP(6) on MySQL, integer Unix microseconds from
// unixepoch('subsec') on SQLite; never from the application server.
//
// # SQLite
//
// SQLite has one writer at a time. OpenSQLite sets WAL, a busy timeout and
// BEGIN IMMEDIATE transactions so that concurrent requests wait their turn
// rather than fail with SQLITE_BUSY. The price: a handler holds the write
// lock for as long as it runs, and claims of every other key wait for it.
// This also means that no takeover can happen while a handler's
// transaction is open, that the lease heartbeat waits too, and that a
// duplicate arriving while the first execution runs waits for it (a claim
// is a write) and then usually gets the replay rather than ErrInFlight. Keep
// handlers short, or use PostgreSQL or MySQL for many concurrent writers.
// Inside a handler, make every query through Tx(ctx): a query on the
// *sql.DB would wait for a pooled connection, or for the very lock the
// handler holds.
// A database opened some other way must set the same options: a deferred
// transaction that reads before it writes can fail with SQLITE_BUSY
// whatever the busy timeout.
//
// # MySQL and MariaDB
//
// The tables use InnoDB. The completion is correct under REPEATABLE READ
// (the default) and READ COMMITTED alike, because an InnoDB UPDATE does not
// read the transaction's snapshot: it reads the latest committed row and
// locks it. A takeover committed after the handler's transaction began
// therefore makes the completion match nothing (idem.ErrLeaseLost), and a
// takeover arriving after the completion waits for its commit and then
// finds the record complete.
//
// Purge picks a bounded batch (SELECT … ORDER BY expires_at LIMIT n FOR
// UPDATE SKIP LOCKED, MySQL 8.0.1+ or MariaDB 10.6+) and deletes it row by
// row by primary key, under READ COMMITTED, where InnoDB takes no gap
// locks: claims inserting new keys never wait behind the range it
// scanned, and an expired row another session holds locked is left for a
// later pass instead of stalling the batch (a DELETE … LIMIT would wait on
// it until its lock wait timed out and undid everything). A purge and a
// claim taking over an expired record may still lock the row and its
// expires_at entry in opposite orders, so InnoDB may break a deadlock
// between them by rolling one back; the store runs such a victim again
// (claim, extend, release, purge), so that no deadlock reaches the caller.
// With statement-based binary logging (binlog_format=STATEMENT) InnoDB
// refuses writes under READ COMMITTED; use ROW or MIXED (the defaults).
//
// The DSN needs nothing special: parseTime may be on or off, and any loc
// is fine, since times are stored as UTC DATETIME(6) and read as UTC
// whatever the driver makes of them. clientFoundRows must stay off (the
// default): a claim tells winning from losing by the rows affected.
//
// # PostgreSQL
//
// Use the default READ COMMITTED isolation: a claim meeting a row that
// another transaction holds waits for it and re-evaluates its condition on
// the committed row. Under REPEATABLE READ or SERIALIZABLE the same
// conflicts surface as serialization errors instead (safe, but they turn
// into store errors).
package idemsql
