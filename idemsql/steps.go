package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// ErrStepAfterStatement is returned, on SQLite, for a step (idem.Step)
// made after the handler's first statement on its Tx, a read included:
// from that statement to its end, the handler's transaction holds the
// database's only write lock, so the step's record, which must not depend
// on that transaction's commit, could not be written until the handler
// returned. idem.Step returns it before running the step's function
// (the unit of work is an idem.StepChecker). Make the steps before the
// handler's first statement, or use PostgreSQL or MySQL, where a step may
// come anywhere.
var ErrStepAfterStatement = errors.New("idemsql: on SQLite a step must come before the handler's first statement on its transaction, which holds the database's only write lock until the handler returns; make the step first")

// SaveStep implements idem.StepStore: it records one step of the
// execution holding (Tenant, Key) under Token, and returns once it is
// committed. It never runs in the handler's transaction, whose rollback
// must not forget a step whose effect (made elsewhere) stands; it returns
// idem.ErrLeaseLost when the record is no longer in flight under Token.
//
// It is one UPDATE appending the step to the record's steps column, on a
// connection of its own. On SQLite it is queued among the Store's writers
// and waits for its turn as a claim does (the busy timeout, counted from
// the last time the lock changed hands); when the execution's own
// transaction holds the write lock, it fails at once with
// ErrStepAfterStatement (idem.Step has refused such a step before running
// it, unless the handler began its transaction while the step ran).
//
// A name saved twice by one execution (two Steps of one name run at once)
// is stored twice, and only its first value is ever read back
// (idemcodec.UnmarshalSteps keeps the first): checking first would cost a read
// on every step for a mistake of the handler's.
func (s *Store) SaveStep(ctx context.Context, p idem.SaveStepParams) error {
	step := idemcodec.AppendStep(nil, p.Name, p.Value)
	args := s.d.saveStep.args(map[string]any{"tenant": p.Tenant, "key": p.Key, "token": p.Token, "step": step, "step_len": len(step)})
	var res sql.Result
	err := s.retry(ctx, func() (err error) {
		if s.writes != nil {
			if err := s.writes.acquireStep(ctx, s.writeLimit(ctx), lease{p.Tenant, p.Key, p.Token}); err != nil {
				return err
			}
			defer s.unlockWrites()
		}
		res, err = s.db.ExecContext(ctx, s.d.saveStep.text, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsql: save step: %w", err)
	}
	// The step is never empty, so the row changes whenever it matches:
	// rows affected are exact on every dialect.
	if err := fenced(res); err != nil {
		if s.d.stepBounded && s.stepHeld(ctx, p) {
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
