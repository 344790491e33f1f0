package idempg

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// completeSQL stores the result, fenced by the lease token. idem_complete
// (migration 0002) raises SQLStateLeaseLost when no in-flight record holds
// the token, which aborts the transaction it runs in.
const completeSQL = `SELECT idem_complete($1, $2, $3, $4, $5, $6, $7, $8)`

// completeOIDs are the parameter types of completeSQL, given explicitly so
// that the server needs no Describe round trip to learn them.
var completeOIDs = []uint32{
	pgtype.TextOID, pgtype.TextOID, pgtype.Int8OID, pgtype.Int2OID,
	pgtype.Int4OID, pgtype.JSONBOID, pgtype.ByteaOID, pgtype.TextOID,
}

// completeFormats: every parameter in text format except the body, sent
// as raw bytes (binary bytea) rather than hex-escaped.
var completeFormats = []int16{0, 0, 0, 0, 0, 0, 1, 0}

// completeValues encodes p for completeSQL. A nil value is SQL NULL.
func completeValues(p idem.CompleteParams) ([][]byte, error) {
	res := p.Result
	header, err := idemcodec.MarshalHeader(res.Header)
	if err != nil {
		return nil, fmt.Errorf("idempg: encode result header: %w", err)
	}
	var body, ref []byte
	if len(res.Body) > 0 {
		body = res.Body
	}
	if res.Reference != "" {
		ref = []byte(res.Reference)
	}
	return [][]byte{
		[]byte(p.Tenant),
		[]byte(p.Key),
		strconv.AppendInt(nil, p.Token, 10),
		strconv.AppendUint(nil, uint64(res.Mode), 10),
		strconv.AppendInt(nil, int64(res.Status), 10),
		header,
		body,
		ref,
	}, nil
}

// Complete implements idem.UnitOfWork. What it sends depends on what the
// handler did with its transaction:
//
//   - nothing (or only Prepare): the completion alone, one fenced statement
//     in its own implicit transaction, through the pool;
//   - wrote, and the transaction is live: the completion and the COMMIT in
//     ONE round trip, a pipeline of [idem_complete, COMMIT, Sync], which the
//     server answers in one write, after the commit;
//   - a statement failed and aborted the transaction (a unique violation
//     the handler answered 409): [ROLLBACK, idem_complete, Sync], one round
//     trip that undoes every write of the transaction and stores the answer
//     alone; a success answer (under 400) there is not stored: ROLLBACK,
//     and idem.ErrWritesAborted;
//   - rolled its transaction back (handlerTx.Rollback): the completion
//     alone, through the pool, as if it had written nothing;
//   - met a deadlock or a serialization failure that no savepoint undid
//     (ErrTxEnded): ROLLBACK, nothing stored, whatever the answer.
//
// When the transaction ended without idem (a COMMIT or ROLLBACK the
// handler sent through Conn) or its connection was lost, Complete cannot
// tell what committed: it stores nothing and returns an error, and the
// engine releases the key.
//
// When idem_complete raises (lease lost) in the commit pipeline, the server
// skips the COMMIT up to the Sync and leaves the transaction open and
// aborted; Complete then sends a ROLLBACK, a second round trip on that
// rare path only, so that the connection goes back to the pool idle. A
// Sync after idem_complete as well would make the COMMIT run (as a
// ROLLBACK) in the same round trip whatever happened, but it splits the
// answer in two: the server sends idem_complete's result at once and the
// COMMIT's after the WAL flush, so every request would cost both sides one
// more write and one more wake-up.
func (u *unit) Complete(ctx context.Context, p idem.CompleteParams) error {
	values, err := completeValues(p)
	if err != nil {
		return err // the transaction stays open; the caller's Rollback ends it
	}
	switch u.state.Swap(unitEnded) {
	case unitEnded:
		return pgx.ErrTxClosed
	case unitRolledBack:
		if u.lostTo() != nil {
			return u.gone()
		}
		return u.store.completeAlone(ctx, values)
	}
	if u.conn == nil {
		return u.store.completeAlone(ctx, values)
	}
	if u.tx == nil {
		// Connected (Prepare) but nothing written: the connection may
		// have been lost meanwhile, which the pool's next one does not
		// care about.
		u.conn.Release()
		u.conn = nil
		return u.store.completeAlone(ctx, values)
	}
	// Release returns the connection only when it is idle; one that a
	// failure left inside a transaction, busy or closed is destroyed.
	defer func() {
		u.conn.Release()
		u.conn = nil
	}()
	pgConn := u.conn.Conn().PgConn()
	if pgConn.IsClosed() {
		// The server rolled the transaction back when the connection
		// went; the handler may not even have seen it (it was killed
		// while idle in the transaction), so its answer is not stored.
		return fmt.Errorf("idempg: complete: the connection of the handler's transaction was lost, its writes with it; nothing stored: %w", pgx.ErrTxClosed)
	}
	if u.lostTo() != nil {
		// A deadlock or a serialization failure rolled the transaction
		// back: whatever the handler answered since says nothing of the
		// request, and the retry would succeed.
		if pgConn.TxStatus() != 'I' {
			if err := pgConn.Exec(ctx, "ROLLBACK").Close(); err != nil {
				return err
			}
		}
		return u.gone()
	}
	switch st := pgConn.TxStatus(); st {
	case 'T':
		return commitWith(ctx, pgConn, values)
	case 'E':
		if p.Result.Status < 400 {
			// A success whose writes a failed statement undid: storing
			// it would replay a result that never happened.
			if err := pgConn.Exec(ctx, "ROLLBACK").Close(); err != nil {
				return err
			}
			return idem.ErrWritesAborted
		}
		return rollbackThenComplete(ctx, pgConn, values)
	default:
		// 'I': the BEGIN took effect, yet no transaction is open. The
		// handler ended it through Conn, so its writes may have committed
		// or not; storing its answer would be a guess.
		return fmt.Errorf("idempg: complete: the handler's transaction was ended without idem (a COMMIT or ROLLBACK sent through Conn?); its writes may or may not be committed, and nothing is stored: %w", pgx.ErrTxClosed)
	}
}

// completeAlone stores the answer with one fenced statement through the
// pool, in its own implicit transaction: for a handler that wrote nothing,
// or whose writes were rolled back.
func (s *Store) completeAlone(ctx context.Context, values [][]byte) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Conn().PgConn().ExecParams(ctx, completeSQL, values, completeOIDs, completeFormats, nil).Close()
	return interpretError(err)
}

// commitWith completes in the handler's live transaction and commits it,
// in one round trip.
func commitWith(ctx context.Context, pgConn *pgconn.PgConn, values [][]byte) error {
	// An unnamed statement, parsed each time: preparing it once per
	// connection measured no faster (see bench_variants_test.go).
	pl := pgConn.StartPipeline(ctx)
	pl.SendQueryParams(completeSQL, values, completeOIDs, completeFormats, nil)
	pl.SendQueryParams("COMMIT", nil, nil, nil, nil)
	if err := pl.Sync(); err != nil {
		_ = pl.Close()
		return err
	}
	r := readPipeline(pl)
	completeErr, commitTag, commitErr := r.errs[0], r.tags[1], r.errs[1]
	switch {
	case completeErr != nil:
		// The COMMIT was skipped: roll back, business writes included.
		// Should the ROLLBACK fail, Release destroys the connection,
		// and with it the transaction.
		if r.io == nil && pgConn.TxStatus() == 'E' {
			_ = pgConn.Exec(ctx, "ROLLBACK").Close()
		}
		return interpretError(completeErr)
	case commitErr != nil:
		// A deferred constraint or a serialization failure refused the
		// commit: nothing was stored.
		return interpretError(commitErr)
	case r.io != nil:
		// The connection failed: the commit may or may not have happened.
		// The engine's fenced Release then deletes nothing if it did.
		return r.io
	case commitTag.String() != "COMMIT":
		return fmt.Errorf("idempg: commit ended with %q: %w", commitTag.String(), pgx.ErrTxCommitRollback)
	}
	return nil
}

// rollbackThenComplete ends a transaction that a failed statement aborted,
// and stores the answer alone in the same round trip: ROLLBACK ends the
// transaction block, and idem_complete, after it in the same pipeline,
// runs in an implicit transaction of its own, committed at the Sync (with
// the server's synchronous_commit) or rolled back if it raised.
func rollbackThenComplete(ctx context.Context, pgConn *pgconn.PgConn, values [][]byte) error {
	pl := pgConn.StartPipeline(ctx)
	pl.SendQueryParams("ROLLBACK", nil, nil, nil, nil)
	pl.SendQueryParams(completeSQL, values, completeOIDs, completeFormats, nil)
	if err := pl.Sync(); err != nil {
		_ = pl.Close()
		return err
	}
	r := readPipeline(pl)
	switch {
	case r.errs[0] != nil:
		return r.errs[0]
	case r.errs[1] != nil:
		return interpretError(r.errs[1])
	case r.io != nil:
		// Whether idem_complete committed is unknown; the engine's
		// fenced Release deletes nothing if it did.
		return r.io
	}
	return nil
}

// pipelined is what a pipeline of two statements and a Sync answered:
// each statement's command tag or server error (a statement after a
// failed one is skipped by the server, and has neither), and the error
// that ended the reading early, if any.
type pipelined struct {
	tags [2]pgconn.CommandTag
	errs [2]error
	io   error
}

// readPipeline reads a pipeline of two statements up to its Sync, and
// closes it. A server error is recorded against the statement it belongs
// to; any other error ends the pipeline.
func readPipeline(pl *pgconn.Pipeline) (r pipelined) {
	statement := 0
	record := func(tag pgconn.CommandTag, err error) {
		if statement < len(r.tags) {
			r.tags[statement], r.errs[statement] = tag, err
		}
		statement++
	}
	defer func() {
		if err := pl.Close(); err != nil && r.io == nil && r.errs[0] == nil && r.errs[1] == nil {
			r.io = err
		}
	}()
	for {
		res, err := pl.GetResults()
		if err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				r.io = err
				return r
			}
			record(pgconn.CommandTag{}, err)
			continue
		}
		switch res := res.(type) {
		case nil:
			r.io = errors.New("idempg: completion pipeline ended early")
			return r
		case *pgconn.ResultReader:
			tag, err := res.Close()
			if err != nil {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) {
					r.io = err
					return r
				}
			}
			record(tag, err)
		case *pgconn.PipelineSync:
			return r
		}
	}
}

// CompleteTx stores the result of p in tx, a transaction the caller owns,
// fenced by the lease token, and does not commit: the caller commits it
// with its own writes. It is the form for callers that run their own
// transaction rather than idem's (as river.JobCompleteTx is for River).
//
// When the lease was lost it returns idem.ErrLeaseLost, and tx is aborted:
// the caller must roll it back, and its writes are undone with it.
//
// tx must be live: in a transaction that a failed statement aborted,
// CompleteTx fails too (SQLSTATE 25P02). To store an answer without the
// writes, roll tx back and call CompleteTx in a new transaction.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, p idem.CompleteParams) error {
	res := p.Result
	header, err := idemcodec.MarshalHeader(res.Header)
	if err != nil {
		return fmt.Errorf("idempg: encode result header: %w", err)
	}
	var body []byte
	if len(res.Body) > 0 {
		body = res.Body
	}
	var ref *string
	if res.Reference != "" {
		ref = &res.Reference
	}
	_, err = tx.Exec(ctx, completeSQL, p.Tenant, p.Key, p.Token, int16(res.Mode), int32(res.Status), header, body, ref)
	return interpretError(err)
}
