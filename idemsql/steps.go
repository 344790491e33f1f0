package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// SaveStep implements idem.StepStore: it records one step of the
// execution holding (Tenant, Key) under Token, and returns once it is
// committed. It never runs in the handler's transaction, whose rollback
// must not forget a step whose effect (made elsewhere) stands; it returns
// idem.ErrLeaseLost when the record is no longer in flight under Token.
//
// On PostgreSQL and MySQL it is one UPDATE appending the step to the
// record's steps column, on a connection of its own. On SQLite it is that
// UPDATE too, queued among the Store's writers, unless the execution's own
// transaction holds the write lock: the UPDATE would wait for that
// transaction, which waits for the handler, which waits for the step. The
// step then goes to the step journal, a second database file beside the
// main one, and moves into the record when the transaction ends, in the
// transaction that ends it (see journal.go).
//
// A name saved twice by one execution (two Steps of one name run at once)
// is stored twice, and only its first value is ever read back
// (idem.UnmarshalSteps keeps the first): checking first would cost a read
// on every step for a mistake of the handler's.
func (s *Store) SaveStep(ctx context.Context, p idem.SaveStepParams) error {
	step := idem.AppendStep(nil, p.Name, p.Value)
	args := s.d.saveStep.args(map[string]any{"tenant": p.Tenant, "key": p.Key, "token": p.Token, "step": step, "step_len": len(step)})
	var res sql.Result
	var owned *owner
	err := s.retry(ctx, func() (err error) {
		if s.writes != nil {
			owned, err = s.writes.acquireStep(ctx, s.writeLimit(ctx), lease{p.Tenant, p.Key, p.Token})
			if err != nil || owned != nil {
				return err
			}
			defer s.unlockWrites()
		}
		res, err = s.db.ExecContext(ctx, s.d.saveStep.text, args...)
		return err
	})
	if owned != nil {
		return s.saveToJournal(ctx, owned, p, step)
	}
	if err != nil {
		return fmt.Errorf("idemsql: save step: %w", err)
	}
	// The step is never empty, so the row changes whenever it matches:
	// rows affected are exact on every dialect.
	if err := fenced(res); err != nil {
		if s.d.kind == kindMySQL && s.stepHeld(ctx, p) {
			// Held, so refused for its size (see the MySQL saveStep).
			return fmt.Errorf("idemsql: save step %q: the record's steps would outgrow the server's max_allowed_packet; the step (%d bytes) is not saved", p.Name, len(step))
		}
		return err
	}
	return nil
}

// stepHeld reports whether the record of p is in flight under p.Token.
func (s *Store) stepHeld(ctx context.Context, p idem.SaveStepParams) bool {
	var one int
	err := s.db.QueryRowContext(ctx, s.d.held.text, s.d.held.args(map[string]any{
		"tenant": p.Tenant, "key": p.Key, "token": p.Token,
	})...).Scan(&one)
	return err == nil
}

// saveToJournal writes step to the journal for the execution p, whose
// unit of work o holds SQLite's write lock, after checking that the
// record is in flight under p.Token: while that transaction holds the
// lock, no other writer can change it. The check reads on the
// transaction's own connection (the pool may have no other), which sees
// the last commit, since the handler does not write idem_keys. o waits for
// this write before its transaction gives the lock up.
func (s *Store) saveToJournal(ctx context.Context, o *owner, p idem.SaveStepParams, step []byte) (err error) {
	journaled := false
	defer func() { s.writes.stepDone(o, journaled) }()
	var one int
	err = o.conn.QueryRowContext(ctx, s.d.held.text, s.d.held.args(map[string]any{
		"tenant": p.Tenant, "key": p.Key, "token": p.Token,
	})...).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return idem.ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("idemsql: save step: %w", err)
	}
	j, err := s.journalDB(ctx, o.conn, true)
	if err != nil {
		return fmt.Errorf("idemsql: save step: %w", err)
	}
	// The journal's commit flushes its own file only: flush the main
	// file's WAL first, which may end with the execution's claim,
	// committed without waiting for the disk (see asyncClaim). A step
	// recorded for a claim a crash of the machine could lose would be
	// found by nobody.
	if err := s.syncWAL(); err != nil {
		return fmt.Errorf("idemsql: save step: %w", err)
	}
	journaled = true
	err = s.retry(ctx, func() error {
		_, err := j.ExecContext(ctx, `INSERT INTO idem_steps (tenant_id, idem_key, lease_token, step) VALUES (?, ?, ?, ?)`,
			p.Tenant, p.Key, p.Token, step)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsql: save step to the journal: %w", err)
	}
	return nil
}

// foldJournal moves the journal's rows of the execution l into the steps
// of its record, on conn: the unit's connection, inside the transaction
// that is about to end. It reports whether there were rows to move.
func (s *Store) foldJournal(ctx context.Context, conn *sql.Conn, l lease) (bool, error) {
	journaled, err := s.journalSteps(ctx, conn, l.tenant, l.key, l.token)
	if err != nil || len(journaled) == 0 {
		return false, err
	}
	_, err = conn.ExecContext(ctx, s.d.saveStep.text, s.d.saveStep.args(map[string]any{
		"tenant": l.tenant, "key": l.key, "token": l.token, "step": journaled, "step_len": len(journaled),
	})...)
	return err == nil, err
}
