// Package idem makes retried requests harmless: an operation named by an
// idempotency key runs once, and every retry gets the first answer back.
//
// # The engine
//
// Engine.Do claims (tenant, key) in one atomic store operation, then
// decides from the record's three states (absent, in flight, complete):
// run the function, replay the stored result, answer "in flight", or refuse
// a key reused for another request. When it runs the function, it hands it
// the store's transaction and completes the record inside that same
// transaction, fenced by the lease token: either the business write and
// the stored result both exist, or neither does.
//
// The engine knows nothing of HTTP. idemhttp adapts it to net/http,
// ideminbox to message consumers.
//
// # Stores
//
// A Store keeps the records: idemsql (SQLite, MySQL/MariaDB, PostgreSQL
// through database/sql), idempg (PostgreSQL through pgx), idemredis and
// idemmem. All of them pass the conformance suite in idemstoretest.
//
// # Leases and fencing
//
// A claim holds the key for Config.Lease and carries a fresh lease token.
// While the function runs, a heartbeat extends the lease. If the process
// dies, the lease ends and a retry takes the key over with a new token; the
// old execution, should it wake up, cannot complete, because completion
// requires its token.
//
// # Retention
//
// A completed record is replayed for Config.Retention; past it the key
// counts as absent, decided by timestamp, before any purge. A Janitor
// deletes expired records in bounded batches.
package idem
