package idempg

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTxEnded is wrapped by the errors of Complete, of the unit's Rollback,
// of the Tx's Rollback and of the statements that follow, once
// PostgreSQL rolled the handler's transaction back under it: a deadlock or
// a serialization failure (SQLSTATE class 40, "transaction rollback")
// aborted it, and the handler did not roll back to a savepoint taken
// before. Nothing of the execution is stored then, whatever the handler
// answers (a 5xx, or an answer after Rollback, included): the engine
// releases the key and reports a store error (HTTP 503), so that the retry
// runs the operation again, which an answer given after a deadlock says
// nothing about. The errors that wrap it do not unwrap to the deadlock
// itself, so that a helper that runs a statement again on a deadlock stops
// at once.
var ErrTxEnded = errors.New("idempg: PostgreSQL rolled the handler's transaction back")

// txGoneError reports a transaction PostgreSQL rolled back under the
// handler (cause, a class 40 error); err, when set, is the error of the
// statement refused since (25P02).
type txGoneError struct {
	cause error
	err   error
}

func (e *txGoneError) Error() string {
	return fmt.Sprintf("idempg: the handler's transaction is gone: PostgreSQL rolled it back (%v); nothing of this execution will be stored: "+
		"return an error, so that the key is released and a retry runs again", e.cause)
}

// Unwrap returns ErrTxEnded, pgx.ErrTxClosed and the refused statement's
// own error, never the cause, which a retry helper would take for
// retryable.
func (e *txGoneError) Unwrap() []error {
	if e.err != nil {
		return []error{ErrTxEnded, pgx.ErrTxClosed, e.err}
	}
	return []error{ErrTxEnded, pgx.ErrTxClosed}
}

// rolledBackBy is the class 40 error that aborted a unit's transaction.
type rolledBackBy struct{ err error }

// lostTo returns the error that rolled the unit's transaction back, or nil.
func (u *unit) lostTo() error {
	if l := u.lost.Load(); l != nil {
		return l.err
	}
	return nil
}

// gone returns the error of a unit whose transaction was rolled back.
func (u *unit) gone() error { return &txGoneError{cause: u.lostTo()} }

// saw looks at the error of one of the handler's statements: a class 40
// error marks the transaction lost (the first one is kept); a statement
// refused since (25P02) says the transaction is gone.
func (u *unit) saw(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case strings.HasPrefix(pgErr.Code, "40"):
		u.lost.CompareAndSwap(nil, &rolledBackBy{err})
	case pgErr.Code == "25P02":
		if cause := u.lostTo(); cause != nil {
			return &txGoneError{cause: cause, err: err}
		}
	}
	return err
}

// recovered is called when the handler rolled back to a savepoint: a
// class 40 error met since is undone with it (none can come before the
// savepoint, which an aborted transaction refuses to take).
func (u *unit) recovered() { u.lost.Store(nil) }

// watchedRows are the rows of a handler's query, whose error saw reads.
type watchedRows struct {
	pgx.Rows
	u *unit
}

func (r *watchedRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	_ = r.u.saw(r.Rows.Err())
	return false
}

func (r *watchedRows) Close() {
	r.Rows.Close()
	_ = r.u.saw(r.Rows.Err())
}

func (r *watchedRows) Err() error { return r.u.saw(r.Rows.Err()) }

func (r *watchedRows) Scan(dest ...any) error { return r.u.saw(r.Rows.Scan(dest...)) }

// watchedRow is a handler's QueryRow, whose error saw reads.
type watchedRow struct {
	pgx.Row
	u *unit
}

func (r watchedRow) Scan(dest ...any) error { return r.u.saw(r.Row.Scan(dest...)) }

// watchedBatch are the results of a handler's batch, whose errors saw
// reads.
type watchedBatch struct {
	pgx.BatchResults
	u *unit
}

func (b watchedBatch) Exec() (pgconn.CommandTag, error) {
	tag, err := b.BatchResults.Exec()
	return tag, b.u.saw(err)
}

func (b watchedBatch) Query() (pgx.Rows, error) {
	rows, err := b.BatchResults.Query()
	if err != nil {
		return rows, b.u.saw(err)
	}
	return &watchedRows{Rows: rows, u: b.u}, nil
}

func (b watchedBatch) QueryRow() pgx.Row { return watchedRow{b.BatchResults.QueryRow(), b.u} }

func (b watchedBatch) Close() error { return b.u.saw(b.BatchResults.Close()) }
