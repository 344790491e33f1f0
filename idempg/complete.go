package idempg

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/idem-go/idem"
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
	header, err := idem.MarshalHeader(res.Header)
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

// Complete implements idem.UnitOfWork. It stores the result and commits in ONE
// round trip: a pipeline of [idem_complete, COMMIT, Sync], which the
// server answers in one write, after the commit.
//
// When idem_complete raises (lease lost), the server skips the COMMIT up
// to the Sync and leaves the transaction open and aborted; Complete then
// sends a ROLLBACK, a second round trip on that rare path only, so that
// the connection goes back to the pool idle. A Sync after idem_complete
// as well would make the COMMIT run (as a ROLLBACK) in the same round trip
// whatever happened, but it splits the answer in two: the server sends
// idem_complete's result at once and the COMMIT's after the WAL flush, so
// every request would cost both sides one more write and one more wake-up.
func (u *unit) Complete(ctx context.Context, p idem.CompleteParams) error {
	values, err := completeValues(p)
	if err != nil {
		return err // the transaction stays open; the caller's Rollback ends it
	}
	if !u.done.CompareAndSwap(false, true) {
		return pgx.ErrTxClosed
	}
	// Release returns the connection only when it is idle; one that a
	// failure left inside a transaction, busy or closed is destroyed.
	defer u.conn.Release()

	pgConn := u.conn.Conn().PgConn()
	if u.tx == nil {
		// The handler wrote nothing, so no transaction was begun: the
		// completion commits alone, in its statement's implicit
		// transaction. A lost lease raises, and nothing is stored.
		_, err := pgConn.ExecParams(ctx, completeSQL, values, completeOIDs, completeFormats, nil).Close()
		return interpretError(err)
	}
	if st := pgConn.TxStatus(); st != 'T' && st != 'E' {
		// The BEGIN never took effect (the connection failed under it):
		// completing now would commit the result without the writes.
		return fmt.Errorf("idempg: complete: the transaction is not open (status %q): %w", st, pgx.ErrTxClosed)
	}
	// An unnamed statement, parsed each time: preparing it once per
	// connection measured no faster (see bench_variants_test.go).
	pl := pgConn.StartPipeline(ctx)
	pl.SendQueryParams(completeSQL, values, completeOIDs, completeFormats, nil)
	pl.SendQueryParams("COMMIT", nil, nil, nil, nil)
	if err := pl.Sync(); err != nil {
		_ = pl.Close()
		return err
	}
	completeErr, commitTag, commitErr, ioErr := readCompletePipeline(pl)
	if err := pl.Close(); err != nil && ioErr == nil && completeErr == nil && commitErr == nil {
		ioErr = err
	}
	switch {
	case completeErr != nil:
		// The COMMIT was skipped: roll back, business writes included.
		// Should the ROLLBACK fail, Release destroys the connection,
		// and with it the transaction.
		if ioErr == nil && pgConn.TxStatus() == 'E' {
			_ = pgConn.Exec(ctx, "ROLLBACK").Close()
		}
		return interpretError(completeErr)
	case commitErr != nil:
		// A deferred constraint or a serialization failure refused the
		// commit: nothing was stored.
		return interpretError(commitErr)
	case ioErr != nil:
		// The connection failed: the commit may or may not have happened.
		// The engine's fenced Release then deletes nothing if it did.
		return ioErr
	case commitTag.String() != "COMMIT":
		return fmt.Errorf("idempg: commit ended with %q: %w", commitTag.String(), pgx.ErrTxCommitRollback)
	}
	return nil
}

// readCompletePipeline reads the completion pipeline up to its Sync: the
// result of idem_complete, then the COMMIT's unless an error made the
// server skip it. A server error is recorded against the statement it
// belongs to; any other error ends the pipeline.
func readCompletePipeline(pl *pgconn.Pipeline) (completeErr error, commitTag pgconn.CommandTag, commitErr, ioErr error) {
	statement := 0
	record := func(err error) {
		if statement == 0 {
			completeErr = err
		} else if commitErr == nil {
			commitErr = err
		}
		statement++
	}
	for {
		res, err := pl.GetResults()
		if err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				return completeErr, commitTag, commitErr, err
			}
			record(err)
			continue
		}
		switch r := res.(type) {
		case nil:
			return completeErr, commitTag, commitErr, errors.New("idempg: completion pipeline ended early")
		case *pgconn.ResultReader:
			tag, err := r.Close()
			if err != nil {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) {
					return completeErr, commitTag, commitErr, err
				}
				record(err)
				continue
			}
			if statement == 1 {
				commitTag = tag
			}
			statement++
		case *pgconn.PipelineSync:
			return completeErr, commitTag, commitErr, nil
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
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, p idem.CompleteParams) error {
	res := p.Result
	header, err := idem.MarshalHeader(res.Header)
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
