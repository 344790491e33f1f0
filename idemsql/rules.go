package idemsql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

// rules is what a dialect does its own way beyond the texts of its
// statements, as values and functions (rules_sqlite.go, rules_mysql.go,
// rules_postgres.go) that the dialect's definition carries, so that they
// are chosen once, with the dialect given to NewStore: the store's code
// runs them and never asks which database it is on.
type rules struct {
	// oneWriter is true when the database lets one transaction write at
	// a time (SQLite): the Store then queues its own writers (gate), the
	// unit's transaction holds the write lock from its first statement,
	// and a step may not come after that statement
	// (ErrStepAfterStatement).
	oneWriter bool

	// checkTenant refuses a tenant the table cannot hold, in words that
	// never quote it; nil accepts any (maxTenant aside).
	checkTenant func(tenant string) error

	// claimOnce runs the default mode's claim once (Store.Claim); exists
	// says that peek found a record.
	claimOnce func(s *Store, ctx context.Context, p idem.ClaimParams, args []any, exists bool) (claimOutcome, error)
	// claimIn runs the single-transaction mode's claim on conn, in its
	// open transaction, waiting at most wait for another transaction
	// that holds the key. A lost claim returns the record it read, when
	// it read one.
	claimIn func(s *Store, ctx context.Context, conn *sql.Conn, values map[string]any, wait time.Duration) (won, takeover bool, rec *idem.Record, err error)

	// claimFolded, when set, runs the whole of Store.Claim, its peek
	// included, where the server can fold them into fewer round trips
	// (MariaDB); ok false hands the claim back to the statements one by
	// one. claimUnitNew, when set, begins the single-transaction mode's
	// transaction and claims in it a key that ClaimUnit's read found
	// without a record, in fewer round trips; nil without error hands
	// the claim back to the general way. completeFolded folds the unit's
	// completion and commit (done false: the caller completes; true: the
	// transaction has ended, committed or not).
	claimFolded    func(s *Store, ctx context.Context, p idem.ClaimParams) (res idem.ClaimResult, ok bool, err error)
	claimUnitNew   func(s *Store, ctx context.Context, p idem.ClaimParams, wait time.Duration) (*singleUnit, error)
	completeFolded func(u *unit, ctx context.Context, p idem.CompleteParams) (done bool, err error)

	// begin returns the statements that open the unit's transaction on
	// conn, in order. beginRetries is true when the first one did nothing
	// if it failed with a retryable error, and may run again (SQLite's
	// BEGIN IMMEDIATE answered busy).
	begin        func(u *unit, ctx context.Context, conn *sql.Conn) []string
	beginRetries bool

	// endedBy reports whether err, returned by one of the handler's
	// statements on conn, came with the end of the transaction (a lost
	// connection always does; unit.endedBy checks that first).
	endedBy func(u *unit, ctx context.Context, conn *sql.Conn, err error) bool
	// intact checks, without changing it, that the open transaction is the
	// one begin opened. checkOnRollback is true when Rollback checks it
	// before rolling back (where it is one cheap round trip on a path
	// that rolls back anyway).
	intact          func(u *unit, ctx context.Context) error
	checkOnRollback bool
	// seal runs before the completion in the unit's transaction: it
	// checks that the transaction is the one begin opened and ends what
	// marked it (RELEASE SAVEPOINT), returning a *TxEndedError when the
	// database had ended it. nil where the completion statement itself
	// checks (Postgres' completeUnit); then recheck is true, and a
	// completion that matched nothing asks intact whether the lease was
	// lost or the transaction ended.
	seal    func(u *unit, ctx context.Context) error
	recheck bool
	// aborted reports a completion's error that says the transaction
	// accepts nothing but a rollback after an earlier failed statement
	// (PostgreSQL); nil where a failed statement leaves it whole.
	aborted func(err error) bool
	// commit is the statement that commits the unit's transaction and
	// leaves the connection fit for the pool. commitRetries is true when
	// a commit answered with a retryable error left the transaction open,
	// so that it may run again (SQLite's busy).
	commit        string
	commitRetries bool
	// rollback are the statements that roll the unit's transaction back
	// and leave the connection fit for the pool, run in order until one
	// fails. rollbackMayFail is true when a failed ROLLBACK means there
	// was no transaction left (SQLite ended it): the connection is fine.
	rollback        []string
	rollbackMayFail bool

	// retryable reports an error after which a statement of the store's
	// own did nothing and may simply run again; nil: none is. attempts
	// bounds the runs of a statement that keeps failing so.
	retryable func(d *dialect, err error) bool
	attempts  int

	// stepBounded is true when saveStep may match the record and still
	// be refused for the step's size (MySQL's max_allowed_packet): a step
	// that matched nothing is then told apart with held.
	stepBounded bool

	// For ListKeys and KeyStats: clockSQL selects the database's clock;
	// timeValue is a time as the dialect stores it; hourSQL is the hours
	// since the Unix epoch of a time column; prefixBytes is true when
	// substr counts bytes (VARBINARY), not characters; cursorAfter is the
	// condition of a row past the cursor (@ct, @cc, @ck).
	clockSQL    string
	timeValue   func(t time.Time) any
	hourSQL     func(col string) string
	prefixBytes bool
	cursorAfter string
}

// sealSavepoint is rules.seal where a savepoint marks the unit's
// transaction (SQLite, MySQL). The savepoint goes with its transaction:
// when the database has ended that one (a deadlock or a lock wait timeout
// rolled it back, DDL committed it), RELEASE finds no savepoint, and the
// statements since ran in another transaction (MySQL, autocommit off) or
// alone (SQLite): nothing of them may be stored as the handler's work.
// Cheap (no table, no privilege, one round trip) and exact on SQLite,
// MySQL 8 and MariaDB alike, unlike reading the transaction's id
// (information_schema, which needs the PROCESS privilege) or
// @@in_transaction (MariaDB only, and always 1 with autocommit off).
func sealSavepoint(noSavepoint func(d *dialect, err error) bool) func(u *unit, ctx context.Context) error {
	return func(u *unit, ctx context.Context) error {
		if _, err := u.conn.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint); err != nil {
			if noSavepoint(u.s.d, err) {
				return &TxEndedError{Cause: fmt.Errorf("its savepoint is gone: %w", err)}
			}
			return fmt.Errorf("idemsql: complete: %w", err)
		}
		return nil
	}
}

// intactSavepoint is rules.intact where a savepoint marks the unit's
// transaction. SAVEPOINT again with the same name moves the savepoint; it
// is ROLLBACK TO that fails when it is gone. Both leave the transaction
// open, and finish rolls all of it back next.
func intactSavepoint(u *unit, ctx context.Context) error {
	if _, err := u.conn.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("its savepoint is gone: %w", err)
	}
	return nil
}
