package idemsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
)

var (
	// ErrTxOwned is returned by Tx.Commit: the handler's transaction
	// commits with its answer when it returns.
	ErrTxOwned = errors.New("idemsql: Tx.Commit is refused: the handler's transaction commits together with its answer when the handler returns. " +
		"Return normally to commit the writes with the answer; call Tx.Rollback or idem.RollbackWrites(ctx) to store the answer without the writes; " +
		"call idem.NotExecuted(ctx) when the request did nothing, so that nothing is stored")

	// ErrTxRolledBack is returned by the statements of a handler that
	// rolled its transaction back (Tx.Rollback).
	ErrTxRolledBack = errors.New("idemsql: the handler rolled its transaction back (Tx.Rollback), which takes no more statements; " +
		"the answer the handler returns is stored without its writes. To keep writes, return an error instead (nothing is stored, and a retry runs again)")

	// ErrTxEnded is wrapped by every *TxEndedError.
	ErrTxEnded = errors.New("idemsql: the database ended the handler's transaction")

	// errUnitDone is returned by the statements of a handler's Tx used
	// after the execution ended (from a goroutine that outlived the
	// handler).
	errUnitDone = fmt.Errorf("idemsql: the execution has ended, and its transaction with it; a Tx is valid only while its handler runs: %w", sql.ErrTxDone)
)

// TxEndedError reports that the database ended the handler's transaction
// under it: InnoDB rolled it back (a deadlock, a lock wait timeout with
// innodb_rollback_on_timeout, a full lock table), PostgreSQL rolled it
// back (a deadlock or a serialization failure, SQLSTATE class 40: the
// transaction stays open but nothing in it can commit), a statement
// committed it implicitly (DDL on MySQL and MariaDB), SQLite rolled it back
// after a failed statement (a cancelled context interrupts it, and an
// interrupted write rolls the transaction back; INSERT OR ROLLBACK), or the
// connection was lost. The writes made before it are gone, or, after DDL,
// committed; those after it never commit. Nothing of the execution is
// stored, whatever the handler answers: the engine rolls back, releases the
// key and reports a store error (HTTP 503), so that a retry runs the
// operation again.
//
// Only the error of the statement that revealed the end unwraps to the
// driver's error (a deadlock, say); the errors of the statements after it,
// of Tx.Rollback and of the completion unwrap to ErrTxEnded alone, so that
// a helper that runs a statement again on a deadlock stops at once instead
// of retrying for ever against a transaction that is gone.
type TxEndedError struct {
	// Cause is the error that revealed the end.
	Cause error
	// later is true for the errors after the statement that revealed the
	// end: they no longer unwrap to Cause.
	later bool
}

func (e *TxEndedError) Error() string {
	if e.later {
		return fmt.Sprintf("idemsql: the handler's transaction is gone: the database ended it earlier (%v); it takes no more statements and nothing of this execution will be stored: "+
			"return an error, so that the key is released and a retry runs again", e.Cause)
	}
	return fmt.Sprintf("idemsql: the database ended the handler's transaction (%v); it takes no more statements and nothing of this execution will be stored: "+
		"return an error, so that the key is released and a retry runs again", e.Cause)
}

// Unwrap returns ErrTxEnded, and the cause for the statement that
// revealed the end.
func (e *TxEndedError) Unwrap() []error {
	if e.later {
		return []error{ErrTxEnded}
	}
	return []error{ErrTxEnded, e.Cause}
}

// txGone is the error of whatever is asked of a unit after its
// transaction ended with cause.
func txGone(cause error) error { return &TxEndedError{Cause: cause, later: true} }

// errRow returns a *sql.Row whose Err and Scan report err, for
// Tx.QueryRowContext, which returns no error of its own. database/sql has
// no constructor for one: it comes from a query on a database whose
// connector fails every connection with the error the query's context
// carries.
func errRow(err error) *sql.Row {
	failingOnce.Do(func() { failing = sql.OpenDB(failConnector{}) })
	return failing.QueryRowContext(context.WithValue(context.Background(), failKey{}, err), "")
}

var (
	failingOnce sync.Once
	failing     *sql.DB
)

type failKey struct{}

// failConnector's Connect fails with the error under failKey.
type failConnector struct{}

func (failConnector) Connect(ctx context.Context) (driver.Conn, error) {
	if err, ok := ctx.Value(failKey{}).(error); ok {
		return nil, err
	}
	return nil, errors.New("idemsql: no connection")
}

func (failConnector) Driver() driver.Driver { return failDriver{} }

type failDriver struct{}

func (failDriver) Open(string) (driver.Conn, error) { return nil, errors.New("idemsql: no connection") }
