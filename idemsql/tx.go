package idemsql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// txKey is the context key under which TxFromContext finds the handler's
// transaction.
type txKey struct{}

// DBTX is what *Tx, *sql.DB, *sql.Tx and *sql.Conn have in common: the
// interface sqlc generates for database/sql, so that generated queries run
// in the handler's transaction unchanged (New(idemsql.DB(ctx, db))).
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Tx is the handler's transaction: its business writes commit together
// with the stored answer when the handler returns, or not at all. Get it
// with TxFromContext, or DB.
//
// It begins at its first statement, not before: a handler that calls a
// slow service first holds no connection meanwhile, and one that makes no
// statement costs a single one, the completion.
//
// Its end belongs to idem. Commit is refused (ErrTxOwned). Rollback undoes
// the writes at once, and the answer the handler then returns is stored
// and replayed without them; statements after it fail with
// ErrTxRolledBack. When the database ends the transaction under the
// handler (a deadlock, a serialization failure on PostgreSQL, a lock wait
// timeout that rolled it back, a failed statement after which SQLite
// rolled it back), the statement's error is a *TxEndedError, every later
// statement fails with one too (which no longer unwraps to the driver's
// error: a statement retried on a deadlock stops at once), and nothing of
// the execution is stored, whatever the handler answers: return an error.
//
// A Tx is safe for concurrent use, as a *sql.Tx is, and is valid only
// while the handler runs. Send COMMIT, ROLLBACK or BEGIN through its
// methods, never as SQL text.
type Tx struct{ u *unit }

var _ DBTX = (*Tx)(nil)

// TxFromContext returns the transaction of the idem execution that ctx
// belongs to, or nil outside one:
//
//	tx := idemsql.TxFromContext(ctx)
//	_, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total) VALUES (?, ?)", id, total)
func TxFromContext(ctx context.Context) *Tx {
	tx, _ := ctx.Value(txKey{}).(*Tx)
	return tx
}

// DB returns the transaction of the idem execution that ctx belongs to,
// or db outside one, so that code shared by idempotent and plain requests
// has one path:
//
//	_, err := idemsql.DB(ctx, db).ExecContext(ctx, "INSERT INTO orders …", …)
func DB(ctx context.Context, db *sql.DB) DBTX {
	if tx := TxFromContext(ctx); tx != nil {
		return tx
	}
	return db
}

// ExecContext runs a statement in the transaction.
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	t.u.stmts.RLock()
	defer t.u.stmts.RUnlock()
	conn, err := t.u.use(ctx)
	if err != nil {
		return nil, err
	}
	res, err := conn.ExecContext(ctx, query, args...)
	if err != nil {
		return nil, t.u.failed(ctx, conn, err)
	}
	return res, nil
}

// QueryContext runs a query in the transaction.
func (t *Tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	t.u.stmts.RLock()
	defer t.u.stmts.RUnlock()
	conn, err := t.u.use(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := conn.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, t.u.failed(ctx, conn, err)
	}
	return rows, nil
}

// QueryRowContext runs a query expected to return at most one row in the
// transaction. As with *sql.Tx, errors are deferred until Scan (or Err).
func (t *Tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	t.u.stmts.RLock()
	defer t.u.stmts.RUnlock()
	conn, err := t.u.use(ctx)
	if err != nil {
		return errRow(err)
	}
	row := conn.QueryRowContext(ctx, query, args...)
	// Err reports the query's own error before any Scan: the moment to
	// find out whether it ended the transaction.
	if err := row.Err(); err != nil {
		if ended := t.u.failed(ctx, conn, err); ended != err {
			return errRow(ended)
		}
	}
	return row
}

// PrepareContext prepares a statement on the transaction's connection.
// The statement runs in the transaction; it fails once the transaction has
// ended. Its errors do not pass through Tx: prefer Tx's own methods.
func (t *Tx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	t.u.stmts.RLock()
	defer t.u.stmts.RUnlock()
	conn, err := t.u.use(ctx)
	if err != nil {
		return nil, err
	}
	stmt, err := conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, t.u.failed(ctx, conn, err)
	}
	return stmt, nil
}

// Commit refuses with ErrTxOwned: the transaction commits with the
// handler's answer when the handler returns.
func (t *Tx) Commit() error { return ErrTxOwned }

// Rollback undoes the handler's writes now. The handler's answer is still
// stored and replayed, without them: a payment the card network refused,
// answered 402, that must leave no row behind and answer every retry the
// same. Statements after it fail with ErrTxRolledBack. (Returning an error
// instead rolls back and stores nothing; idem.RollbackWrites(ctx) does as
// Rollback, at the handler's return.)
//
// It returns a *TxEndedError if the database had ended the transaction (a
// deadlock, DDL on MySQL): the answer will not be stored then, not even
// alone, since an answer given after the database ended the transaction
// says nothing of the request. It is harmless to call more than once.
func (t *Tx) Rollback() error { return t.u.rollbackByHandler() }

// CompleteTx stores the result of the execution holding p.Token inside tx,
// a transaction the caller owns, fenced by the lease token: the UPDATE only
// matches the record while it is in flight under p.Token. When it matches
// nothing, because the lease was taken over or the key released, CompleteTx
// returns idem.ErrLeaseLost and the caller must roll tx back, business
// writes included. It neither commits nor rolls back.
//
// It is for callers who run their own transaction rather than
// idem.Engine.Do. They are also the ones to make sure the transaction is
// still the one they began: on MySQL and SQLite, an error can end it (see
// the package documentation).
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p idem.CompleteParams) error {
	args, err := completeArgs(s.d.complete, p, "")
	if err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, s.d.complete.text, args...)
	if err != nil {
		return fmt.Errorf("idemsql: complete: %w", err)
	}
	// The completion always changes state, so rows affected are exact on
	// every dialect, MySQL's changed-rows count included. (Asking again with
	// a SELECT would be wrong here: inside tx it could read the snapshot
	// from before a takeover.)
	return fenced(res)
}

// completeArgs returns the arguments of q, a completion, for p; unit is
// the unit's mark (Postgres' completeUnit).
func completeArgs(q query, p idem.CompleteParams, unit string) ([]any, error) {
	values, err := completeValues(p, unit)
	if err != nil {
		return nil, err
	}
	return q.args(values), nil
}

// completeValues returns the named arguments of a completion for p.
func completeValues(p idem.CompleteParams, unit string) (map[string]any, error) {
	headers, err := idemcodec.MarshalHeader(p.Result.Header)
	if err != nil {
		return nil, fmt.Errorf("idemsql: complete: %w", err)
	}
	var headerArg any
	if headers != nil {
		// A string, not bytes: MySQL refuses binary for JSON, and SQLite
		// would store a BLOB in the TEXT column.
		headerArg = string(headers)
	}
	var ref any
	if p.Result.Reference != "" {
		ref = p.Result.Reference
	}
	values := map[string]any{
		"tenant":  p.Tenant,
		"key":     p.Key,
		"token":   p.Token,
		"mode":    int64(p.Result.Mode),
		"status":  int64(p.Result.Status),
		"headers": headerArg,
		"body":    nullBytes(p.Result.Body),
		"ref":     ref,
		"unit":    unit,
	}
	return values, nil
}
