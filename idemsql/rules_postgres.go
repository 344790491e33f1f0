package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
)

// postgresRules is how PostgreSQL, through database/sql, runs what
// differs.
var postgresRules = rules{
	checkTenant: func(tenant string) error {
		if pgText(tenant) {
			return nil
		}
		// Refused here, in words that never quote it: PostgreSQL's own
		// error would, in part, and a tracer exports error texts.
		return fmt.Errorf("idemsql: claim: the tenant is not valid UTF-8 text without NUL bytes, which PostgreSQL's text cannot hold (%d bytes; its value is not shown)", len(tenant))
	},
	claimOnce: (*Store).claimStatement,
	claimIn:   (*Store).claimInPostgres,
	// One round trip: without arguments the drivers send the string as a
	// simple query, which may hold several statements. SET LOCAL marks
	// the transaction: completeUnit matches only while the mark holds.
	begin: func(u *unit, _ context.Context, _ *sql.Conn) []string {
		u.mark = strconv.FormatInt(rand.Int64(), 10)
		return []string{"BEGIN; SET LOCAL idem.unit = '" + u.mark + "'"}
	},
	// A deadlock or a serialization failure (class 40, "transaction
	// rollback"): the server keeps the transaction open but aborted, and
	// it can never commit. Unlike another failed statement, whose answer
	// the handler may mean (a unique violation answered 409), it says
	// nothing of the request: the retry would succeed. PostgreSQL aborts
	// the transaction on any other error too, and the completion then
	// stores the answer alone (see unit.Complete).
	endedBy: func(_ *unit, _ context.Context, _ *sql.Conn, err error) bool {
		return strings.HasPrefix(postgresState(err), postgresRollbackClass)
	},
	intact: func(u *unit, ctx context.Context) error {
		if !u.markHeld(ctx, u.conn) {
			return errors.New("the transaction was ended by a COMMIT or ROLLBACK the handler sent as SQL")
		}
		return nil
	},
	recheck:  true,
	aborted:  func(err error) bool { return postgresState(err) == postgresTxAborted },
	commit:   "COMMIT",
	rollback: []string{"ROLLBACK"},
	attempts: 5,

	clockSQL:    `SELECT now()`,
	timeValue:   func(t time.Time) any { return t.UTC() },
	hourSQL:     func(col string) string { return `floor(extract(epoch FROM ` + col + `) / 3600)::bigint` },
	cursorAfter: `(tenant_id, created_at, idem_key) > (@ct, @cc, @ck)`,
}

// claimInPostgres is rules.claimIn on PostgreSQL: the claim statement,
// its wait on a row another transaction inserted bounded by lock_timeout.
func (s *Store) claimInPostgres(ctx context.Context, conn *sql.Conn, values map[string]any, wait time.Duration) (won, takeover bool, rec *idem.Record, err error) {
	// lock_timeout bounds the wait on a row another transaction
	// inserted, for the claim only: set for the transaction, and set
	// back right after (0 would mean no limit).
	ms := strconv.FormatInt(max(wait.Milliseconds(), 1), 10)
	if _, err := conn.ExecContext(ctx, "SET LOCAL lock_timeout = "+ms); err != nil {
		return false, false, nil, err
	}
	var token int64
	var steps []byte
	err = conn.QueryRowContext(ctx, s.d.claim.text, s.d.claim.args(values)...).Scan(&token, &steps, &takeover)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, false, nil, nil
	case postgresState(err) == "55P03":
		return false, false, nil, fmt.Errorf("idemsql: %w (waited %s for its transaction)", idem.ErrInFlight, wait)
	case err != nil:
		return false, false, nil, err
	}
	if _, err := conn.ExecContext(ctx, "SET LOCAL lock_timeout TO DEFAULT"); err != nil {
		return false, false, nil, err
	}
	return true, takeover, nil, nil
}

// markHeld reports whether idem.unit still holds the unit's mark, that is
// whether the transaction is the one begin opened (Postgres).
func (u *unit) markHeld(ctx context.Context, conn *sql.Conn) bool {
	var v sql.NullString
	err := conn.QueryRowContext(ctx, `SELECT current_setting('idem.unit', true)`).Scan(&v)
	return err == nil && v.String == u.mark
}

// pgText reports whether PostgreSQL's text can hold s: valid UTF-8
// without NUL bytes.
func pgText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }
