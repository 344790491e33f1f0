package idempg

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DBTX is what a handler sends its queries to: the methods of pgx that
// *pgxpool.Pool, *pgx.Conn and pgx.Tx share. It is the interface sqlc
// generates for pgx, so sqlc's queries take it as they are:
// db.New(idempg.DB(ctx, pool)).
type DBTX interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
}

var (
	_ DBTX = (*pgxpool.Pool)(nil)
	_ DBTX = (*pgx.Conn)(nil)
	_ DBTX = (pgx.Tx)(nil)
)

// txKey is the context key of the handler's transaction.
type txKey struct{}

// TxFromContext returns the transaction of the idem execution running in
// ctx, for the handler's business writes, or nil outside idem (a request
// without an idempotency key, a method idem does not cover).
//
// The writes commit together with the stored answer when the handler
// returns. Its Commit refuses with ErrTxOwned, since the transaction
// commits with the answer; its Rollback rolls the writes back at once, and
// the answer is still stored, without them. Savepoints (its Begin) work
// as in pgx. See "The handler's transaction" in the package
// documentation.
func TxFromContext(ctx context.Context) pgx.Tx {
	if t := handlerTxFrom(ctx); t != nil {
		return t
	}
	return nil
}

// DB returns where a handler sends its queries: the transaction of the
// idem execution running in ctx (TxFromContext), or pool when there is
// none, so that one code path serves the requests idem covers and those it
// does not:
//
//	_, err := idempg.DB(ctx, pool).Exec(ctx, `INSERT INTO payments …`)
//
// Once the handler has rolled its transaction back, DB still returns it,
// and its statements fail with pgx.ErrTxClosed: a write the handler makes
// after that would otherwise commit without its answer. pool may be any
// DBTX, a *pgx.Conn too.
func DB(ctx context.Context, pool DBTX) DBTX {
	if t := handlerTxFrom(ctx); t != nil {
		return t
	}
	return pool
}

func handlerTxFrom(ctx context.Context) *handlerTx {
	t, _ := ctx.Value(txKey{}).(*handlerTx)
	return t
}
