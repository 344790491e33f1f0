package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// Complete implements idem.UnitOfWork.
//
// A unit the handler never used stores the result with one fenced
// statement. So does one the handler rolled back (Tx.Rollback), and one
// whose transaction PostgreSQL aborted after a failed statement: the
// business writes cannot commit, the answer the handler chose is stored
// without them, unless it is a success (a status under 400), which would
// be false: Complete then returns idem.ErrWritesAborted. A transaction the database ended under the handler
// (unitEnded, or found ended here) stores nothing: Complete returns a
// *TxEndedError, and the engine releases the key.
func (u *unit) Complete(ctx context.Context, p idem.CompleteParams) (err error) {
	defer func() {
		if err == nil {
			u.s.changed(p.Tenant, p.Key)
		}
	}()
	u.stmts.Lock()
	defer u.stmts.Unlock()
	u.mu.Lock()
	defer u.mu.Unlock()
	state := u.state
	u.state = unitDone
	switch state {
	case unitIdle, unitRolledBack:
		return u.s.completeAlone(ctx, p)
	case unitEnded:
		return txGone(u.cause)
	case unitDone:
		return errUnitDone
	}
	err = u.complete(ctx, p)
	if errors.Is(err, errAborted) {
		if p.Result.Status < 400 {
			// A success whose writes a failed statement undid: storing
			// it would replay a result that never happened.
			return idem.ErrWritesAborted
		}
		return u.s.completeAlone(ctx, p)
	}
	return err
}

// errAborted is complete's report of a transaction PostgreSQL aborted.
var errAborted = errors.New("idemsql: the transaction was aborted by a failed statement")

// complete checks that the open transaction is the one begin opened,
// completes the record in it and commits; on failure it rolls back. Either
// way the connection goes back to the pool.
func (u *unit) complete(ctx context.Context, p idem.CompleteParams) error {
	s, conn := u.s, u.conn
	if s.d.completeFolded != nil {
		if done, err := s.d.completeFolded(u, ctx, p); done {
			return err
		}
	}
	if s.d.seal != nil {
		if err := s.d.seal(u, ctx); err != nil {
			u.finish(ctx)
			return err
		}
	}
	u.disown()
	args, err := completeArgs(s.d.completeUnitQuery(), p, u.mark)
	if err != nil {
		u.finish(ctx)
		return err
	}
	// Never run again: after a deadlock, InnoDB has rolled back the
	// business writes, and a second run would store the result alone.
	res, err := conn.ExecContext(ctx, s.d.completeUnitQuery().text, args...)
	if err != nil {
		u.finish(ctx)
		if s.d.aborted != nil && s.d.aborted(err) {
			return errAborted
		}
		return fmt.Errorf("idemsql: complete: %w", err)
	}
	if err := fenced(res); err != nil {
		if s.d.recheck && errors.Is(err, idem.ErrLeaseLost) {
			if lost := s.d.intact(u, ctx); lost != nil {
				err = &TxEndedError{Cause: lost}
			}
		}
		u.finish(ctx)
		return err
	}
	if err := u.commit(ctx); err != nil {
		return fmt.Errorf("idemsql: commit: %w", err)
	}
	return nil
}

// commit commits the open transaction and puts the connection back.
func (u *unit) commit(ctx context.Context) error {
	u.disown()
	run := func() error {
		_, err := u.conn.ExecContext(ctx, u.s.d.commit)
		return err
	}
	var err error
	if u.s.d.commitRetries {
		err = u.s.retry(ctx, run)
	} else {
		err = run()
	}
	if err != nil {
		// Committed or not, the connection's state is unknown.
		discard(u.conn)
	} else {
		u.conn.Close()
	}
	u.release()
	return err
}

// completeAlone stores the result with one fenced statement of its own:
// for a unit whose handler made no statement, or whose writes cannot
// commit.
func (s *Store) completeAlone(ctx context.Context, p idem.CompleteParams) error {
	args, err := completeArgs(s.d.complete, p, "")
	if err != nil {
		return err
	}
	var res sql.Result
	err = s.retry(ctx, func() (err error) {
		if err := s.lockWrites(ctx); err != nil {
			return err
		}
		defer s.unlockWrites()
		// Prepared once on the pool: SQLite parses a plain statement at
		// every run, and MySQL's driver prepares and closes it.
		res, err = s.prepared(ctx, s.d.complete).ExecContext(ctx, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsql: complete: %w", err)
	}
	return fenced(res)
}

// completeUnitQuery is the completion inside the unit's transaction.
func (d *dialect) completeUnitQuery() query {
	if d.completeUnit.text != "" {
		return d.completeUnit
	}
	return d.complete
}
