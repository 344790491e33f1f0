package idemsql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

// sqliteRules is how SQLite runs what differs: a single writer at a time.
var sqliteRules = rules{
	oneWriter:    true,
	claimOnce:    (*Store).claimSQLite,
	claimUnitNew: (*Store).claimNewSQLite,
	claimIn: func(s *Store, ctx context.Context, conn *sql.Conn, values map[string]any, _ time.Duration) (bool, bool, *idem.Record, error) {
		return s.claimInSQLite(ctx, conn, values)
	},
	// IMMEDIATE takes the write lock now: a deferred transaction that read
	// first could not take it later if another connection had written
	// meanwhile (SQLITE_BUSY at once, whatever the busy timeout). Busy
	// here means BEGIN IMMEDIATE did not begin, nor the SAVEPOINT after
	// it (the driver runs the statements of one text in order, stopping
	// at the first error): it may run again.
	begin: func(*unit, context.Context, *sql.Conn) []string {
		return []string{"BEGIN IMMEDIATE; SAVEPOINT " + savepoint}
	},
	beginRetries:   true,
	completeFolded: (*unit).completeSQLite,
	endedBy:        sqliteEndedBy,
	intact:         intactSavepoint,
	// One round trip, on a path that is rolling back anyway.
	checkOnRollback: true,
	seal: sealSavepoint(func(_ *dialect, err error) bool {
		// RELEASE of a savepoint that is not there: the generic error.
		return sqliteCode(err) == sqliteError
	}),
	// A COMMIT answered busy leaves the transaction open: it may run
	// again.
	commit:        "COMMIT",
	commitRetries: true,
	rollback:      []string{"ROLLBACK"},
	// No transaction to roll back (SQLite ended it): the connection is
	// fine.
	rollbackMayFail: true,

	// SQLite could not take its lock: the statement did nothing. It
	// answers busy only once its busy timeout has run out, or without
	// waiting while another connection recovers the WAL, and each run
	// waits that long again: few attempts.
	retryable: func(_ *dialect, err error) bool { return sqliteCode(err) == sqliteBusy },
	attempts:  3,

	clockSQL:    `SELECT ` + sqliteNow,
	timeValue:   func(t time.Time) any { return t.UnixMicro() },
	hourSQL:     func(col string) string { return col + ` / 3600000000` },
	cursorAfter: `(tenant_id, created_at, idem_key) > (@ct, @cc, @ck)`,
}

// sqliteEndedBy is rules.endedBy on SQLite. SQLite may roll the whole
// transaction back after an error (SQLITE_FULL, SQLITE_IOERR,
// SQLITE_NOMEM, an interrupt, which is how the driver honours a cancelled
// context, or an ON CONFLICT ROLLBACK), and says nothing of it. BEGIN
// tells: inside a transaction it fails and changes nothing; outside one,
// it begins one, which the probe ends at once.
func sqliteEndedBy(_ *unit, ctx context.Context, conn *sql.Conn, _ error) bool {
	probe := context.WithoutCancel(ctx)
	if _, err := conn.ExecContext(probe, "BEGIN"); err == nil {
		_, _ = conn.ExecContext(probe, "ROLLBACK")
		return true
	}
	return false
}

// completeSQLite is rules.completeFolded on SQLite: the savepoint's
// release and the completion in one call (sqliteSealedComplete), then the
// commit. It ends the transaction either way.
func (u *unit) completeSQLite(ctx context.Context, p idem.CompleteParams) (done bool, _ error) {
	args, err := completeArgs(sqliteSealedComplete, p, "")
	if err != nil {
		u.finish(ctx)
		return true, err
	}
	u.disown()
	res, err := u.conn.ExecContext(ctx, sqliteSealedComplete.text, args...)
	if err != nil {
		u.finish(ctx)
		if sqliteCode(err) == sqliteError {
			// RELEASE of a savepoint that is not there.
			return true, &TxEndedError{Cause: fmt.Errorf("its savepoint is gone: %w", err)}
		}
		return true, fmt.Errorf("idemsql: complete: %w", err)
	}
	if err := fenced(res); err != nil {
		u.finish(ctx)
		return true, err
	}
	if err := u.commit(ctx); err != nil {
		return true, fmt.Errorf("idemsql: commit: %w", err)
	}
	return true, nil
}
