package idemsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
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
	if u.s.d.kind != kindSQLite {
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
	s := u.s
	if err := s.lockWrites(ctx); err != nil {
		return fmt.Errorf("idemsql: begin: %w", err)
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		s.unlockWrites()
		return fmt.Errorf("idemsql: begin: %w", err)
	}
	var stmts []string
	switch s.d.kind {
	case kindSQLite:
		// IMMEDIATE takes the write lock now: a deferred transaction that
		// read first could not take it later if another connection had
		// written meanwhile (SQLITE_BUSY at once, whatever the busy
		// timeout).
		stmts = []string{"BEGIN IMMEDIATE", "SAVEPOINT " + savepoint}
	case kindMySQL:
		// With autocommit off, no statement of the session commits on its
		// own: if the server ends the transaction (a deadlock rolls it
		// back, DDL commits it), what follows opens another transaction,
		// which the completion finds and rolls back, instead of
		// committing statement by statement. The first statement opens the
		// transaction; the savepoint marks it.
		stmts = []string{"SET autocommit = 0", "SAVEPOINT " + savepoint}
	case kindPostgres:
		// One round trip: without arguments the drivers send the string
		// as a simple query, which may hold several statements.
		u.mark = strconv.FormatInt(rand.Int64(), 10)
		stmts = []string{"BEGIN; SET LOCAL idem.unit = '" + u.mark + "'"}
	}
	for i, q := range stmts {
		run := func() error {
			_, err := conn.ExecContext(ctx, q)
			return err
		}
		var err error
		if i == 0 && s.d.kind == kindSQLite {
			// Busy here means BEGIN IMMEDIATE did not begin: it may run
			// again.
			err = s.retry(ctx, run)
		} else {
			err = run()
		}
		if err != nil {
			// What the session holds now is unknown: never pool it.
			discard(conn)
			s.unlockWrites()
			return fmt.Errorf("idemsql: begin: %w", err)
		}
	}
	u.conn = conn
	u.state = unitOpen
	if s.d.kind == kindSQLite {
		u.locked = true
		if x, ok := idem.ExecutionFromContext(ctx); ok {
			u.lease = lease{x.Tenant, x.Key, x.LeaseToken}
			u.isOwner = true
			s.writes.own(u.lease)
		}
	}
	return nil
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
	d := u.s.d
	switch d.kind {
	case kindMySQL:
		n, ok := d.number(err)
		if !ok {
			return false
		}
		switch n {
		case mysqlDeadlock, mysqlLockTableFull:
			return true
		case mysqlLockWaitTimeout:
			return u.s.rollsBackOnTimeout(ctx, conn)
		}
	case kindPostgres:
		// A deadlock or a serialization failure (class 40, "transaction
		// rollback"): the server keeps the transaction open but aborted,
		// and it can never commit. Unlike another failed statement,
		// whose answer the handler may mean (a unique violation answered
		// 409), it says nothing of the request: the retry would succeed.
		return strings.HasPrefix(postgresState(err), postgresRollbackClass)
	case kindSQLite:
		// SQLite may roll the whole transaction back after an error
		// (SQLITE_FULL, SQLITE_IOERR, SQLITE_NOMEM, an interrupt, which
		// is how the driver honours a cancelled context, or an
		// ON CONFLICT ROLLBACK), and says nothing of it. BEGIN tells:
		// inside a transaction it fails and changes nothing; outside one,
		// it begins one, which the probe ends at once.
		probe := context.WithoutCancel(ctx)
		if _, err := conn.ExecContext(probe, "BEGIN"); err == nil {
			_, _ = conn.ExecContext(probe, "ROLLBACK")
			return true
		}
	}
	// PostgreSQL aborts the transaction on any other error, and the
	// completion stores the answer alone (see complete).
	return false
}

// rollsBackOnTimeout reports whether InnoDB rolls back the whole
// transaction on a lock wait timeout, read once from the server (a global,
// read-only setting); when it cannot be read, it answers yes, which at
// worst refuses the statements of a transaction that was still whole.
func (s *Store) rollsBackOnTimeout(ctx context.Context, conn *sql.Conn) bool {
	switch s.rollbackOnTimeout.Load() {
	case 1:
		return false
	case 2:
		return true
	}
	var on bool
	if err := conn.QueryRowContext(context.WithoutCancel(ctx), `SELECT @@innodb_rollback_on_timeout`).Scan(&on); err != nil {
		return true
	}
	v := int32(1)
	if on {
		v = 2
	}
	s.rollbackOnTimeout.Store(v)
	return on
}

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
	if s.d.kind != kindPostgres {
		// The savepoint goes with its transaction: when the database has
		// ended that one (a deadlock or a lock wait timeout rolled it
		// back, DDL committed it), RELEASE finds no savepoint, and the
		// statements since ran in another transaction (MySQL, autocommit
		// off) or alone (SQLite): nothing of them may be stored as the
		// handler's work. Cheap (no table, no privilege, one round trip)
		// and exact on SQLite, MySQL 8 and MariaDB alike, unlike reading
		// the transaction's id (information_schema, which needs the
		// PROCESS privilege) or @@in_transaction (MariaDB only, and always
		// 1 with autocommit off).
		if _, err := conn.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint); err != nil {
			u.finish(ctx)
			if u.noSavepoint(err) {
				return &TxEndedError{Cause: fmt.Errorf("its savepoint is gone: %w", err)}
			}
			return fmt.Errorf("idemsql: complete: %w", err)
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
		if s.d.kind == kindPostgres && postgresState(err) == postgresTxAborted {
			return errAborted
		}
		return fmt.Errorf("idemsql: complete: %w", err)
	}
	if err := fenced(res); err != nil {
		if s.d.kind == kindPostgres && errors.Is(err, idem.ErrLeaseLost) && !u.markHeld(ctx, conn) {
			err = &TxEndedError{Cause: errors.New("the transaction was ended by a COMMIT or ROLLBACK the handler sent as SQL")}
		}
		u.finish(ctx)
		return err
	}
	if err := u.commit(ctx); err != nil {
		return fmt.Errorf("idemsql: commit: %w", err)
	}
	return nil
}

// noSavepoint reports whether err is the database's answer to a RELEASE
// of a savepoint that does not exist.
func (u *unit) noSavepoint(err error) bool {
	switch u.s.d.kind {
	case kindMySQL:
		n, ok := u.s.d.number(err)
		return ok && n == mysqlNoSavepoint
	case kindSQLite:
		return sqliteCode(err) == sqliteError
	}
	return false
}

// markHeld reports whether idem.unit still holds the unit's mark, that is
// whether the transaction is the one begin opened (Postgres).
func (u *unit) markHeld(ctx context.Context, conn *sql.Conn) bool {
	var v sql.NullString
	err := conn.QueryRowContext(ctx, `SELECT current_setting('idem.unit', true)`).Scan(&v)
	return err == nil && v.String == u.mark
}

// commit commits the open transaction and puts the connection back.
func (u *unit) commit(ctx context.Context) error {
	stmt := "COMMIT"
	if u.s.d.kind == kindMySQL {
		// Turning autocommit back on commits the open transaction and
		// restores the session for the pool in one round trip; if the
		// commit fails, so does the SET, and autocommit stays off.
		stmt = "SET autocommit = 1"
	}
	u.disown()
	run := func() error {
		_, err := u.conn.ExecContext(ctx, stmt)
		return err
	}
	var err error
	if u.s.d.kind == kindSQLite {
		// A COMMIT answered busy leaves the transaction open: it may run
		// again. Not on MySQL, where a failed commit (a Galera
		// certification conflict answers a deadlock) has rolled back,
		// and a second SET would report a commit of nothing.
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
	case u.s.d.kind == kindMySQL:
		exec("ROLLBACK")
		exec("SET autocommit = 1")
	default:
		exec("ROLLBACK")
		if !ok && u.s.d.kind == kindSQLite {
			// No transaction to roll back (SQLite ended it): the
			// connection is fine.
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
		if u.s.d.kind != kindPostgres {
			// One round trip, on a path that is rolling back anyway.
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
func (u *unit) checkIntact(ctx context.Context) error {
	switch u.s.d.kind {
	case kindPostgres:
		if !u.markHeld(ctx, u.conn) {
			return errors.New("the transaction was ended by a COMMIT or ROLLBACK the handler sent as SQL")
		}
	default:
		// SAVEPOINT again with the same name moves the savepoint; it
		// is ROLLBACK TO that fails when it is gone. Both leave the
		// transaction open, and finish rolls all of it back next.
		if _, err := u.conn.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
			return fmt.Errorf("its savepoint is gone: %w", err)
		}
	}
	return nil
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
		res, err = s.db.ExecContext(ctx, s.d.complete.text, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsql: complete: %w", err)
	}
	return fenced(res)
}

// discard closes conn and keeps it out of the pool: database/sql drops a
// connection whose Raw function reports driver.ErrBadConn.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	conn.Close()
}

// completeUnitQuery is the completion inside the unit's transaction.
func (d *dialect) completeUnitQuery() query {
	if d.completeUnit.text != "" {
		return d.completeUnit
	}
	return d.complete
}
