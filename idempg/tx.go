package idempg

import (
	"context"
	"sync/atomic"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// txKey is the context key of the handler's transaction.
type txKey struct{}

// Tx returns the transaction of the idem execution running in ctx, for the
// handler's business writes, or nil outside idem. The writes commit
// together with the stored result when the handler returns, and roll back
// with it otherwise. Its Commit and Rollback refuse with ErrTxOwned: idem
// owns the transaction's end. Nested transactions (savepoints) through its
// Begin work as in pgx.
func Tx(ctx context.Context) pgx.Tx {
	t, _ := ctx.Value(txKey{}).(*handlerTx)
	if t == nil {
		return nil
	}
	return t
}

// Begin implements idem.Store: it acquires a connection for the unit of
// work. The BEGIN itself is not sent yet: it travels in front of the
// handler's first query (see "BEGIN rides with the first query" in the
// package documentation).
func (s *Store) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &unit{conn: conn}, nil
}

// unit is idem's unit of work: a connection held out of the pool until
// Complete or Rollback ends it, and the transaction on it once begun.
//
// It holds the connection itself (rather than a pgxpool.Tx) because
// Complete commits with its own pipelined COMMIT, which pgx's Tx does not
// know of; releasing a pgxpool.Tx would cost a ROLLBACK round trip.
type unit struct {
	conn *pgxpool.Conn
	// tx is nil until the handler's first query begins the transaction.
	// A handler, like any pgx user, uses its transaction from one
	// goroutine at a time, and the engine completes only after the
	// handler has returned, so tx needs no lock.
	tx pgx.Tx
	// done is set once the transaction has ended and the connection is
	// back in the pool; the handler's Tx refuses work from then on, since
	// the connection may already serve another request.
	done atomic.Bool
}

// Context implements idem.UnitOfWork.
func (u *unit) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, &handlerTx{u: u})
}

// Rollback implements idem.UnitOfWork. It is harmless after Complete.
func (u *unit) Rollback(ctx context.Context) error {
	if !u.done.CompareAndSwap(false, true) {
		return nil
	}
	var err error
	if u.tx != nil {
		// pgx closes the connection when the ROLLBACK fails, and Release
		// destroys a connection that is not idle, so no transaction leaks
		// into the pool.
		err = u.tx.Rollback(ctx)
	}
	u.conn.Release()
	return err
}

// begin sends BEGIN by itself, for the methods that cannot carry it in
// front of their own query.
func (u *unit) begin(ctx context.Context) (pgx.Tx, error) {
	if u.tx != nil {
		return u.tx, nil
	}
	tx, err := u.conn.Conn().Begin(ctx)
	if err != nil {
		return nil, err
	}
	u.tx = tx
	return tx, nil
}

// beginWith sends BEGIN and the queries of b in one round trip, and
// returns the results of b's queries: the BEGIN's own result is read
// already.
func (u *unit) beginWith(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	withBegin := &pgx.Batch{}
	withBegin.BeginTx(pgx.TxOptions{})
	withBegin.QueuedQueries = append(withBegin.QueuedQueries, b.QueuedQueries...)
	br := u.conn.Conn().SendBatch(ctx, withBegin)
	// The transaction exists from here on, even if a query of b fails
	// (it is then aborted, and Complete answers with the error). If the
	// BEGIN itself failed, pgx hands back a closed transaction.
	u.tx = br.Tx()
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	return beginResults{br}, nil
}

// handlerTx is the pgx.Tx a handler reaches through Tx(ctx): every query
// goes to idem's transaction, but its end belongs to idem.
type handlerTx struct{ u *unit }

var _ pgx.Tx = (*handlerTx)(nil)

// Begin starts a pseudo nested transaction (a savepoint), which the
// handler may commit or roll back itself.
func (t *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.u.done.Load() {
		return nil, pgx.ErrTxClosed
	}
	tx, err := t.u.begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

// Commit refuses with ErrTxOwned: the transaction commits with the stored
// result when the handler returns.
func (t *handlerTx) Commit(ctx context.Context) error { return ErrTxOwned }

// Rollback refuses with ErrTxOwned: a handler that wants its writes undone
// returns an error, and idem rolls back and releases the key.
func (t *handlerTx) Rollback(ctx context.Context) error { return ErrTxOwned }

// CopyFrom delegates to the transaction.
func (t *handlerTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if t.u.done.Load() {
		return 0, pgx.ErrTxClosed
	}
	tx, err := t.u.begin(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// SendBatch delegates to the transaction. As the first statement of the
// transaction, it carries the BEGIN.
func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.u.done.Load() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	if t.u.tx != nil {
		return t.u.tx.SendBatch(ctx, b)
	}
	br, err := t.u.beginWith(ctx, b)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return br
}

// LargeObjects delegates to the transaction, which it begins first if
// needed (without a context: pgx's LargeObjects takes none). Once the
// transaction has ended, or if it could not begin, every call of the
// returned LargeObjects fails with pgx.ErrTxClosed.
func (t *handlerTx) LargeObjects() pgx.LargeObjects {
	if t.u.done.Load() {
		return closedTx().LargeObjects()
	}
	tx, err := t.u.begin(context.Background())
	if err != nil {
		return closedTx().LargeObjects()
	}
	return tx.LargeObjects()
}

// closedTx returns a pgx.Tx whose every method fails with
// pgx.ErrTxClosed, the transaction pgx hands out for a batch that failed
// before reaching the server.
func closedTx() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}

// Prepare delegates to the transaction.
func (t *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.u.done.Load() {
		return nil, pgx.ErrTxClosed
	}
	// Prepared statements belong to the session, not to the transaction:
	// no need to begin.
	return t.u.conn.Conn().Prepare(ctx, name, sql)
}

// Exec delegates to the transaction. As the first statement of the
// transaction, it carries the BEGIN, unless it has no arguments: pgx then
// uses the simple protocol, which may hold several statements that a
// batch cannot.
func (t *handlerTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if t.u.done.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if t.u.tx != nil || len(arguments) == 0 {
		tx, err := t.u.begin(ctx)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		return tx.Exec(ctx, sql, arguments...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, arguments...)
	br, err := t.u.beginWith(ctx, b)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query delegates to the transaction. As the first statement of the
// transaction, it carries the BEGIN.
func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.u.done.Load() {
		return nil, pgx.ErrTxClosed
	}
	if t.u.tx != nil {
		return t.u.tx.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br, err := t.u.beginWith(ctx, b)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow delegates to the transaction. As the first statement of the
// transaction, it carries the BEGIN.
func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.u.done.Load() {
		return errRow{pgx.ErrTxClosed}
	}
	if t.u.tx != nil {
		return t.u.tx.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	return &firstRow{rows: rows, err: err}
}

// Conn returns the underlying connection, after beginning the transaction
// if needed (without a context: pgx's Conn takes none). Statements sent on
// it directly run in the transaction too; ending the transaction through
// it breaks idem's guarantee. It returns nil once the transaction has
// ended, since the connection may then serve another request, or if the
// transaction could not begin.
func (t *handlerTx) Conn() *pgx.Conn {
	if t.u.done.Load() {
		return nil
	}
	tx, err := t.u.begin(context.Background())
	if err != nil {
		return nil
	}
	return tx.Conn()
}

// beginResults are the results of a batch sent behind a BEGIN, once the
// BEGIN's result is read: to the handler, the batch it sent.
type beginResults struct{ pgx.BatchResults }

// Tx returns nil: the handler's batch did not begin a transaction of its
// own.
func (beginResults) Tx() pgx.Tx { return nil }

// batchRows are the rows of a query sent behind a BEGIN: closing them
// also reads the end of the batch, so the connection is ready for the
// next statement.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	closed   bool
	closeErr error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.closeErr = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

// firstRow is QueryRow's pgx.Row over Query, as pgx builds its own.
type firstRow struct {
	rows pgx.Rows
	err  error
}

func (r *firstRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// errRow is a pgx.Row that fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
