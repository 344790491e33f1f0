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
// Two endings are never stored, since idem cannot tell what committed: a
// transaction the handler ended itself through Conn (sending COMMIT or
// ROLLBACK, or pgx's Conn.Begin), and one whose connection was lost (the
// server ended the session: idle_in_transaction_session_timeout, a
// terminated backend). The engine then answers with a store error and
// releases the key, so the retry runs the operation again.
//
// # Schema
//
// Migrate applies idemmigrate's PostgreSQL files to the schema the pool's
// connections use (their search_path): the idem_keys table (0001) and the
// idem_complete function (0002). Teams with their own migration tool apply
// idemmigrate.Files(idemmigrate.Postgres) instead.
//
// # The claim: one statement
//
// Claim is a single statement, so a single round trip and its own implicit
// transaction: a CTE reads the current row, an INSERT … ON CONFLICT
// (tenant_id, idem_key) DO UPDATE … WHERE writes the claim, and the final
// SELECT returns either "won" or the record that holds the key. The update
// happens only when the row is past retention, or in flight with an
// expired lease and the same fingerprint (a takeover); lease and retention
// travel as microsecond integers added to the server's now(), never as
// timestamps from an application server's clock.
//
// Why it is safe: the write is decided by ON CONFLICT against the latest
// committed version of the row, under the unique index, so two claims can
// never both win, whatever their snapshots saw. The statement writes only
// when its read found no row or a claimable one; a key that is held (a
// replay, a duplicate in flight) is answered from the read, with no row
// lock, no transaction id and no WAL. Skipping the write can only make a
// claim lose, never win, and losing is always safe (nothing runs). When
// the write was attempted but refused because a concurrent claim committed
// the row after the statement's snapshot was taken, the statement cannot
// see that row; Claim then runs it once more, with a fresh snapshot, which
// reads the winner's record (or claims, if the winner released it in the
// meantime). A record read from a snapshot may be a moment old ("in
// flight" when it just completed); the caller then answers 409 and the
// client's retry gets the replay.
//
// # Claims in batches
//
// Claims made at the same time by one Store share a statement: while one
// claim statement runs, the claims that arrive queue, and go out together
// as the next one (claimBatchSQL: the same CTE over unnest'ed arrays), up
// to Config.ClaimBatchSize. A claim that finds nothing running goes out
// at once, alone, so batching never makes a lone request wait; under load
// a claim waits at most for the statement in flight, as in a group
// commit. What is shared is the round trip, the statement's fixed cost
// and its (asynchronous) commit: under 16 concurrent requests the claim
// statements of a fresh-key load fell from one per request to about one
// per four, and replays to one per six (docs/BENCHMARKS.md).
//
// Each claim keeps the guarantees of the single statement, because each
// row is still decided by ON CONFLICT against the latest committed version
// under the unique index. A batch of one is sent as the single statement,
// which costs the server less. Two claims of one key are never two rows of
// a batch (ON CONFLICT may not touch a row twice in one statement). A
// later claim with the same fingerprint follows the first: if the first
// loses, the follower gets the same record, the row both would have read
// at the same instant (a burst of retries of a completed request costs one
// read); if the first wins, the follower queues again and finds the key
// held. A later claim with another fingerprint waits for the next batch. Rows are
// written in (tenant, key) order, so two batches from two processes take
// their locks in the same order and cannot deadlock. A batch is answered
// only once its statement has returned, that is once its implicit
// transaction has committed; if it fails, every claim in it fails with the
// same error and none was written. A caller that gives up (its context
// ends) while its claim is queued is dropped from the batch; if its claim
// was already sent and is won, the Store releases it at once, fenced by
// its token, so that the key is not left in flight until the lease
// expires. The statement is cancelled only when every caller in the batch
// has given up.
//
// By default one claim statement runs at a time (Config.ClaimConcurrency),
// which makes the batches largest. That suits a database whose CPU is the
// limit, as on the machine of docs/BENCHMARKS.md, where it took fresh-key
// throughput from 0.56× to 0.63× a bare handler's and replays from 1.9× to
// 3.5×. Where the database is a few milliseconds away and idle, round trips
// are the limit, and waiting for the statement in flight costs more than
// batching saves: with 2 ms between the application and PostgreSQL the
// same load ran at 0.73× (fresh keys) and 1.4× (replays) batched, 0.78×
// and 2.0× with ClaimConcurrency 4, and 0.87× and 2.7× with one statement
// per claim. Set Config.ClaimBatchSize to 1 for one statement per claim,
// each on its own pool connection, as before batching existed.
//
// # Asynchronous claims
//
// The claim statement calls set_config('synchronous_commit', 'off', true)
// in a subquery of its INSERT: the setting holds for the claim's own
// implicit transaction only, whose commit then returns without waiting for
// its WAL to reach the disk (a claim that writes nothing, a replay, has
// nothing to flush anyway). Everything else idempg commits (completions,
// releases, heartbeats) and the handler's transaction use the session's
// setting, on by default. The saving is one WAL flush per request.
//
// What that keeps: PostgreSQL writes and flushes its WAL in order, and a
// synchronous commit returns once the WAL is on disk up to its own commit
// record. An execution's completion commits after its claim returned, so
// it flushes the claim too: a crash never loses a claim whose answer was
// stored. What a crash of the server (or of its machine) can lose is the
// claims made since the last flush (at most 3 × wal_writer_delay, 600 ms
// by default, and none that a synchronous commit, of any session, has
// flushed since): their executions had neither completed nor been
// released, and had committed no business write, so after the crash their
// keys are absent (or back to the expired record a takeover replaced),
// and a retry runs the operation once. docs/STORES.md has the detail, and the conditions: the business
// transactions must commit synchronously (synchronous_commit on, the
// default), as they must for their own writes to survive a crash.
//
// # The completion rides with the COMMIT
//
// The handler's transaction (TxFromContext) is a pgx.Tx that delegates
// every query to the real transaction (begun on its first query, see
// below). Complete then sends, in one write and one round trip, the
// pipeline SELECT
// idem_complete(…), COMMIT, Sync, which the server answers in one write
// too. idem_complete (a plpgsql function, migration 0002) updates the
// record WHERE tenant, key, lease_token and state = 'in_flight', and
// raises SQLSTATE IDL01 (SQLStateLeaseLost) when no row matched: the lease
// was taken over or released. The error aborts the transaction and the
// server skips the COMMIT; Complete then sends ROLLBACK, business writes
// included (a second round trip, on that path only), and idempg answers
// idem.ErrLeaseLost. (A Sync between the two statements would turn the
// COMMIT into a ROLLBACK without that round trip, but the server would
// then answer every completion in two writes, one before the WAL flush
// and one after: one more write and one more wake-up on both sides of
// every request, to save one on a rare one.)
//
// When a failed statement aborted the transaction, Complete sends ROLLBACK,
// SELECT idem_complete(…), Sync instead: one round trip that ends the
// transaction and stores the answer in an implicit transaction of its own,
// fenced the same way. A handler that wrote nothing, or rolled back, has
// its answer stored by the same statement alone, through the pool.
//
// The connection goes back to the pool only when it is idle (outside any
// transaction); pgxpool destroys one that a failure left in a transaction,
// busy or closed. After Complete or Rollback the handler's Tx, and its
// savepoints, refuse work with pgx.ErrTxClosed, since the connection may
// already serve another request.
//
// # BEGIN rides with the first query
//
// Store.Begin takes nothing from the pool: the handler's first query
// acquires the connection, so a handler that first calls a slow service
// (a card network) holds none while it waits, and a pool smaller than the
// number of requests in flight is shared by the ones that query. The
// BEGIN is sent in front of that first query, in the same round trip (a pgx.Batch
// begun with BeginTx, whose single Sync is right here: if the query fails,
// the transaction is begun and aborted, as it would be after a BEGIN of
// its own). A request through idem therefore costs three round trips:
// the claim, BEGIN with the first write, and the completion with the
// COMMIT; the same write through pgx's Begin, Exec and Commit costs three
// too. Measured against a handler that pipelines its own BEGIN (two round
// trips), the claim is the one extra.
//
// Statements that cannot carry it (CopyFrom, a savepoint, Exec without
// arguments, which pgx sends through the simple protocol, LargeObjects,
// Conn) send the BEGIN by itself first. Prepare needs no transaction. A
// handler that sends nothing takes no connection and begins nothing: its
// completion is one statement through the pool. Beginning late changes nothing the handler can see: PostgreSQL
// takes a transaction's snapshot at its first statement, not at BEGIN.
//
// # Cost
//
// Counted on the wire by TestRoundTrips (one write per round trip):
//
//	without idem:  BEGIN | INSERT | COMMIT                3 round trips, 1 WAL flush
//	fresh key:     claim | BEGIN+INSERT | complete+COMMIT 3 round trips, 1 WAL flush
//	replay:        claim                                  1 round trip, no write
//	no query:      claim | complete                       2 round trips, 1 WAL flush
//	failed INSERT: claim | BEGIN+INSERT | ROLLBACK+complete 3 round trips, 1 WAL flush
//
// BenchmarkBareTx, BenchmarkEngineFresh and BenchmarkEngineReplay measure
// the same three; the BenchmarkVariant… benchmarks undo one design step
// each, to show what it buys.
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
// # Isolation
//
// The claim, Extend, Release and Purge run as single statements in the
// connection's default isolation, which must be READ COMMITTED (the
// PostgreSQL default): ON CONFLICT under REPEATABLE READ or SERIALIZABLE
// fails with a serialization error when it meets a row its snapshot cannot
// see. The handler's transaction is begun in the default isolation too.
package idempg
