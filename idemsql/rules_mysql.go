package idemsql

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	"github.com/idem-go/idem"
)

// mysqlRules is how MySQL and MariaDB run what differs.
var mysqlRules = rules{
	claimOnce: (*Store).claimStatement,
	claimIn:   (*Store).claimInMySQL,
	// With autocommit off, no statement of the session commits on its
	// own: if the server ends the transaction (a deadlock rolls it back,
	// DDL commits it), what follows opens another transaction, which the
	// completion finds and rolls back, instead of committing statement by
	// statement. The first statement opens the transaction; the savepoint
	// marks it.
	// On MariaDB both go in one compound statement (mariaBegin).
	begin: func(u *unit, ctx context.Context, conn *sql.Conn) []string {
		if u.s.isMariaDB(ctx, conn) {
			return []string{mariaBegin}
		}
		return []string{"SET autocommit = 0", "SAVEPOINT " + savepoint}
	},
	claimFolded:     (*Store).claimMariaDB,
	claimUnitNew:    (*Store).claimNewMariaDB,
	completeFolded:  (*unit).completeMariaDB,
	endedBy:         mysqlEndedBy,
	intact:          intactSavepoint,
	checkOnRollback: true,
	seal: sealSavepoint(func(d *dialect, err error) bool {
		n, ok := d.number(err)
		return ok && n == mysqlNoSavepoint
	}),
	// Turning autocommit back on commits the open transaction and
	// restores the session for the pool in one round trip; if the commit
	// fails, so does the SET, and autocommit stays off. Never run again: a
	// failed commit (a Galera certification conflict answers a deadlock)
	// has rolled back, and a second SET would report a commit of nothing.
	commit:   "SET autocommit = 1",
	rollback: []string{"ROLLBACK", "SET autocommit = 1"},

	// An InnoDB deadlock rolled back the statement's whole transaction.
	// InnoDB may choose the same victim again.
	retryable: func(d *dialect, err error) bool {
		n, ok := d.number(err)
		return ok && n == mysqlDeadlock
	},
	attempts: 5,

	stepBounded: true,

	clockSQL: `SELECT UTC_TIMESTAMP(6)`,
	timeValue: func(t time.Time) any {
		return t.UTC().Format("2006-01-02 15:04:05.000000")
	},
	hourSQL: func(col string) string {
		return `TIMESTAMPDIFF(HOUR, '1970-01-01 00:00:00', ` + col + `)`
	},
	prefixBytes: true, // VARBINARY counts bytes
	// Spelled out: MariaDB does not range-scan an index for a row
	// comparison.
	cursorAfter: `(tenant_id > @ct OR (tenant_id = @ct AND (created_at > @cc OR (created_at = @cc AND idem_key > @ck))))`,
}

// mysqlEndedBy is rules.endedBy on MySQL: a deadlock and a full lock table
// roll the whole transaction back, and so does a lock wait timeout when
// innodb_rollback_on_timeout is on.
func mysqlEndedBy(u *unit, ctx context.Context, conn *sql.Conn, err error) bool {
	n, ok := u.s.d.number(err)
	if !ok {
		return false
	}
	switch n {
	case mysqlDeadlock, mysqlLockTableFull:
		return true
	case mysqlLockWaitTimeout:
		return u.s.rollsBackOnTimeout(ctx, conn)
	}
	return false
}

// rollsBackOnTimeout reports whether InnoDB rolls back the whole
// transaction on a lock wait timeout, read once from the server (a global,
// read-only setting); when it cannot be read, it answers yes, which at
// worst refuses the statements of a transaction that was still whole.
func (s *Store) rollsBackOnTimeout(ctx context.Context, conn *sql.Conn) bool {
	switch s.rollbackOnTimeout.Load() {
	case 1:
		return false
	case 2:
		return true
	}
	var on bool
	if err := conn.QueryRowContext(context.WithoutCancel(ctx), `SELECT @@innodb_rollback_on_timeout`).Scan(&on); err != nil {
		return true
	}
	v := int32(1)
	if on {
		v = 2
	}
	s.rollbackOnTimeout.Store(v)
	return on
}

// claimInMySQL is rules.claimIn on MySQL and MariaDB: the claim
// statement, its wait on a row another transaction inserted bounded by
// the statement's time limit (MariaDB, mariaWaitBound) or the context
// (MySQL).
func (s *Store) claimInMySQL(ctx context.Context, conn *sql.Conn, values map[string]any, wait time.Duration) (won, takeover bool, rec *idem.Record, err error) {
	text, claimCtx := s.d.claim.text, ctx
	if s.isMariaDB(ctx, conn) {
		text = mariaWaitBound(wait) + text
	} else if wait >= 0 {
		// MySQL has no per-statement lock wait: the context bounds
		// it, and the driver closes the connection when it ends.
		var cancel context.CancelFunc
		claimCtx, cancel = context.WithTimeout(ctx, max(wait, time.Millisecond))
		defer cancel()
	}
	res, err := conn.ExecContext(claimCtx, text, s.d.claim.args(values)...)
	if err != nil {
		if n, ok := s.d.number(err); (ok && (n == mysqlLockWaitTimeout || n == mariaStatementTimeout)) || (claimCtx != ctx && ctx.Err() == nil && claimCtx.Err() != nil) {
			return false, false, nil, fmt.Errorf("idemsql: %w (waited %s for its transaction)", idem.ErrInFlight, wait)
		}
		return false, false, nil, err
	}
	// See mysqlDialect.claim: 0 lost, 1 won, 2 won by a takeover.
	id, err := res.LastInsertId()
	if err != nil {
		return false, false, nil, err
	}
	return id == 1 || id == 2, id == 2, nil, nil
}

// mariaMinWait is the shortest time limit mariaWaitBound gives a claim
// that may wait: the limit bounds the whole statement, not only its wait
// for a lock, and a claim of a fresh key on a busy server must not end in
// idem.ErrInFlight for being slow.
const mariaMinWait = 100 * time.Millisecond

// mariaWaitBound is the prefix that bounds a MariaDB claim's wait for a
// row another transaction holds to wait, for that statement only (a
// compound statement as a whole: MariaDB applies no time limit to the
// statements inside one). innodb_lock_wait_timeout counts whole seconds
// and 0 does not wait at all, so a wait below a second is bounded by
// max_statement_time (fractional seconds, at least mariaMinWait), with
// the lock wait timeout rounded up behind it. Past the bound the
// statement fails with mariaStatementTimeout or mysqlLockWaitTimeout.
func mariaWaitBound(wait time.Duration) string {
	if wait <= 0 {
		return "SET STATEMENT innodb_lock_wait_timeout = 0 FOR "
	}
	secs := (wait + time.Second - 1) / time.Second
	limit := max(wait, mariaMinWait)
	return "SET STATEMENT innodb_lock_wait_timeout = " + strconv.FormatInt(int64(secs), 10) +
		", max_statement_time = " + strconv.FormatFloat(limit.Seconds(), 'f', 3, 64) + " FOR "
}
