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
// # Waiting for the first execution
//
// A duplicate that arrives while the first execution of its operation
// runs gets ErrInFlight (HTTP 409), and retries later. With
// Operation.WaitInFlight it waits up to that long instead, and gets what
// a retry would get when the first execution ends: its answer replayed,
// or, when it failed and released the key (or its lease ended), a claim of
// its own, which one waiter wins and runs while the others wait for it in
// turn. Still in flight at the deadline, it gets ErrInFlight. A waiter
// whose ctx (or Operation.WaitContext) ends stops at once.
//
// The waiters of one key in one engine share one poller, which reads the
// record after 10ms, then at a pause that doubles up to 250ms: a thousand
// waiters cost what one does. A store that implements Watcher wakes the
// poller as soon as the record changes (idempg with LISTEN/NOTIFY, across
// processes; idemredis with pub/sub; idemmem and idemsql within the
// process); the polling goes on behind it, so that a lost notification
// costs a waiter a quarter of a second, not its whole wait.
//
// # Retention
//
// A completed record is replayed for Config.Retention; past it the key
// counts as absent, decided by timestamp, before any purge. A Janitor
// deletes expired records in bounded batches.
package idem
