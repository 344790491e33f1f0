// Package idemsql is an idem.Store on database/sql, for SQLite, MySQL and
// MariaDB, and PostgreSQL through a database/sql driver, so that programs
// built on database/sql, sqlx, sqlc, ent or gorm keep their business
// writes and the idempotency record in one transaction. It imports no
// database driver: open SQLite with idemsqlite.Open (modernc.org/sqlite),
// MySQL with github.com/go-sql-driver/mysql and the dialect
// idemmysql.Dialect, PostgreSQL with github.com/jackc/pgx/v5/stdlib.
//
// # Setting up
//
// Create the tables with idemmigrate (or copy idemmigrate.Files into your
// own migration tool), then build an engine:
//
//	db, err := idemsqlite.Open("app.db") // or sql.Open("mysql", dsn) / sql.Open("pgx", url)
//	…
//	err = idemmigrate.Migrate(ctx, db, idemsql.SQLite.MigrateDialect())
//	…
//	store, err := idemsql.NewStore(db, idemsql.SQLite) // idemmysql.Dialect, idemsql.Postgres
//	…
//	engine, err := idem.NewEngine(store, nil)
//
// # The handler's transaction
//
// Engine.Do runs the handler with a context from which TxFromContext
// returns its transaction, a *Tx, which the completion also uses. Make the
// business writes through it (DB(ctx, db) returns it, or db outside idem,
// for code shared with plain requests; both satisfy DBTX, the interface
// sqlc generates). The completion is an UPDATE of the record in that same
// transaction, fenced by the lease token, so either both commit or
// neither does. If the lease was taken over meanwhile, the UPDATE matches
// nothing, everything is rolled back, and Do returns idem.ErrLeaseLost.
//
// The transaction begins at the handler's first statement: a handler that
// calls another service first holds no connection meanwhile, and one that
// makes no statement costs one, the completion. Its end belongs to idem:
//
//   - Return normally: the writes commit with the answer.
//   - Tx.Rollback (or idem.RollbackWrites(ctx)): the writes are undone, and
//     the answer is stored and replayed without them. Later statements fail
//     with ErrTxRolledBack.
//   - Return an error: nothing is kept and the key is released.
//   - Tx.Commit is refused with ErrTxOwned.
//
// Never send BEGIN, COMMIT or ROLLBACK as SQL text.
//
// After a failed statement the transaction goes on, on every database but
// PostgreSQL, which aborts it: nothing but a rollback can follow. A
// handler that catches such an error and answers (409 account exists)
// has that answer stored and replayed, as it wrote it, with its writes
// rolled back.
//
// The database may also end the transaction under the handler: a deadlock
// or a full lock table (InnoDB rolls the transaction back), a lock wait
// timeout when innodb_rollback_on_timeout is on, an I/O error or an
// interrupt on SQLite (a statement whose context is cancelled is
// interrupted, and SQLite then rolls back the whole transaction), DDL on
// MySQL (an implicit commit). Then nothing of the execution is ever stored
// as a success: the statement that revealed the end, and every later one,
// fails with a *TxEndedError (ErrTxEnded), and the completion refuses to
// store anything: the engine rolls back and releases the key, the client
// gets an error answer, and its retry runs again. The completion checks
// that its transaction is still the one it began, so an end no error
// revealed is caught too.
//
// Callers who run their own transaction use Store.CompleteTx, which does
// the fenced completion inside it and leaves commit and rollback to them.
//
// # One statement per claim
//
// A claim is one INSERT … ON CONFLICT (tenant_id, idem_key) DO UPDATE …
// WHERE … RETURNING (SQLite, PostgreSQL) or INSERT … ON DUPLICATE KEY
// UPDATE with IF(…) assignments (MySQL, which reports the outcome through
// the statement's last insert id): it inserts a new record, or takes over
// one past its retention (whatever its fingerprint) or one in flight
// whose lease ended (same fingerprint only). A lost claim is followed by
// one read of the record. All times come from the database clock: now()
// on PostgreSQL, UTC_TIMESTAMP(6) on MySQL, integer Unix microseconds from
// unixepoch('subsec') on SQLite; never from the application server.
//
// # SQLite
//
// SQLite has one writer at a time. Open the database with idemsqlite.Open
// (WAL, a busy timeout); the handler's transaction begins with BEGIN
// IMMEDIATE at its first statement, a read included, and holds the write
// lock until the completion commits. Meanwhile every other write waits:
// claims, extensions and completions of other keys, and those of other
// processes on the file. Within a process, the Store queues its writers
// in order, lease extensions first; a writer gives up when one holder has
// kept the lock for longer than the busy timeout. Between processes,
// SQLite's busy timeout decides. Keep the time between a
// handler's first statement and its return short; for many concurrent
// writers, use PostgreSQL or MySQL. Make every statement of a handler
// through its Tx: one on the *sql.DB would wait for the lock the handler
// holds.
//
// A duplicate request arriving while the first execution runs gets
// idem.ErrInFlight (409 in-flight), as on the other databases, unless the
// first execution's transaction holds the write lock when the duplicate
// claims: its claim, a write, then waits for that commit, and finds the
// answer to replay.
//
// While an execution's own transaction holds the lock, its lease cannot
// be taken over (a takeover is a write), so the heartbeat skips it, and if
// the transaction ends without completing, it extends the lease as it
// releases the lock. Otherwise the heartbeat's extensions queue first
// among the process's writers; a lease is lost only if the write lock
// stays out of reach for longer than the lease, as it may with leases of
// a few seconds under many writers. The fence still holds then: the slow
// execution's completion is refused, its writes rolled back.
//
// # MySQL and MariaDB
//
// Use idemmysql.Dialect with github.com/go-sql-driver/mysql; the DSN
// needs nothing special (parseTime, loc, clientFoundRows as you like). The
// tables use InnoDB. The handler's transaction runs with the session's
// autocommit off, so that no statement commits on its own, even after
// the server ended the transaction; it is turned back on at the end.
//
// DDL (CREATE, ALTER, DROP or TRUNCATE TABLE, CREATE INDEX, and the
// statements of the manual's "Statements That Cause an Implicit Commit")
// commits the transaction at once: the writes made before it are
// committed, whatever happens next, and the execution can no longer
// complete (*TxEndedError, nothing stored, key released; a retry runs the
// handler again, and its writes before the DDL with it). Create tables
// before serving (idemmigrate, your migrations); temporary tables (CREATE
// TEMPORARY TABLE) commit nothing and are fine.
//
// The completion is correct under REPEATABLE READ (the default) and READ
// COMMITTED alike, because an InnoDB UPDATE does not read the
// transaction's snapshot: it reads the latest committed row and locks it.
// A takeover committed after the handler's transaction began therefore
// makes the completion match nothing (idem.ErrLeaseLost), and a takeover
// arriving after the completion waits for its commit and then finds the
// record complete.
//
// Purge picks a bounded batch (SELECT … ORDER BY expires_at LIMIT n FOR
// UPDATE SKIP LOCKED, MySQL 8.0.1+ or MariaDB 10.6+) and deletes it row by
// row by primary key, under READ COMMITTED, where InnoDB takes no gap
// locks: claims inserting new keys never wait behind the range it
// scanned, and an expired row another session holds locked is left for a
// later pass. InnoDB may still break a deadlock between a purge and a
// claim by rolling one back; the store runs such a victim again. With
// statement-based binary logging (binlog_format=STATEMENT) InnoDB refuses
// writes under READ COMMITTED; use ROW or MIXED (the defaults).
//
// # PostgreSQL
//
// Use the default READ COMMITTED isolation: a claim meeting a row that
// another transaction holds waits for it and re-evaluates its condition on
// the committed row. Under REPEATABLE READ or SERIALIZABLE the same
// conflicts surface as serialization errors instead (safe, but they turn
// into store errors).
package idemsql
