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
// # Duplicates that wait
//
// With idem.Operation.WaitInFlight (idemhttp.Config.WaitInFlight), a
// duplicate that meets its operation in flight waits for its answer. The
// Store is an idem.Watcher within its process: a completion or a release
// committed through it wakes its waiters at once. A change made by
// another process (several servers on one MySQL database) is found by the
// engine's polling, a few times a second whatever the number of waiters;
// on SQLite, written by one process, that is rarely needed. Over
// PostgreSQL, idempg wakes waiters across processes.
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
// or a full lock table (InnoDB rolls the transaction back), a deadlock or a
// serialization failure on PostgreSQL (SQLSTATE class 40), a lock wait
// timeout when innodb_rollback_on_timeout is on, an I/O error or an
// interrupt on SQLite (a statement whose context is cancelled is
// interrupted, and SQLite then rolls back the whole transaction), DDL on
// MySQL (an implicit commit). Then nothing of the execution is ever stored,
// whatever the handler answers (a 5xx, an answer after Tx.Rollback or
// idem.RollbackWrites included): the statement that revealed the end, and
// every later one, fails with a *TxEndedError (ErrTxEnded; only the first
// unwraps to the driver's error, so that a statement retried on a deadlock
// stops), and the completion refuses to store anything: the engine rolls
// back and releases the key, the client gets a store error (HTTP 503), and
// its retry runs again. The completion checks
// that its transaction is still the one it began, so an end no error
// revealed is caught too.
//
// Callers who run their own transaction use Store.CompleteTx, which does
// the fenced completion inside it and leaves commit and rollback to them.
//
// # Replays
//
// A claim begins with a read of the record. The replay of a complete
// record costs that one read and nothing more: it takes no lock and waits
// for none, not even for SQLite's write lock held by another execution. A
// first execution costs the read, the claim and the completion. On
// MariaDB the read and the claim are one compound statement, and so are
// the completion and its commit: a first execution costs three round
// trips of idem's (the claim, the transaction's beginning, the
// completion) beside the handler's statements, a replay one.
//
// On SQLite in WAL mode (idemsqlite.Open's), the claim of a new key
// commits without waiting for the disk (synchronous = NORMAL for that
// statement alone), so that a first execution waits for the disk once,
// with its completion, as the bare handler does with its commit. Nothing
// is lost when the process crashes. A crash of the machine can lose the
// claims whose executions had made nothing durable since (no completion,
// release or step): their keys are then absent, and a retry runs the
// operation once.
//
// # Recovery points
//
// The Store keeps idem.Step's recovery points (it implements
// idem.StepStore) in the steps column of idem_keys (migration
// 0003_idem_steps). A step is saved by a statement of its own, committed
// before Step returns, never in the handler's transaction: when the
// handler then fails, its writes are rolled back but the step stays
// recorded, the key stays in flight with its lease ended, and the retry
// takes it over and gets the step's result instead of running it again.
//
// On SQLite, make the steps before the handler's first statement on its
// Tx (a read included: the transaction begins IMMEDIATE, taking the write
// lock). From that statement to its end the handler's transaction holds
// the database's only write lock, so a step's record, which must not
// depend on that transaction, could not be written before the handler
// returned: idem.Step refuses such a step before running it, with
// ErrStepAfterStatement. On PostgreSQL and MySQL a step may come anywhere
// in the handler. The Store once wrote such steps to a second database
// file; nothing measured it paying for its 300 lines and the files it
// left on disk, since a payment handler makes its external call before
// its writes anyway (docs/SIDE-EFFECTS.md), so it is gone: idem creates
// no file of its own on SQLite. The step results live in the record's
// steps column until a purge deletes the record after its retention; like
// any deleted row, their bytes may stay in the WAL file until the next
// checkpoint and in free pages of the database file until they are reused
// or VACUUM runs, unless PRAGMA secure_delete is on.
//
// # Single-transaction mode
//
// With the SingleTransaction option (idem serve --single-transaction),
// nothing is committed before the handler runs: the claim is the first
// statement of the handler's own transaction, so the key's record is
// written, in flight, by that transaction, and commits complete with the
// handler's writes and the answer, in one commit per request, or not at
// all. The transaction's hold on the record is the lease:
//
//   - MySQL and MariaDB: the claim's row, inserted and not yet committed,
//     is locked by InnoDB until the transaction ends. On MariaDB the claim
//     of a key without a record and the transaction's beginning are one
//     round trip, and the completion and the commit another.
//   - PostgreSQL: the same, on the row the claim inserted.
//   - SQLite: the transaction holds the database's only write lock from
//     BEGIN IMMEDIATE to its end, so one execution of the Store runs at a
//     time, and the claim is its first statement.
//
// Set it up with the option, and give duplicates a wait:
//
//	store, _ := idemsql.NewStore(db, idemmysql.Dialect, idemsql.SingleTransaction())
//	engine, _ := idem.NewEngine(store, nil)
//	mw, _ := idemhttp.NewMiddleware(engine, &idemhttp.Config{WaitInFlight: 5 * time.Second, …})
//
// A replay is one read, as in the default mode. A duplicate that comes
// while the first execution runs waits for that transaction, at most its
// operation's WaitInFlight (idemhttp's Config.WaitInFlight): the claim's
// wait on the row is bounded by max_statement_time for that statement
// on MariaDB (at least 100 ms: the bound covers the whole statement), by
// its context on
// MySQL, by lock_timeout on PostgreSQL, and on SQLite by the wait for the
// write lock: for a holder of the same Store, only a duplicate's wait is
// bounded (another key's claim queues as any writer), while a holder in
// another process, which may run any key, is waited for at most the wait
// limit, and at least 100 ms. When the holder commits, the duplicate replays its
// answer; when it rolls back, or its process dies and the database rolls
// its transaction back, the duplicate claims the key and runs. Past the
// wait, or at once without one, it gets idem.ErrInFlight (HTTP 409 with
// Retry-After). What the mode gives up:
//
//   - an execution in flight is invisible until it commits: Get, Watch,
//     idem inspect and the console see a key only once it is complete
//     (or not at all, if it rolls back), and there is nothing in flight
//     to release by hand;
//   - recovery points: idem.Step fails with idem.ErrStepsUnsupported
//     before its function runs, since a step's record would roll back with
//     the crash it is for; keep handlers with steps in the default mode;
//   - the execution holds a connection (on SQLite, the write lock) from
//     its claim to its end, even while the handler calls another service,
//     and a waiting duplicate holds one while it waits: size the pool for
//     the executions and the waiters together;
//   - after a crash, the retry runs at once rather than after a lease: a
//     call the handler made to another service before the crash is made
//     again.
//
// An answer stored without the writes (Tx.Rollback, idem.RollbackWrites,
// an answer over an aborted transaction) is stored by a second
// transaction that claims the key again under the same token; if another
// execution claimed it in between, nothing of this one is stored
// (idem.ErrLeaseLost). Store.Claim and Store.Begin, called directly, keep
// the default mode's behaviour (a committed in-flight record under a
// lease), which the mode's claims respect. docs/BENCHMARKS.md measures the
// mode against the bare handler.
//
// # Design
//
// How the claim works, and what to know of SQLite (the busy timeout,
// one writer), MySQL and MariaDB (the DSN, the isolation level, what the
// server may end under the handler) and PostgreSQL through database/sql:
// docs/DESIGN-SQL.md. What each database guarantees: docs/STORES.md.
package idemsql
