package idempg

import (
	"errors"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SQLStateLeaseLost is the SQLSTATE that the idem_complete function
// (migration 0002) raises when no in-flight record holds the caller's lease
// token. It is outside every class PostgreSQL defines, so it cannot be
// confused with a server error.
const SQLStateLeaseLost = "IDL01"

// ErrTxOwned is returned by Commit and Rollback on the transaction that
// Tx(ctx) hands to a handler: idem commits it together with the result, or
// rolls it back, once the handler returns. A handler that wants its writes
// undone returns an error instead.
var ErrTxOwned = errors.New("idempg: the transaction belongs to idem; return from the handler to commit it, or return an error to roll it back")

// interpretError translates driver errors into idem's at the seam, so that
// callers test with errors.Is and never look at pgx types. The original
// error stays in the chain.
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.ErrNotFound
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == SQLStateLeaseLost {
		return idem.ErrLeaseLost
	}
	return err
}
