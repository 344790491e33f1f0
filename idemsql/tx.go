package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// txKey is the context key under which Tx finds the handler's transaction.
type txKey struct{}

// Tx returns the database transaction of the idem execution that ctx
// belongs to, or nil outside one. The handler makes its business writes in
// it, so that they commit together with the stored result, or not at all:
//
//	tx := idemsql.Tx(ctx)
//	_, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total) VALUES (?, ?)", id, total)
func Tx(ctx context.Context) *sql.Tx {
	tx, _ := ctx.Value(txKey{}).(*sql.Tx)
	return tx
}

// CompleteTx stores the result of the execution holding p.Token inside tx,
// a transaction the caller owns, fenced by the lease token: the UPDATE only
// matches the record while it is in flight under p.Token. When it matches
// nothing, because the lease was taken over or the key released, CompleteTx
// returns idem.ErrLeaseLost and the caller must roll tx back, business
// writes included. It neither commits nor rolls back.
//
// It is for callers who run their own transaction rather than
// idem.Engine.Do; the Engine goes through Begin and Tx.Complete, which call
// it and then commit.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p idem.CompleteParams) error {
	headers, err := idem.MarshalHeader(p.Result.Header)
	if err != nil {
		return fmt.Errorf("idemsql: complete: %w", err)
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
	res, err := tx.ExecContext(ctx, s.d.complete.text, s.d.complete.args(map[string]any{
		"tenant":  p.Tenant,
		"key":     p.Key,
		"token":   p.Token,
		"mode":    int64(p.Result.Mode),
		"status":  int64(p.Result.Status),
		"headers": headerArg,
		"body":    nullBytes(p.Result.Body),
		"ref":     ref,
	})...)
	if err != nil {
		return fmt.Errorf("idemsql: complete: %w", err)
	}
	// The completion always changes state, so rows affected are exact on
	// every dialect, MySQL's changed-rows count included. (Asking again with
	// a SELECT would be wrong here: inside tx it could read the snapshot
	// from before a takeover.)
	return fenced(res)
}

// unitOfWork is the idem.UnitOfWork of a Store: one database transaction.
type unitOfWork struct {
	s  *Store
	tx *sql.Tx
}

// Context implements idem.UnitOfWork.
func (u *unitOfWork) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, u.tx)
}

// Complete implements idem.UnitOfWork: CompleteTx, then commit, or roll back on
// any failure.
func (u *unitOfWork) Complete(ctx context.Context, p idem.CompleteParams) error {
	if err := u.s.CompleteTx(ctx, u.tx, p); err != nil {
		_ = u.tx.Rollback()
		return err
	}
	if err := u.tx.Commit(); err != nil {
		return fmt.Errorf("idemsql: commit: %w", err)
	}
	return nil
}

// Rollback implements idem.UnitOfWork. After Complete it does nothing.
func (u *unitOfWork) Rollback(ctx context.Context) error {
	if err := u.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("idemsql: rollback: %w", err)
	}
	return nil
}
