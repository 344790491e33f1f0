package idemsql

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

// On MariaDB, idemsql sends its statements of a request folded into
// compound statements (BEGIN NOT ATOMIC … END): each is one round trip,
// and the server runs its parts in order, stopping at the first error,
// so the statements keep their meaning one by one. MySQL has no compound
// statement outside stored programs; there the statements go one by one.
//
//   - The default mode's claim folds the peek in: the claim statement runs
//     only when no complete record within its retention holds the key,
//     then one read returns the record and the outcome. A replay is that
//     round trip, which takes no lock (a plain consistent read); a fresh
//     key is that round trip too, where it was a read and a claim. A lost
//     claim returns its holder's record, a takeover its recovery points:
//     no read follows.
//   - The unit's transaction begins in one round trip (autocommit off,
//     then the savepoint that marks it).
//   - The completion releases the savepoint, completes the record, and
//     commits only when the completion matched the record (ROW_COUNT() is
//     exact: the completion always changes state); otherwise it raises an
//     error, and the transaction, still open, is rolled back.
//   - In the single-transaction mode, the claim of a key the read found
//     without a record also begins the handler's transaction, in the same
//     round trip.
//
// The statements that run on the unit's own connection are sent as text,
// their values written in as literals (numbers, and hexadecimal strings
// for text and bytes, which nothing a client sent can escape): MySQL's
// driver would otherwise prepare, run and close each one (its
// interpolateParams is off by default), two round trips where the text is
// one. The claim of the default mode runs on the pool, prepared once.

// mariaSignal is the error number SIGNAL SQLSTATE '45000' raises
// (ER_SIGNAL_EXCEPTION): the folded completion's report of a record that
// is no longer held under the token.
const mariaSignal = 1644

// mariaInlineLimit bounds the size of a completion written as text; a
// larger answer goes as arguments of the statements one by one, rather
// than doubled into hexadecimal.
const mariaInlineLimit = 64 << 10

// mariaClaim is the default mode's claim on MariaDB, folded with the peek
// (see above): a complete record within its retention is returned at once,
// in a first result set, with the outcome -1 (the claim did not run);
// otherwise that set is empty, the claim runs, and a second result set
// holds the record after it with the claim's last insert id: 0 lost, 1
// won, 2 won by a takeover (see mysqlDialect.claim). A replay is one
// plain consistent read. No condition holds a subquery: MariaDB makes a
// subquery in a compound statement's IF a locking read, which would wait
// for a transaction holding the row.
var mariaClaim = compile(`BEGIN NOT ATOMIC
  SELECT `+recordColumns+`, -1 FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key
      AND state = 'complete' AND expires_at > UTC_TIMESTAMP(6);
  IF FOUND_ROWS() = 0 THEN
    `+mysqlClaimSQL+`;
    SELECT `+recordColumns+`, LAST_INSERT_ID() FROM idem_keys WHERE tenant_id = @tenant AND idem_key = @key;
  END IF;
END`, positional)

// mariaClaimNew is the single-transaction mode's claim of a key that the
// read before it found without a record: autocommit goes off, the
// savepoint marks the handler's transaction, and a plain INSERT writes the
// claim's row, uncommitted, in that transaction. Should another
// transaction have inserted the key since the read, the INSERT waits for
// it, bounded by mariaWaitBound (the claim's wait limit, which prefixes
// the compound statement; innodb_lock_wait_timeout, @wait, in whole
// seconds rounded up, stays behind it), and fails on the duplicate if it
// committed; then the claim goes the general
// way (ClaimUnit). A short statement: MariaDB parses text every time.
var mariaClaimNew = compile(`BEGIN NOT ATOMIC
  SET autocommit = 0;
  SAVEPOINT `+savepoint+`;
  SET STATEMENT innodb_lock_wait_timeout = @wait FOR
  INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token,
      locked_until, storage_mode, created_at, expires_at)
  VALUES (@tenant, @key, @fingerprint, 'in_flight', @token,
      UTC_TIMESTAMP(6) + INTERVAL @lease MICROSECOND, 0, UTC_TIMESTAMP(6),
      UTC_TIMESTAMP(6) + INTERVAL @retention MICROSECOND);
END`, positional)

// mariaBegin begins the unit's transaction in one round trip (see
// mysqlRules.begin).
const mariaBegin = `BEGIN NOT ATOMIC SET autocommit = 0; SAVEPOINT ` + savepoint + `; END`

// mariaComplete is the completion in the unit's transaction: the
// savepoint's release (which fails when the database ended the
// transaction), the fenced completion, and the commit when it matched.
var mariaComplete = compile(`BEGIN NOT ATOMIC
  RELEASE SAVEPOINT `+savepoint+`;
  UPDATE idem_keys SET state = 'complete', storage_mode = @mode,
      status_code = @status, response_headers = CONVERT(@headers USING utf8mb4), response_body = @body,
      resource_ref = CONVERT(@ref USING utf8mb4), completed_at = UTC_TIMESTAMP(6)
  WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'in_flight';
  IF ROW_COUNT() = 1 THEN
    SET autocommit = 1;
  ELSE
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'idemsql: the record is not in flight under this lease token';
  END IF;
END`, positional)

// queryRower is a *sql.DB or a *sql.Conn.
type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// isMariaDB reports whether the MySQL server is MariaDB, read once.
func (s *Store) isMariaDB(ctx context.Context, db queryRower) bool {
	switch s.mariaDB.Load() {
	case 1:
		return false
	case 2:
		return true
	}
	var version string
	if err := db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		return false
	}
	v := int32(1)
	if strings.Contains(strings.ToLower(version), "mariadb") {
		v = 2
	}
	s.mariaDB.Store(v)
	return v == 2
}

// claimMariaDB is rules.claimFolded on MySQL: the default mode's claim
// folded with its peek, on MariaDB (ok false elsewhere).
func (s *Store) claimMariaDB(ctx context.Context, p idem.ClaimParams) (_ idem.ClaimResult, ok bool, _ error) {
	if !s.isMariaDB(ctx, s.db) {
		return idem.ClaimResult{}, false, nil
	}
	args := mariaClaim.args(claimValues(p))
	for range claimAttempts {
		var rec *idem.Record
		var steps []byte
		var outcome int64
		err := s.retry(ctx, func() (err error) {
			rec, steps, outcome, err = s.runMariaClaim(ctx, args)
			return err
		})
		if errors.Is(err, sql.ErrNoRows) {
			// No record after a claim that did not win: released or
			// purged in between. (A won claim's row is there: only its
			// holder releases it.)
			continue
		}
		if n, _ := s.d.number(err); n == mysqlUnsupportedPS {
			// A MariaDB that cannot prepare a compound statement: nothing
			// ran; the Store sends its statements one by one from now on.
			s.mariaDB.Store(1)
			return idem.ClaimResult{}, false, nil
		}
		if err != nil {
			err = fmt.Errorf("idemsql: claim: %w", err)
			if ctx.Err() == nil {
				// See Claim: a cancelled statement may still have run.
				err = idem.NotApplied(err)
			}
			return idem.ClaimResult{}, true, err
		}
		if outcome != 1 && outcome != 2 {
			return idem.ClaimResult{Record: rec}, true, nil
		}
		out := claimOutcome{won: true, takeover: outcome == 2, stepsKnown: true}
		if out.takeover && rec.LeaseToken == p.Token {
			out.steps = steps
		}
		res, err := s.won(ctx, p, out)
		return res, true, err
	}
	return idem.ClaimResult{}, true, fmt.Errorf("idemsql: claim: the record vanished %d times between claim and read", claimAttempts)
}

// runMariaClaim runs mariaClaim and reads the record from whichever of
// its result sets holds it (sql.ErrNoRows: neither).
func (s *Store) runMariaClaim(ctx context.Context, args []any) (rec *idem.Record, steps []byte, outcome int64, err error) {
	rows, err := s.prepared(ctx, mariaClaim).QueryContext(ctx, args...)
	if err != nil {
		return nil, nil, 0, err
	}
	defer rows.Close()
	for !rows.Next() {
		// An error of the claim ends the statement here.
		if !rows.NextResultSet() {
			if err := rows.Err(); err != nil {
				return nil, nil, 0, err
			}
			return nil, nil, 0, sql.ErrNoRows
		}
	}
	if rec, steps, err = scanRecord(s.d, rows, &outcome); err != nil {
		return nil, nil, 0, err
	}
	return rec, steps, outcome, rows.Close()
}

// claimNewMariaDB is rules.claimUnitNew on MySQL: on MariaDB, the
// transaction and the claim of a key without a record in one round trip
// (mariaClaimNew). It returns nil, without error, when the claim must go
// the general way: the key got a record meanwhile, a deadlock among
// duplicates (nothing was claimed), or the server is not MariaDB.
func (s *Store) claimNewMariaDB(ctx context.Context, p idem.ClaimParams, wait time.Duration) (*singleUnit, error) {
	if !s.isMariaDB(ctx, s.db) {
		return nil, nil
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	values := claimValues(p)
	// innodb_lock_wait_timeout counts whole seconds (0: do not wait).
	values["wait"] = int64((wait + time.Second - 1) / time.Second)
	u := newUnit(s)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.conn, u.state = conn, unitOpen
	_, err = conn.ExecContext(ctx, mariaWaitBound(wait)+inline(mariaClaimNew, values))
	if err == nil {
		return &singleUnit{u: u, params: p}, nil
	}
	// The transaction, if it began, is rolled back.
	u.state = unitDone
	u.finish(ctx)
	switch n, _ := s.d.number(err); n {
	case mysqlDuplicate, mysqlDeadlock:
		return nil, nil
	case mysqlLockWaitTimeout, mariaStatementTimeout:
		return nil, fmt.Errorf("idemsql: %w (waited %s for its transaction)", idem.ErrInFlight, wait)
	}
	return nil, err
}

// completeMariaDB is rules.completeFolded on MySQL: the completion and
// the commit in one round trip, on MariaDB, for an answer small enough to
// be written in as text (done false otherwise: the caller completes
// statement by statement). It ends the transaction either way.
func (u *unit) completeMariaDB(ctx context.Context, p idem.CompleteParams) (done bool, _ error) {
	if len(p.Result.Body)+len(p.Result.Reference) > mariaInlineLimit || !u.s.isMariaDB(ctx, u.conn) {
		return false, nil
	}
	values, err := completeValues(p, "")
	if err != nil {
		return true, u.abandon(ctx, err)
	}
	if h, _ := values["headers"].(string); len(h) > mariaInlineLimit {
		return false, nil
	}
	// Never run again: after a deadlock, InnoDB has rolled back the
	// business writes, and a second run would store the result alone.
	if _, err := u.conn.ExecContext(ctx, inline(mariaComplete, values)); err != nil {
		n, _ := u.s.d.number(err)
		switch n {
		case mysqlNoSavepoint:
			err = &TxEndedError{Cause: fmt.Errorf("its savepoint is gone: %w", err)}
		case mariaSignal:
			err = idem.ErrLeaseLost
		default:
			err = fmt.Errorf("idemsql: complete: %w", err)
		}
		return true, u.abandon(ctx, err)
	}
	u.conn.Close()
	u.release()
	return true, nil
}

// abandon rolls the open transaction back and returns err.
func (u *unit) abandon(ctx context.Context, err error) error {
	u.finish(ctx)
	return err
}

// inline writes q's arguments into its text as literals: integers in
// decimal, text and bytes as hexadecimal strings (X'…'), which nothing
// in them can escape, nil as NULL.
func inline(q query, values map[string]any) string {
	var b strings.Builder
	b.Grow(len(q.text) + 256)
	i := 0
	for _, part := range strings.SplitAfter(q.text, "?") {
		if !strings.HasSuffix(part, "?") {
			b.WriteString(part)
			break
		}
		b.WriteString(part[:len(part)-1])
		writeLiteral(&b, values[q.names[i]])
		i++
	}
	return b.String()
}

// writeLiteral writes v as a SQL literal (see inline).
func writeLiteral(b *strings.Builder, v any) {
	switch v := v.(type) {
	case nil:
		b.WriteString("NULL")
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case int:
		b.WriteString(strconv.Itoa(v))
	case string:
		b.WriteString("X'")
		b.WriteString(hex.EncodeToString([]byte(v)))
		b.WriteByte('\'')
	case []byte:
		b.WriteString("X'")
		b.WriteString(hex.EncodeToString(v))
		b.WriteByte('\'')
	default:
		panic(fmt.Sprintf("idemsql: no literal for %T", v))
	}
}
