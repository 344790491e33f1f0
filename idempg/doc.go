// Package idempg is the PostgreSQL store of idem, on pgx v5 and its
// connection pool. It is built for speed against the physical limit: one
// statement per request more than a handler that does BEGIN; INSERT;
// COMMIT without idem (the claim), and no more round trips than that
// handler makes through pgx's Begin, Exec and Commit, because the BEGIN
// rides with the handler's first query and the completion with the
// COMMIT. A replay is answered by the claim alone, in one round trip.
//
//	pool, _ := pgxpool.New(ctx, url)
//	_ = idempg.Migrate(ctx, pool)
//	store, _ := idempg.NewStore(pool, nil)
//	engine, _ := idem.NewEngine(store, nil)
//	out, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
//		_, err := idempg.DB(ctx, pool).Exec(ctx, `INSERT INTO orders …`)
//		return idem.Result{Status: 201}, err
//	})
//
// DB returns the execution's transaction (TxFromContext) inside idem and
// the pool outside it, so a handler behind idemhttp has one code path for
// requests with and without an Idempotency-Key.
//
// # The handler's transaction
//
// The handler's writes go to a pgx.Tx that commits with its stored answer
// when it returns. What the handler does decides what is kept:
//
//   - it returns an answer: its writes and the answer commit together;
//   - it calls Rollback on the Tx (or idem.RollbackWrites(ctx)): its
//     writes are rolled back (at once, for Rollback), its answer is stored
//     and replayed without them; later statements on the Tx fail with
//     pgx.ErrTxClosed;
//   - it calls idem.NotExecuted(ctx): nothing is stored, the key is free;
//   - it returns an error: nothing is stored and the key is released.
//
// Commit refuses with ErrTxOwned: the commit is idem's, with the answer.
// Savepoints (the Tx's Begin, pgx.BeginFunc on the Tx) work as in pgx.
//
// A statement that fails aborts a PostgreSQL transaction: every later
// statement fails too, and nothing of it can commit. A handler that then
// answers (catches a unique violation and answers 409 "account exists")
// has that answer stored and replayed as it wrote it, whatever its status,
// and every write of the transaction rolled back, those made before the
// failed statement included. Answer accordingly, or return an error to
// have nothing stored. To keep the other writes, run the statement that
// may fail in a savepoint and roll back to it: the transaction is then
// live again and commits normally.
//
// A deadlock or a serialization failure (SQLSTATE class 40: 40P01, 40001)
// rolls the transaction back for good, unless the handler rolls back to a
// savepoint taken before it: then nothing of the execution is stored,
// whatever the handler answers (a 5xx and an answer after Rollback
// included), since the retry would succeed where this run did not. The
// engine releases the key and reports a store error (HTTP 503); the
// statements after it, Rollback and the completion fail with an error
// wrapping ErrTxEnded, which does not unwrap to the deadlock, so a helper
// that retries a statement on a deadlock stops at once.
//
// Two endings are never stored, since idem cannot tell what committed: a
// transaction the handler ended itself through Conn (sending COMMIT or
// ROLLBACK, or pgx's Conn.Begin), and one whose connection was lost (the
// server ended the session: idle_in_transaction_session_timeout, a
// terminated backend). The engine then answers with a store error and
// releases the key, so the retry runs the operation again.
//
// # Recovery points
//
// Store implements idem.StepStore, so handlers may record their steps
// with idem.Step:
//
//	charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (Charge, error) {
//		return cards.Charge(ctx, amount, idem.DownstreamKey(ctx, "charge"))
//	})
//
// Each step is recorded by an UPDATE of its own, on the pool, committed
// before Step returns, never in the handler's transaction: when that
// transaction rolls back (the handler failed, the process died before the
// commit), the step stays recorded, since its effect stands. An execution
// that takes the key over (after a crash, or a retry of a failed
// handler) gets the recorded results instead of running the steps again.
// A step costs one round trip and one synchronous commit; a request that
// records none pays nothing for the feature: the steps are read only by a
// claim that takes a key over, and by Get.
//
// Recording a step takes a pool connection while the handler's
// transaction, once it has sent a query, holds another: record the steps
// before the business writes (charge the card, then write the order) or
// give the pool two connections for each handler that does both at once.
// A step that cannot get a connection within the engine's Lease fails
// with idem.ErrStepNotSaved.
//
// A failed execution whose record holds steps is not deleted but kept in
// flight with its lease ended, so that the next retry with the same
// fingerprint takes it over at once, with its steps; a retry that asks
// something else meets it in flight until its retention ends. Steps stay
// on a completed record until it is purged.
//
// # Schema
//
// Migrate applies idemmigrate's PostgreSQL files to the schema the pool's
// connections use (their search_path): the idem_keys table (0001), the
// idem_complete function (0002), the steps column of recovery points
// (0003), the waiters flag with the completion that tells waiters
// (0004), and the secret that makes their notifications opaque (0005). Teams with their own migration tool apply
// idemmigrate.Files(idemmigrate.Postgres) instead. A database migrated by
// an earlier release moves forward with Migrate, which applies only the
// files it has not applied yet.
//
// # Duplicates that wait
//
// With idem.Operation.WaitInFlight (idemhttp.Config.WaitInFlight), a
// duplicate that meets its operation in flight waits for its answer. The
// Store is an idem.Watcher: the engine's poller subscribes through Watch,
// which listens on one connection per Store (taken from the pool at the
// first Watch and given back a few seconds after the last; one more
// connection than the pool's while it is open), shared by every waiter of
// every key, and marks the record waited on. The completion and the
// release of a marked record notify it, from any process; records nobody
// waits for never call pg_notify, whose commit queues on a lock shared by
// the whole server. A notification carries an opaque token, a hash of
// the tenant and the key keyed by a secret only idem's roles read: any
// role may LISTEN, and learns nothing of the keys from it. The end of a
// lease and a takeover notify nothing: the engine's polling finds them
// within a quarter of a second. The poller reads a record's state alone
// (Store.GetState), never its result or its steps, until it completed.
//
// # Single-transaction mode
//
// With Config.SingleTransaction, nothing is committed before the handler
// runs: the claim takes a PostgreSQL advisory lock named after the key, on
// the connection that then runs the handler's transaction, and the
// completed record is inserted, once, with the handler's writes, just
// before the COMMIT; the lock is released right after it, in the same
// round trip. A fresh request costs one commit, as the bare handler does;
// a replay is one read. The lock is the lease: when the process holding
// it dies, its connection closes, PostgreSQL rolls the transaction back
// and frees the key, and the next retry runs at once (no lease to wait
// out, no takeover, no heartbeat).
//
//	store, _ := idempg.NewStore(pool, &idempg.Config{SingleTransaction: true})
//	engine, _ := idem.NewEngine(store, nil)
//	mw, _ := idemhttp.NewMiddleware(engine, &idemhttp.Config{WaitInFlight: 5 * time.Second, …})
//
// A duplicate that arrives while the first execution runs waits for its
// lock, at most its operation's WaitInFlight (idemhttp's
// Config.WaitInFlight), then gets the first execution's answer replayed,
// or runs if the first rolled back; past the wait, or at once without one,
// idem.ErrInFlight (409 with Retry-After). What the mode gives up:
//
//   - an execution in flight is invisible until it commits: Get, idem
//     inspect and the console see a key only once it is complete, and
//     there is nothing in flight to release by hand (end the holder's
//     backend instead);
//   - recovery points: idem.Step fails with idem.ErrStepsUnsupported
//     before its function runs, since a step's record would roll back
//     with the crash it is for; keep handlers with steps in the default
//     mode;
//   - every execution holds a pool connection from its claim to its end,
//     and a waiting duplicate holds one while it waits: size the pool for
//     the executions and the waiters together;
//   - a handler that calls another service is protected as in the default
//     mode while its process lives (a duplicate waits instead of running),
//     but after a crash the retry runs at once, not after a lease.
//
// The lock lives in the session, so the handler's own Rollback (or
// idem.RollbackWrites, or an answer over an aborted transaction) keeps it
// until its answer is stored alone. Lock names are 64-bit hashes of the
// tenant and the key in pg_advisory_lock's one-argument space: an
// application that uses that space too may, once in 2^64, wait on a key's
// lock. Store.Claim, called directly, still claims as the default mode
// does (a committed in-flight record, under a lease), which the mode's
// claims respect. docs/BENCHMARKS.md measures the mode against the
// alternatives.
//
// # Your own transaction
//
// Callers that run their own transaction (a job queue's, a message
// consumer's) claim with Store.Claim, write, then call Store.CompleteTx
// with their transaction before committing it, as River's JobCompleteTx
// does. On a lost lease it returns idem.ErrLeaseLost and the transaction is
// aborted: roll it back.
//
// # Purge
//
// Purge deletes one bounded batch: the ctids of at most Limit rows past
// retention and holding no live lease, found through the expires_at index
// in order and locked FOR UPDATE SKIP LOCKED, then deleted by ctid in the
// same statement. A row that a claim holds at that instant is skipped, not
// waited for; a claim that meets a row the purge holds waits for one short
// statement, then inserts afresh.
//
// # Errors
//
// Driver errors are translated where they leave the package:
// pgx.ErrNoRows becomes idem.ErrNotFound, SQLSTATE IDL01 becomes
// idem.ErrLeaseLost; other errors pass through with their pgx type, for
// errors.As.
//
// # Design
//
// How the claim, the batches, the asynchronous claims and the completion
// work, and what each costs: docs/DESIGN-POSTGRESQL.md.
package idempg
