package idemsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// unitState is where a unit of work stands.
type unitState int

const (
	// unitIdle: the handler has made no statement yet; the unit holds no
	// connection and no transaction.
	unitIdle unitState = iota
	// unitOpen: the transaction is open on conn.
	unitOpen
	// unitEnded: the database ended the transaction under the handler
	// (cause says how); the connection is back in the pool.
	unitEnded
	// unitRolledBack: the handler rolled the transaction back; the
	// connection is back in the pool.
	unitRolledBack
	// unitDone: completed or abandoned.
	unitDone
)

// cleanupTimeout bounds the statements that end a transaction on behalf
// of a caller whose context has ended, or that gave none (Tx.Rollback).
const cleanupTimeout = 5 * time.Second

// savepoint marks, on SQLite and MySQL, the start of the unit's
// transaction: a savepoint lives exactly as long as the transaction it was
// set in, so RELEASE SAVEPOINT succeeds only in that transaction (see
// unit.complete).
const savepoint = "idem_unit"

// unit is the idem.UnitOfWork of a Store: one database transaction, begun
// at the handler's first statement on its Tx, on a connection held from
// then on.
//
// The transaction is driven by statements on a *sql.Conn (BEGIN, COMMIT,
// SAVEPOINT…) rather than through *sql.Tx, which cannot begin lazily with
// the statement's context, run MySQL with autocommit off, nor check that
// its transaction is still the one it began.
type unit struct {
	s  *Store
	tx Tx // the handler's handle, at a stable address

	// stmts is held shared by each statement of the handler, and
	// exclusively while the unit ends (Complete, Rollback, Tx.Rollback),
	// so that no statement runs on the connection while, or after, the
	// transaction ends.
	stmts sync.RWMutex

	mu    sync.Mutex // guards what follows, and the transaction's beginning
	state unitState
	conn  *sql.Conn
	cause error // unitEnded: the error that revealed the end
	// mark is the value SET LOCAL gave idem.unit in this transaction
	// (Postgres).
	mark string

	// SQLite: locked is true while the unit holds the Store's gate, and
	// its transaction the write lock; lease is the execution the unit runs
	// (learnt from the context of its first statement), which the gate
	// knows as an owner when isOwner (see gate.own).
	locked  bool
	lease   lease
	isOwner bool
	// What disown learnt from the gate: the extension owed.
	owed *idem.ExtendParams
	// lockWait, when positive, bounds the wait of the transaction's
	// first statement for SQLite's write lock once the Store's gate has
	// passed to it: then only a writer of another process can hold the
	// lock. A claim of the single-transaction mode sets it to its wait
	// limit (singleLockWait), since the holder may be a duplicate's
	// execution, which no one here can tell from another key's. It is
	// counted from the beginning of begin, the wait for the gate
	// included, and is at least singleMinLockWait once the gate passed.
	lockWait time.Duration
}

var (
	_ idem.UnitOfWork  = (*unit)(nil)
	_ idem.StepChecker = (*unit)(nil)
)

// CheckStep implements idem.StepChecker: on SQLite, a step is refused
// with ErrStepAfterStatement once the handler's transaction has begun (at
// its first statement, a read included), since the transaction then
// holds the write lock the step's record would wait for. Elsewhere, and
// once the transaction has ended (Tx.Rollback, or the database ended it),
// a step may come at any time.
func (u *unit) CheckStep(context.Context) error {
	if !u.s.d.oneWriter {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.state == unitOpen {
		return ErrStepAfterStatement
	}
	return nil
}

func newUnit(s *Store) *unit {
	u := &unit{s: s}
	u.tx.u = u
	return u
}

// Context implements idem.UnitOfWork: ctx carries the handler's Tx.
func (u *unit) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, &u.tx)
}

// use returns the connection of the open transaction, beginning it on the
// handler's first statement.
func (u *unit) use(ctx context.Context) (*sql.Conn, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch u.state {
	case unitOpen:
		return u.conn, nil
	case unitIdle:
		if err := u.begin(ctx); err != nil {
			return nil, err
		}
		return u.conn, nil
	case unitEnded:
		return nil, txGone(u.cause)
	case unitRolledBack:
		return nil, ErrTxRolledBack
	}
	return nil, errUnitDone
}

// begin takes a connection and begins the transaction on it. It runs with
// u.mu held.
func (u *unit) begin(ctx context.Context) error {
	_, err := u.beginThen(ctx, nil, nil)
	return err
}

// beginThen is begin, and when then is not nil, runs then (with the named
// values) in the call that sends the last of the dialect's beginning
// statements, returning its result: one call where the driver runs the
// statements of one text in order, stopping at the first error (SQLite).
func (u *unit) beginThen(ctx context.Context, then *query, values map[string]any) (sql.Result, error) {
	s := u.s
	began := time.Now()
	if err := s.lockWrites(ctx); err != nil {
		return nil, fmt.Errorf("idemsql: begin: %w", err)
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		s.unlockWrites()
		return nil, fmt.Errorf("idemsql: begin: %w", err)
	}
	stmts := s.d.begin(u, ctx, conn)
	var res sql.Result
	for i, q := range stmts {
		var args []any
		if then != nil && i == len(stmts)-1 {
			q += "; " + then.text
			args = then.args(values)
		}
		runCtx, cancel := ctx, context.CancelFunc(func() {})
		lockWait := u.lockWait
		if i == 0 && lockWait > 0 {
			// The wait in the Store's own queue counts: claims queued
			// behind one that waits for another process's lock would
			// otherwise each add their whole limit to the wait of the
			// claims behind them. Never less than singleMinLockWait,
			// so that a claim let through late still gets a free lock.
			lockWait = max(lockWait-time.Since(began), singleMinLockWait)
			runCtx, cancel = context.WithTimeout(ctx, lockWait)
		}
		run := func() (err error) {
			res, err = conn.ExecContext(runCtx, q, args...)
			return err
		}
		var err error
		if i == 0 && s.d.beginRetries {
			err = s.retry(runCtx, run)
		} else {
			err = run()
		}
		waited := runCtx != ctx && runCtx.Err() != nil && ctx.Err() == nil
		cancel()
		if err != nil {
			// What the session holds now is unknown: never pool it.
			discard(conn)
			s.unlockWrites()
			if waited {
				return nil, fmt.Errorf("idemsql: begin: %w (waited %s for the write lock, which another process's transaction holds)", idem.ErrInFlight, time.Since(began).Round(time.Millisecond))
			}
			return nil, fmt.Errorf("idemsql: begin: %w", err)
		}
	}
	u.conn = conn
	u.state = unitOpen
	if s.writes != nil {
		u.locked = true
		if x, ok := idem.ExecutionFromContext(ctx); ok {
			u.lease = lease{x.Tenant, x.Key, x.LeaseToken}
			u.isOwner = true
			s.writes.own(u.lease)
		}
	}
	return res, nil
}

// failed looks at the error of one of the handler's statements and tells
// whether it ended the transaction: then the unit is over (unitEnded), its
// connection goes back to the pool (statements prepared on it fail from
// then on), and the error returned says so.
func (u *unit) failed(ctx context.Context, conn *sql.Conn, err error) error {
	if !u.endedBy(ctx, conn, err) {
		return err
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.state != unitOpen || u.conn != conn {
		return &TxEndedError{Cause: err}
	}
	u.state = unitEnded
	u.cause = err
	u.finish(ctx)
	return &TxEndedError{Cause: err}
}

// endedBy reports whether err, returned by a statement on conn, came with
// the end of the transaction.
func (u *unit) endedBy(ctx context.Context, conn *sql.Conn, err error) bool {
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		// The connection is gone, and its transaction with it.
		return true
	}
	return u.s.d.endedBy(u, ctx, conn, err)
}

// finish ends the open transaction without completing: rolled back, or,
// on SQLite when the unit owes a lease extension, rolled back to its
// savepoint and committed with the extension, so that the lock is never
// free while the lease it kept from being extended may have run out. The
// connection goes back to the pool (or is discarded when its state is
// unknown). It runs with u.mu held.
func (u *unit) finish(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	conn := u.conn
	owed := u.disown()
	ok := true
	exec := func(q string) {
		if ok {
			_, err := conn.ExecContext(ctx, q)
			ok = err == nil
		}
	}
	keep := func() {
		_, err := u.s.extendOn(ctx, conn, *owed)
		ok = err == nil
	}
	switch {
	case owed != nil:
		exec("ROLLBACK TO SAVEPOINT " + savepoint)
		if ok {
			keep()
			exec("COMMIT")
		} else {
			// The transaction had ended already, and the lock with it:
			// write at once, while this Store still lets no other writer
			// of its own in.
			ok = true
			exec("ROLLBACK")
			keep()
			ok = true
		}
	default:
		for _, q := range u.s.d.rollback {
			exec(q)
		}
		if !ok && u.s.d.rollbackMayFail {
			ok = true
		}
	}
	if ok {
		conn.Close()
	} else {
		discard(conn)
	}
	u.conn = nil
	u.release()
}

// disown tells the gate, before the transaction gives up the write lock,
// that the lease's extensions and steps must wait for the gate again
// (SQLite). It returns the extension skipped meanwhile, if any; called
// again, it returns the same.
func (u *unit) disown() *idem.ExtendParams {
	if u.isOwner {
		u.isOwner = false
		u.owed = u.s.writes.disown(u.lease)
	}
	return u.owed
}

// release gives up the Store's gate (SQLite), once the transaction has
// ended.
func (u *unit) release() {
	if !u.locked {
		return
	}
	u.locked = false
	u.s.unlockWrites()
}

// Rollback implements idem.UnitOfWork. After Complete it does nothing.
//
// It returns a *TxEndedError when the database had ended the transaction
// (found now on MySQL and SQLite, where a savepoint marks it): the engine
// then stores nothing, not even an answer meant to be stored without the
// writes (idem.RollbackWrites, a 5xx), since an answer given after a
// deadlock or an implicit commit says nothing of the request.
func (u *unit) Rollback(ctx context.Context) error {
	u.stmts.Lock()
	defer u.stmts.Unlock()
	u.mu.Lock()
	defer u.mu.Unlock()
	state := u.state
	u.state = unitDone
	switch state {
	case unitEnded:
		return txGone(u.cause)
	case unitOpen:
		var err error
		if u.s.d.checkOnRollback {
			err = u.checkIntact(ctx)
		}
		u.finish(ctx)
		if err != nil {
			return txGone(err)
		}
	}
	return nil
}

// rollbackByHandler is Tx.Rollback: the writes are undone now, and the
// answer the handler goes on to give is stored alone.
func (u *unit) rollbackByHandler() error {
	u.stmts.Lock()
	defer u.stmts.Unlock()
	u.mu.Lock()
	defer u.mu.Unlock()
	switch u.state {
	case unitIdle, unitRolledBack:
		u.state = unitRolledBack
		return nil
	case unitEnded:
		// The unit stays ended: an answer given after the database ended
		// the transaction (a deadlock) is never stored, not even alone.
		return txGone(u.cause)
	case unitDone:
		return errUnitDone
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := u.checkIntact(ctx); err != nil {
		// Ended behind the handler's back without an error to show for
		// it (DDL on MySQL committed it): the writes may stand, so the
		// answer must not be stored as if they had been undone.
		u.state = unitEnded
		u.cause = err
		u.finish(ctx)
		return txGone(err)
	}
	u.state = unitRolledBack
	u.finish(ctx)
	return nil
}

// checkIntact checks, without changing it, that the open transaction is
// the one begin opened.
func (u *unit) checkIntact(ctx context.Context) error { return u.s.d.intact(u, ctx) }

// discard closes conn and keeps it out of the pool: database/sql drops a
// connection whose Raw function reports driver.ErrBadConn.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	conn.Close()
}
