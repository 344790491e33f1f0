package idem

import (
	"context"
	"time"
)

// Store keeps idempotency records. Implementations: idemmem (in memory),
// idemsql (database/sql: SQLite, MySQL/MariaDB, PostgreSQL), idempg (pgx),
// idemredis and idemdynamo. Every implementation passes
// idemstoretest.Exercise.
//
// All times (lease ends, retention) are decided by the store's own clock
// (SQL now(), Redis TIME), never by the caller's, so that application
// servers with drifting clocks agree. DynamoDB has no clock a request can
// read: idemdynamo uses the application's, with a bound on the skew
// between processes added to every check.
//
// Stores must not keep the slices they are given (ClaimParams.Fingerprint,
// CompleteParams.Result.Body and Header): callers such as idemhttp reuse
// their buffers once the call returns. Copy or encode them.
//
// # Stability
//
// The interface may gain methods in minor versions until v1; stores outside
// this module should embed nothing and expect to follow.
type Store interface {
	// Claim atomically claims (tenant, key) for one execution, in one
	// store operation (never read-then-write). The claim is won when there
	// is no record, when the record is past retention, or when it is in
	// flight with an expired lease and the same fingerprint (a takeover).
	// Winning writes an in-flight record holding ClaimParams.Token until
	// now+Lease. A lost claim returns the existing record.
	//
	// A claim that fails may still take effect: a statement cancelled
	// after it was sent can run on the server later. The engine therefore
	// releases the key, fenced by Token, after every failed claim, at
	// once and again over a few seconds, unless the error wraps
	// ErrNotApplied: a store wraps it when it knows the claim did not take
	// effect (it was never sent, or the server refused it).
	Claim(ctx context.Context, p ClaimParams) (ClaimResult, error)

	// Begin opens the unit of work in which the handler's business writes
	// and the completion commit together. Stores without transactions
	// return a UnitOfWork that only completes. A store may take its
	// connection, and begin its transaction, lazily: at the handler's
	// first use, or at Complete when the handler never used it.
	Begin(ctx context.Context) (UnitOfWork, error)

	// Extend moves the end of a held lease to now+Lease (the heartbeat),
	// and the end of retention to at least the end of the lease. It returns ErrLeaseLost when the record is no longer in flight under
	// Token.
	Extend(ctx context.Context, p ExtendParams) error

	// Release deletes the in-flight record held under Token, so that the
	// next retry runs afresh. It does nothing, without error, when the
	// record is complete or held under another token. A record that holds
	// recovery points (StepStore) is not deleted: its lease is ended
	// instead, so that the next claim takes it over with its steps.
	Release(ctx context.Context, p ReleaseParams) error

	// Get reads the record for (tenant, key), whatever its state or
	// retention, or returns ErrNotFound.
	Get(ctx context.Context, tenant, key string) (*Record, error)

	// Purge deletes at most Limit records whose retention has passed and
	// which hold no live lease, and returns how many it deleted. It works
	// in a bounded batch so that claims are never blocked behind it.
	Purge(ctx context.Context, p PurgeParams) (int, error)

	// Info describes the store: its name and whether its unit of work can
	// roll back. It is constant for the store's life.
	Info() StoreInfo
}

// StoreInfo describes a Store.
type StoreInfo struct {
	// Name names the backend for logs and metrics: "postgresql", "mysql",
	// "sqlite", "redis", "memory", or a third-party store's own.
	Name string

	// Transactional is true when the unit of work is a database
	// transaction that the handler's business writes join, so that rolling
	// it back undoes them. It is false for stores that keep only the
	// records (idemredis, idemmem): a handler's effects there are made
	// elsewhere, and once the handler ran, the engine never releases its
	// key because of a cancellation or a failed completion, since a retry
	// would do those effects a second time.
	Transactional bool

	// SingleTransaction is true when the store claims a key as the first
	// statement of the unit of work (see UnitClaimer): the engine then
	// claims through ClaimUnit, runs no heartbeat and refuses recovery
	// points. The store must implement UnitClaimer.
	SingleTransaction bool
}

// UnitOfWork is one unit of work: the handler's business writes and the
// completion of the record. For SQL stores it is a database transaction.
//
// Rollback after Complete is harmless, so `defer unit.Rollback(ctx)` is
// always right. The engine itself calls Rollback only when the handler
// failed or Complete was not reached or failed: a successful Complete must
// leave nothing behind that only a Rollback would free.
type UnitOfWork interface {
	// Context returns a child of ctx through which the handler reaches the
	// store's transaction (for example idemsql.TxFromContext(ctx) or
	// idempg.TxFromContext(ctx)).
	Context(ctx context.Context) context.Context

	// Complete stores the result, fenced by the lease token, and commits
	// the unit of work. If the record is no longer in flight under the
	// token it returns ErrLeaseLost and everything, the business writes
	// included, is rolled back. When the business writes can no longer
	// commit (the handler rolled its transaction back, or a failed
	// statement aborted it), Complete stores the result alone, fenced the
	// same way; when the database ended the transaction behind the
	// handler's back (a deadlock, an implicit commit), it stores nothing
	// and returns an error.
	Complete(ctx context.Context, p CompleteParams) error

	// Rollback abandons the unit of work. The record stays in flight. It
	// returns an error when the database had ended the transaction under
	// the handler (a deadlock): the engine then stores nothing, not even
	// an answer meant to be stored without the writes (RollbackWrites).
	Rollback(ctx context.Context) error
}

// ClaimParams are the arguments of Store.Claim.
type ClaimParams struct {
	Tenant      string
	Key         string
	Fingerprint []byte
	// Token is the fresh lease token of this execution.
	Token int64
	// Lease is how long the claim holds the key without a heartbeat.
	Lease time.Duration
	// Retention is how long the record lives, counted from the claim.
	// Counting from the claim, not from the completion, keeps the
	// completion an update of unindexed columns only (a HOT update on
	// PostgreSQL); a handler outliving its retention keeps it through the
	// heartbeat, since Extend never lets the retention end before the lease.
	// It must not be shorter than Lease (the engine passes the longer of
	// the two): a record past retention counts as absent, so a shorter
	// one would let a retry take over a key whose lease still runs.
	Retention time.Duration
}

// ClaimResult is what Store.Claim returns.
type ClaimResult struct {
	// Won is true when this execution now holds the key.
	Won bool
	// Record is the existing record when the claim was lost; nil when won.
	Record *Record
	// Takeover is true when the claim was won over an in-flight record
	// whose lease had ended: an earlier execution died, was cut off, or
	// was released after it recorded steps.
	Takeover bool
	// Steps are the recovery points the earlier executions of the key
	// recorded (StepStore), in order, when the claim is a takeover.
	Steps []RecordedStep
}

// CompleteParams are the arguments of Tx.Complete.
type CompleteParams struct {
	Tenant string
	Key    string
	Token  int64
	Result Result
	// WithoutWrites asks the unit of work to roll the handler's writes
	// back and store Result alone (idem.RollbackWrites). The engine sets
	// it only on a unit that a UnitClaimer began, whose claim would roll
	// back with the writes; on other stores it rolls back and completes
	// in a new unit of work itself.
	WithoutWrites bool
}

// ExtendParams are the arguments of Store.Extend.
type ExtendParams struct {
	Tenant string
	Key    string
	Token  int64
	Lease  time.Duration
}

// ReleaseParams are the arguments of Store.Release.
type ReleaseParams struct {
	Tenant string
	Key    string
	Token  int64
}

// PurgeParams are the arguments of Store.Purge.
type PurgeParams struct {
	// Limit bounds the batch. Defaults to 1000 when zero.
	Limit int
}
