package idempg

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Begin implements idem.Store. It takes nothing from the pool: the
// connection is acquired at the handler's first query, and the BEGIN
// travels in front of that query (see "BEGIN rides with the first query"
// in the package documentation). A handler that calls a slow service
// before its first query therefore holds no connection while it waits,
// and one that never queries completes with a single statement.
func (s *Store) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	u := &unit{store: s}
	u.handle.u = u
	return u, nil
}

// The states of a unit of work.
const (
	// unitOpen: the handler may use its transaction.
	unitOpen int32 = iota
	// unitRolledBack: the handler rolled its transaction back (its
	// writes are undone and its connection is back in the pool);
	// Complete stores the answer alone.
	unitRolledBack
	// unitEnded: Complete or Rollback ended the unit of work.
	unitEnded
)

// unit is idem's unit of work: a connection taken from the pool at the
// handler's first query, held until Complete or Rollback ends it, and the
// transaction on it once begun.
//
// It holds the connection itself (rather than a pgxpool.Tx) because
// Complete commits with its own pipelined COMMIT, which pgx's Tx does not
// know of; releasing a pgxpool.Tx would cost a ROLLBACK round trip.
type unit struct {
	store *Store
	// conn is nil until the handler's first query. A handler, like any
	// pgx user, uses its transaction from one goroutine at a time, and the
	// engine completes only after the handler has returned, so conn and
	// tx need no lock.
	conn *pgxpool.Conn
	// tx is nil until the handler's first query begins the transaction.
	tx pgx.Tx
	// state is unitOpen, unitRolledBack or unitEnded. The handler's Tx
	// refuses work once it is not unitOpen, since the connection may
	// already serve another request.
	state atomic.Int32
	// handle is what TxFromContext returns, allocated with the unit.
	handle handlerTx
	// keepConn: the connection outlives the handler's Rollback, since it
	// holds the key's lock (singleUnit, the single-transaction mode).
	keepConn bool
	// lost holds the deadlock or serialization failure (class 40) that
	// aborted the transaction, until a rollback to a savepoint undoes it:
	// then nothing of the execution is stored (see ErrTxEnded).
	lost atomic.Pointer[rolledBackBy]
}

// Context implements idem.UnitOfWork.
func (u *unit) Context(ctx context.Context) context.Context {
	u.handle.ctx = ctx
	return context.WithValue(ctx, txKey{}, &u.handle)
}

// Rollback implements idem.UnitOfWork. It is harmless after Complete.
// It returns an error wrapping ErrTxEnded when a deadlock or a
// serialization failure had rolled the transaction back: the engine then
// stores nothing, not even an answer meant to be stored without the
// writes (idem.RollbackWrites, a 5xx).
func (u *unit) Rollback(ctx context.Context) error {
	switch u.state.Swap(unitEnded) {
	case unitEnded:
		return nil // after Complete
	case unitRolledBack:
		if u.lostTo() != nil {
			return u.gone()
		}
		return nil
	}
	err := u.rollback(ctx)
	if u.lostTo() != nil {
		return u.gone()
	}
	return err
}

// rollback ends the transaction, if one was begun, and gives the
// connection back to the pool.
func (u *unit) rollback(ctx context.Context) error {
	if u.conn == nil {
		return nil
	}
	var err error
	if u.tx != nil && u.conn.Conn().PgConn().TxStatus() != 'I' {
		// pgx closes the connection when the ROLLBACK fails, and Release
		// destroys a connection that is not idle, so no transaction leaks
		// into the pool.
		err = u.tx.Rollback(ctx)
	}
	if u.keepConn {
		u.tx = nil
		return err
	}
	u.conn.Release()
	u.conn = nil
	return err
}

// connect acquires the unit's connection at its first use.
func (u *unit) connect(ctx context.Context) (*pgx.Conn, error) {
	if u.conn == nil {
		conn, err := u.store.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		u.conn = conn
	}
	return u.conn.Conn(), nil
}

// begin sends BEGIN by itself, for the methods that cannot carry it in
// front of their own query.
func (u *unit) begin(ctx context.Context) (pgx.Tx, error) {
	if u.tx != nil {
		return u.tx, nil
	}
	conn, err := u.connect(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
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
	conn, err := u.connect(ctx)
	if err != nil {
		return nil, err
	}
	withBegin := &pgx.Batch{}
	withBegin.BeginTx(pgx.TxOptions{})
	withBegin.QueuedQueries = append(withBegin.QueuedQueries, b.QueuedQueries...)
	br := conn.SendBatch(ctx, withBegin)
	// The transaction exists from here on, even if a query of b fails
	// (it is then aborted, and Complete stores the answer without it).
	u.tx = br.Tx()
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		if conn.PgConn().TxStatus() == 'I' {
			// The BEGIN did not take effect: no transaction, nothing
			// written (a closed connection is Complete's to report).
			u.tx = nil
		}
		return nil, err
	}
	return beginResults{br}, nil
}

// Errors of the handler's Tx once it can no longer be used.
var (
	errHandlerRolledBack = fmt.Errorf("idempg: the handler rolled its transaction back; its answer is stored without its writes: %w", pgx.ErrTxClosed)
	errUnitEnded         = fmt.Errorf("idempg: the idem execution has ended, and its transaction with it: %w", pgx.ErrTxClosed)
)

// handlerTx is the pgx.Tx a handler reaches through TxFromContext: every
// query goes to idem's transaction; Commit is idem's, Rollback the
// handler's to call.
type handlerTx struct {
	u *unit
	// ctx is the execution's, for Conn and LargeObjects, which take no
	// context of their own but may have to acquire a connection.
	ctx context.Context
}

var _ pgx.Tx = (*handlerTx)(nil)

// usable returns why the handler's Tx, and its savepoints, refuse work,
// or nil.
func (u *unit) usable() error {
	switch u.state.Load() {
	case unitOpen:
		return nil
	case unitRolledBack:
		return errHandlerRolledBack
	default:
		return errUnitEnded
	}
}

// Begin starts a pseudo nested transaction (a savepoint), which the
// handler may commit or roll back itself.
func (t *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.usable(); err != nil {
		return nil, err
	}
	tx, err := t.u.begin(ctx)
	if err != nil {
		return nil, err
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepointTx{Tx: sp, u: t.u}, nil
}

// ErrTxOwned is returned by Commit on the transaction that TxFromContext
// hands to a handler: it commits together with the stored answer when the
// handler returns.
var ErrTxOwned = errors.New("idempg: the transaction commits with the stored answer when the handler returns, not before: " +
	"return normally to commit the writes with the answer; " +
	"call Rollback (or idem.RollbackWrites(ctx)) to store the answer without the writes; " +
	"call idem.NotExecuted(ctx) when the request did nothing, to store nothing and free the key")

// Commit refuses with ErrTxOwned and changes nothing: the transaction
// commits with the stored answer when the handler returns.
func (t *handlerTx) Commit(ctx context.Context) error {
	if err := t.usable(); err != nil {
		return err
	}
	return ErrTxOwned
}

// Rollback rolls the handler's writes back now and gives the connection
// back to the pool. The handler's answer is still stored, without them,
// and replayed to every retry; statements on the Tx fail from then on
// with pgx.ErrTxClosed. It is idem.RollbackWrites, done at once: a payment
// the card network refused, answered 402, leaves no row behind. Like
// pgx's, it returns pgx.ErrTxClosed when called again.
//
// After a deadlock or a serialization failure rolled the transaction back
// it returns an error wrapping ErrTxEnded: the answer is not stored then.
func (t *handlerTx) Rollback(ctx context.Context) error {
	if !t.u.state.CompareAndSwap(unitOpen, unitRolledBack) {
		return t.usable()
	}
	err := t.u.rollback(ctx)
	if t.u.lostTo() != nil {
		return t.u.gone()
	}
	return err
}

// CopyFrom delegates to the transaction, which it begins first if needed.
func (t *handlerTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := t.usable(); err != nil {
		return 0, err
	}
	tx, err := t.u.begin(ctx)
	if err != nil {
		return 0, err
	}
	n, err := tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, t.u.saw(err)
}

// SendBatch delegates to the transaction. As the first statement of the
// transaction, it carries the BEGIN.
func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.usable(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if t.u.tx != nil {
		return watchedBatch{t.u.tx.SendBatch(ctx, b), t.u}
	}
	br, err := t.u.beginWith(ctx, b)
	if err != nil {
		return pgx.FailedBatchResults(b, t.u.saw(err))
	}
	return watchedBatch{br, t.u}
}

// LargeObjects delegates to the transaction, which it begins first if
// needed. Once the execution has ended, or if the transaction could not
// begin, every call of the returned LargeObjects fails with
// pgx.ErrTxClosed. Use it only while the handler runs: a LargeObjects
// kept past the handler's return reaches a connection that may serve
// another request.
func (t *handlerTx) LargeObjects() pgx.LargeObjects {
	if t.usable() != nil {
		return closedTx().LargeObjects()
	}
	tx, err := t.u.begin(t.ctx)
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

// Prepare delegates to the connection, which it acquires first if needed.
func (t *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.usable(); err != nil {
		return nil, err
	}
	// Prepared statements belong to the session, not to the transaction:
	// no need to begin.
	conn, err := t.u.connect(ctx)
	if err != nil {
		return nil, err
	}
	return conn.Prepare(ctx, name, sql)
}

// Exec delegates to the transaction. As the first statement of the
// transaction, it carries the BEGIN, unless it has no arguments: pgx then
// uses the simple protocol, which may hold several statements that a
// batch cannot.
func (t *handlerTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if err := t.usable(); err != nil {
		return pgconn.CommandTag{}, err
	}
	if t.u.tx != nil || len(arguments) == 0 {
		tx, err := t.u.begin(ctx)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		tag, err := tx.Exec(ctx, sql, arguments...)
		return tag, t.u.saw(err)
	}
	b := &pgx.Batch{}
	b.Queue(sql, arguments...)
	br, err := t.u.beginWith(ctx, b)
	if err != nil {
		return pgconn.CommandTag{}, t.u.saw(err)
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, t.u.saw(err)
}

// Query delegates to the transaction. As the first statement of the
// transaction, it carries the BEGIN. As pgx's, it returns Rows that hold
// the error when it fails.
func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.usable(); err != nil {
		return errRows{err}, err
	}
	if t.u.tx != nil {
		rows, err := t.u.tx.Query(ctx, sql, args...)
		if err != nil {
			return rows, t.u.saw(err)
		}
		return &watchedRows{Rows: rows, u: t.u}, nil
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br, err := t.u.beginWith(ctx, b)
	if err != nil {
		err = t.u.saw(err)
		return errRows{err}, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		err = t.u.saw(err)
		return errRows{err}, err
	}
	return &watchedRows{Rows: &batchRows{Rows: rows, br: br}, u: t.u}, nil
}

// QueryRow delegates to the transaction. As the first statement of the
// transaction, it carries the BEGIN.
func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.usable(); err != nil {
		return errRows{err}
	}
	if t.u.tx != nil {
		return watchedRow{t.u.tx.QueryRow(ctx, sql, args...), t.u}
	}
	rows, err := t.Query(ctx, sql, args...)
	return &firstRow{rows: rows, err: err}
}

// Conn returns the underlying connection, after beginning the transaction
// if needed. Statements sent on it directly run in the transaction too.
// Never end the transaction through it (COMMIT, ROLLBACK, or pgx's
// Conn.Begin and its Commit): idem can no longer tell whether the writes
// committed, so it stores nothing, and the retry runs the operation
// again; call Rollback on the Tx instead. Conn returns nil once the
// execution has ended or the handler rolled back, since the connection
// may then serve another request, or if the transaction could not begin;
// a *pgx.Conn obtained before is not protected so: do not use it after
// Rollback, nor past the handler's return.
func (t *handlerTx) Conn() *pgx.Conn {
	if t.usable() != nil {
		return nil
	}
	tx, err := t.u.begin(t.ctx)
	if err != nil {
		return nil
	}
	return tx.Conn()
}

// savepointTx is a savepoint of the handler's transaction (pgx's pseudo
// nested transaction), which refuses work once the execution has ended:
// pgx's own would still reach the connection, back in the pool, since
// Complete commits without pgx's Tx.
type savepointTx struct {
	pgx.Tx
	u *unit
}

func (t *handlerTx) usable() error    { return t.u.usable() }
func (sp *savepointTx) usable() error { return sp.u.usable() }

// Begin starts a savepoint inside this one.
func (sp *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := sp.usable(); err != nil {
		return nil, err
	}
	inner, err := sp.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &savepointTx{Tx: inner, u: sp.u}, nil
}

// Commit releases the savepoint.
func (sp *savepointTx) Commit(ctx context.Context) error {
	if err := sp.usable(); err != nil {
		return err
	}
	return sp.Tx.Commit(ctx)
}

// Rollback rolls back to the savepoint: the writes made since it are
// undone, the transaction goes on (and commits with the answer), a
// deadlock met since included.
func (sp *savepointTx) Rollback(ctx context.Context) error {
	if err := sp.usable(); err != nil {
		return err
	}
	if err := sp.Tx.Rollback(ctx); err != nil {
		return sp.u.saw(err)
	}
	sp.u.recovered()
	return nil
}

// CopyFrom delegates to the savepoint.
func (sp *savepointTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := sp.usable(); err != nil {
		return 0, err
	}
	n, err := sp.Tx.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, sp.u.saw(err)
}

// SendBatch delegates to the savepoint.
func (sp *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := sp.usable(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return watchedBatch{sp.Tx.SendBatch(ctx, b), sp.u}
}

// LargeObjects delegates to the savepoint.
func (sp *savepointTx) LargeObjects() pgx.LargeObjects {
	if sp.usable() != nil {
		return closedTx().LargeObjects()
	}
	return sp.Tx.LargeObjects()
}

// Prepare delegates to the savepoint.
func (sp *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := sp.usable(); err != nil {
		return nil, err
	}
	return sp.Tx.Prepare(ctx, name, sql)
}

// Exec delegates to the savepoint.
func (sp *savepointTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if err := sp.usable(); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := sp.Tx.Exec(ctx, sql, arguments...)
	return tag, sp.u.saw(err)
}

// Query delegates to the savepoint.
func (sp *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := sp.usable(); err != nil {
		return errRows{err}, err
	}
	rows, err := sp.Tx.Query(ctx, sql, args...)
	if err != nil {
		return rows, sp.u.saw(err)
	}
	return &watchedRows{Rows: rows, u: sp.u}, nil
}

// QueryRow delegates to the savepoint.
func (sp *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := sp.usable(); err != nil {
		return errRows{err}
	}
	return watchedRow{sp.Tx.QueryRow(ctx, sql, args...), sp.u}
}

// Conn returns the underlying connection, or nil once the execution has
// ended.
func (sp *savepointTx) Conn() *pgx.Conn {
	if sp.usable() != nil {
		return nil
	}
	return sp.Tx.Conn()
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

// errRows are the pgx.Rows, and pgx.Row, of a query that failed before it
// was sent: as pgx's, they hold the error, so that callers who check it
// only on the rows (pgx.CollectRows) see it.
type errRows struct{ err error }

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return nil }
