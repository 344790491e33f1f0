package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// Defaults of Config.Lease and Config.Retention, exported for the
// programs that show them (idem serve's flags).
const (
	DefaultLease     = 90 * time.Second
	DefaultRetention = 24 * time.Hour
)

const (
	// defaultMaxStepBytes and defaultMaxStepsBytes are the defaults of
	// Config.MaxStepBytes and Config.MaxStepsBytes (stated there).
	defaultMaxStepBytes  = 64 << 10
	defaultMaxStepsBytes = 256 << 10
)

// Config configures an Engine. The zero value of every field means its
// documented default.
type Config struct {
	// Lease is how long a claim holds a key before another execution may
	// take it over. Defaults to 90s.
	Lease time.Duration

	// Retention is how long a record is kept, and replayed, counted from
	// the claim. Past it the key counts as absent. Defaults to 24h. Set it longer than the longest delay a client, a queue or a
	// batch job may retry after.
	Retention time.Duration

	// Heartbeat is how often the lease of a running handler is extended,
	// so that a slow but live handler never loses its key to a retry.
	// Defaults to Lease/3. Keep it well under Lease: one goroutine per
	// engine serves every lease on a clock of Heartbeat/4 ticks, so an
	// extension may come up to a quarter of Heartbeat late. A negative
	// value turns the heartbeat off.
	Heartbeat time.Duration

	// CleanupTimeout bounds the store calls made after the caller's
	// context has ended: the release of a failed execution, and, on a
	// store without transactions, the completion of a handler whose caller
	// went away. Defaults to 5s. It does not bound the record of a step
	// (Step), whose effect has happened: that waits as long as the store
	// lets any write wait, within Lease.
	CleanupTimeout time.Duration

	// MaxStepBytes is the largest result a step (Step) may record, in
	// bytes of its JSON encoding. Defaults to 64 KiB. A step whose result
	// is larger ran, but is not recorded: Step returns an error wrapping
	// ErrStepNotSaved and ErrStepTooLarge.
	MaxStepBytes int

	// MaxStepsBytes is the most the steps of one record may hold, names
	// and results encoded as stores keep them (idemcodec), counting those of the earlier
	// executions of the key. Defaults to 256 KiB. A step that would pass
	// it is refused before its function runs when the record is full
	// already, and otherwise ran and is not recorded, as for MaxStepBytes.
	// Steps are kept with the record, for its whole Retention: this bounds
	// what one key can make the store keep beyond the request and
	// response limits of the front end.
	MaxStepsBytes int

	// Logger receives the engine's warnings (heartbeat failures, release
	// failures, work rolled back after the handler ran). Defaults to
	// slog.Default().
	Logger *slog.Logger

	// WaitPollInterval is the longest pause between two reads of a key
	// that duplicates wait on (Operation.WaitInFlight): the poller reads
	// the record after a twenty-fifth of it, then doubles its pause up to
	// it. Defaults to 250ms. A store that announces changes (Watcher)
	// wakes the waiters at once, and the polls only catch an announcement
	// lost on the way: there it may be longer.
	WaitPollInterval time.Duration

	// Tracer observes every operation, and, when it implements the
	// optional interfaces (StoreTracer, LeaseTracer, and the front ends'
	// idemfront.RequestTracer), the store calls, the lease events, and the
	// requests of the front ends over this engine (ideminbox's messages:
	// ideminbox.Config.Tracer). idemprom
	// and idemotel provide tracers; MultiTracer combines them. Defaults to
	// none, which costs nothing.
	Tracer Tracer
}

func (c *Config) withDefaults() Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	if out.Lease <= 0 {
		out.Lease = DefaultLease
	}
	if out.Retention <= 0 {
		out.Retention = DefaultRetention
	}
	if out.Heartbeat == 0 {
		out.Heartbeat = out.Lease / 3
	}
	if out.CleanupTimeout <= 0 {
		out.CleanupTimeout = 5 * time.Second
	}
	if out.MaxStepBytes <= 0 {
		out.MaxStepBytes = defaultMaxStepBytes
	}
	if out.MaxStepsBytes <= 0 {
		out.MaxStepsBytes = defaultMaxStepsBytes
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

// Engine runs operations at most once per (tenant, key): claim, decide,
// run, complete. It knows nothing of HTTP: idemhttp, ideminbox and other
// front ends translate their protocol into Operation and Result.
//
// An Engine is safe for concurrent use. Close it once no execution runs.
type Engine struct {
	store  Store
	info   StoreInfo
	config Config
	steps  StepStore // the store, when it keeps recovery points
	// unitClaimer is the store, when it claims inside the unit of work
	// (StoreInfo.SingleTransaction).
	unitClaimer UnitClaimer
	keeper      *keeper // nil when the heartbeat is off
	late        *lateReleases

	tracer      Tracer      // nil: not traced
	storeTracer StoreTracer // the tracer, when it observes store calls
	leaseTracer LeaseTracer // the tracer, when it observes lease events

	waits   waitRoom      // duplicates waiting for an execution in flight
	running atomic.Int64  // executions inside Do
	closed  atomic.Bool   // Close was called
	idle    chan struct{} // signalled when running drops to zero after Close
}

// NewEngine returns an engine over store. A nil config means every default.
func NewEngine(store Store, config *Config) (*Engine, error) {
	if store == nil {
		return nil, errors.New("idem: NewEngine needs a Store")
	}
	e := &Engine{
		store:  store,
		info:   store.Info(),
		config: config.withDefaults(),
		idle:   make(chan struct{}, 1),
	}
	e.steps, _ = store.(StepStore)
	if uc, ok := store.(UnitClaimer); ok && e.info.SingleTransaction {
		// The database's lock is the lease: nothing to extend, and no
		// record outlives the transaction to hold recovery points.
		e.unitClaimer, e.steps, e.config.Heartbeat = uc, nil, -1
	}
	e.tracer = e.config.Tracer
	e.storeTracer, _ = e.tracer.(StoreTracer)
	e.leaseTracer, _ = e.tracer.(LeaseTracer)
	e.late = newLateReleases(store, e.storeTracer, e.info.Name, e.config.Logger)
	if e.config.Heartbeat >= e.config.Lease {
		// The lease would end before its first extension: every handler
		// slower than the lease would lose its key, the very thing the
		// heartbeat is for.
		return nil, fmt.Errorf("idem: Heartbeat %v is not shorter than Lease %v; keep it well under (the default is Lease/3), or negative to turn it off",
			e.config.Heartbeat, e.config.Lease)
	}
	if e.config.Heartbeat > 0 {
		e.keeper = newKeeper(store, e.config.Heartbeat, e.config.Logger)
		e.keeper.storeName, e.keeper.storeTracer, e.keeper.leaseTracer = e.info.Name, e.storeTracer, e.leaseTracer
	}
	return e, nil
}

// Store returns the engine's store.
func (e *Engine) Store() Store { return e.store }

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.config }

// Close stops the engine: Do refuses new executions with ErrClosed (and
// the duplicates waiting for an execution in flight stop with it), Close
// waits for the running ones to return, then stops the heartbeat and
// sends at once the releases still scheduled for failed claims, and waits
// for them. It returns ctx's error if ctx ends first; the engine is then
// closed all the same, and what was still running goes on unwatched (the
// leases of running executions are no longer extended).
//
// Call it after the servers and consumers that use the engine have
// stopped (http.Server.Shutdown first). Close is safe to call more than
// once.
func (e *Engine) Close(ctx context.Context) error {
	e.closed.Store(true)
	e.waits.close()
	var err error
	for err == nil && e.running.Load() > 0 {
		select {
		case <-e.idle:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if e.keeper != nil {
		e.keeper.close()
	}
	if lerr := e.late.close(ctx); err == nil {
		err = lerr
	}
	return err
}

// enter counts an execution in, and refuses it once the engine is closed.
func (e *Engine) enter() bool {
	e.running.Add(1)
	if e.closed.Load() {
		e.exit()
		return false
	}
	return true
}

func (e *Engine) exit() {
	if e.running.Add(-1) == 0 && e.closed.Load() {
		select {
		case e.idle <- struct{}{}:
		default:
		}
	}
}

// Operation names one operation a caller means to do once.
type Operation struct {
	// Tenant owns the key space. It must come from what the server knows
	// of the caller (authentication), not from something the caller sets
	// freely. Empty is a valid tenant.
	Tenant string
	// Key is the caller's name for the operation. See ValidateKey.
	Key string
	// Fingerprint identifies what the operation asks for (see
	// idemhttp's request fingerprint). A retry with another fingerprint is
	// refused with ErrFingerprintMismatch.
	Fingerprint []byte
	// WaitInFlight is how long a duplicate that meets an execution of the
	// same operation in flight waits for its answer, instead of getting
	// ErrInFlight at once. See "Waiting for the first execution" in the
	// package documentation. Zero does not wait.
	WaitInFlight time.Duration
	// WaitContext, when set, ends the wait as Do's ctx does: a front end
	// that runs the function on a context its caller's going away does not
	// cancel (idemhttp) passes the caller's own here, so that a caller who
	// left stops waiting. Nil: only Do's ctx ends the wait.
	WaitContext context.Context
}

// Outcome is the answer of Engine.Do.
type Outcome struct {
	// Result is the fresh result or the stored one.
	Result Result
	// Replayed is true when Result comes from an earlier execution and the
	// function did not run.
	Replayed bool
	// NotStored is true when the function marked its answer with
	// NotExecuted: Result is its answer, to be sent, but nothing was
	// stored and the key was released.
	NotStored bool
}

// Do runs fn at most once for op. It claims the key, and:
//
//   - if the operation already completed with the same fingerprint, returns
//     the stored result with Replayed set, without running fn;
//   - if it completed or is in flight with another fingerprint, returns
//     ErrFingerprintMismatch;
//   - if another execution holds a valid lease, returns ErrInFlight, or
//     with op.WaitInFlight waits for it and answers as if called again
//     when it ends;
//   - otherwise runs fn with a context carrying the execution
//     (ExecutionFromContext) and the store's transaction
//     (idemsql.TxFromContext, idempg.TxFromContext), and completes the
//     record inside that same transaction, fenced by the lease token.
//
// When fn returns an error, panics (the panic comes back as *PanicError)
// or ends its goroutine (runtime.Goexit), the transaction is rolled back
// and the key released, so a retry runs again. When ctx ends while fn
// runs, the same happens on a transactional store; on a store without
// transactions, where fn's effects cannot be undone, the answer fn
// returned is completed on a context of its own, and the key is never
// released for it: if fn returned no answer, or the completion fails, the
// key stays in flight until its lease ends. The same holds for a panic or
// a Goexit there. When the lease was lost to a takeover, the completion
// is refused, everything is rolled back, and Do returns ErrLeaseLost.
// Store failures come back as *StoreError; when the claim fails, fn does
// not run. After Close, Do returns ErrClosed.
func (e *Engine) Do(ctx context.Context, op Operation, fn func(ctx context.Context) (Result, error)) (Outcome, error) {
	if e.tracer != nil {
		return e.doTraced(ctx, op, fn)
	}
	return e.do(ctx, op, fn, nil)
}

// do is Do; t collects what a tracer reports, when there is one.
func (e *Engine) do(ctx context.Context, op Operation, fn func(ctx context.Context) (Result, error), t *opTrace) (Outcome, error) {
	if err := ValidateKey(op.Key); err != nil {
		return Outcome{}, err
	}
	if !e.enter() {
		return Outcome{}, ErrClosed
	}
	defer e.exit()
	if e.unitClaimer != nil {
		return e.doInUnit(ctx, op, fn, t)
	}
	token := newToken()
	claim, err := e.claim(ctx, e.claimParams(op, token))
	if err != nil {
		if !errors.Is(err, ErrNotApplied) {
			e.late.start(ctx, ReleaseParams{Tenant: op.Tenant, Key: op.Key, Token: token})
		}
		return Outcome{}, storeError("claim", err)
	}
	if !claim.Won {
		if op.WaitInFlight > 0 && waitable(claim.Record, op.Fingerprint) {
			return e.waitInFlight(ctx, op, claim.Record, fn, t)
		}
		if t != nil && claim.Record != nil {
			t.completedAt = claim.Record.CompletedAt
		}
		return decide(claim.Record, op.Fingerprint)
	}
	if claim.Takeover {
		if t != nil {
			t.takeover = true
		}
		e.tookOver(ctx, op, &claim)
	}
	return e.run(ctx, op, token, &claim, nil, fn, t)
}

// decide answers a lost claim from the record that holds the key.
func decide(rec *Record, fingerprint []byte) (Outcome, error) {
	if rec == nil {
		return Outcome{}, storeError("claim", errors.New("claim lost but no record returned"))
	}
	if !rec.SameFingerprint(fingerprint) {
		return Outcome{}, ErrFingerprintMismatch
	}
	if rec.State == StateComplete {
		return Outcome{Result: rec.Result, Replayed: true}, nil
	}
	return Outcome{}, ErrInFlight
}

// execution is one run of fn under a won claim.
type execution struct {
	e     *Engine
	ctx   context.Context // the caller's
	op    Operation
	token int64
	unit  UnitOfWork
	// hctx is the handler's context: the unit's, carrying st
	// (ExecutionFromContext, NotExecuted, RollbackWrites, Step), cancelled
	// with cause ErrLeaseLost when the heartbeat finds the lease lost and
	// without one (context.Canceled) once the handler has returned.
	hctx   context.Context
	cancel context.CancelCauseFunc // hctx's
	st     execState
	held   bool  // the heartbeat keeps the lease
	lease  lease // what the heartbeat keeps of it, under its lock
}

// run runs fn under a won claim, in unit when the claim began it
// (UnitClaimer), else in a unit of work begun here.
func (e *Engine) run(ctx context.Context, op Operation, token int64, claim *ClaimResult, unit UnitOfWork, fn func(ctx context.Context) (Result, error), t *opTrace) (Outcome, error) {
	if unit == nil {
		var err error
		if unit, err = e.begin(ctx); err != nil {
			e.release(ctx, op, token)
			return Outcome{}, storeError("begin", err)
		}
	}
	x := &execution{e: e, ctx: ctx, op: op, token: token, unit: unit}
	hctx, cancel := context.WithCancelCause(unit.Context(ctx))
	x.hctx, x.cancel = context.WithValue(hctx, execKey{}, &x.st), cancel
	x.st.info = Execution{Tenant: op.Tenant, Key: op.Key, LeaseToken: token, Store: e.info.Name, Takeover: claim.Takeover}
	x.st.initSteps(e, op, unit, claim.Steps)
	if e.unitClaimer != nil {
		x.st.stepsRefused = errStepsSingleTransaction
	}
	if e.keeper != nil {
		x.held = true
		e.keeper.add(x)
	}

	// fn returns, panics (recovered by callHandler) or ends its goroutine
	// with runtime.Goexit, which no recover sees: only this deferred call
	// runs then, and it must not leave the key held and kept alive by the
	// heartbeat for as long as the engine lives.
	returned := false
	defer func() {
		if !returned {
			x.st.endSteps()
			x.stopLease()
			x.abandon(errGoexit)
		}
	}()
	res, err := callHandler(x.hctx, fn)
	returned = true
	x.st.endSteps()
	return x.finish(res, err)
}

// errGoexit stands for the handler's runtime.Goexit in logs.
var errGoexit = errors.New("idem: the handler's goroutine exited (runtime.Goexit)")

// stopLease takes the lease off the heartbeat, ends the handler's context,
// and reports whether the heartbeat found the lease lost.
func (x *execution) stopLease() (lost bool) {
	x.cancel(nil)
	if !x.held {
		return false
	}
	lost = x.e.keeper.remove(x)
	x.held = false
	return lost
}

// finish decides what becomes of an execution whose function returned or
// panicked.
func (x *execution) finish(res Result, err error) (Outcome, error) {
	var panicked *PanicError
	if x.savesLater() {
		// A step ran and its record failed: the engine keeps the lease
		// and records it later (saveLater). Whatever the handler
		// answered is discarded, as below.
		cause := *x.st.unsavedStep.Load()
		if errors.As(err, &panicked) {
			return Outcome{}, err
		}
		return Outcome{}, cause
	}
	lost := x.stopLease()
	switch {
	case lost:
		// The heartbeat found the lease taken over, and cancelled the
		// handler's context: report that. The key belongs to another
		// execution now, so there is nothing to release.
		x.rollback("lease lost", ErrLeaseLost)
		x.e.lostLease(x.ctx, x.op, "heartbeat")
		x.warnStepsKept("lease lost", ErrLeaseLost)
		return Outcome{}, ErrLeaseLost
	case x.stepLostLease() != nil:
		// The store refused a step's record because the key was taken
		// over: the lease is lost as surely as if the heartbeat had found
		// it, and the key is the takeover's, which may have completed it.
		cause := x.lostAtStep()
		if errors.As(err, &panicked) {
			return Outcome{}, err
		}
		return Outcome{}, cause
	case x.st.unsavedStep.Load() != nil:
		// A step's effect happened and its record did not, whatever the
		// handler answered after that (a front end's handler cannot
		// return the error), even a panic: a retry now would repeat the
		// effect at once. The key stays held until its lease ends, which
		// gives the store time to come back; the takeover then runs the
		// step again, under the same downstream key (DownstreamKey).
		cause := x.keepUnsaved()
		if errors.As(err, &panicked) {
			return Outcome{}, err
		}
		return Outcome{}, cause
	case errors.As(err, &panicked):
		x.abandon(err)
		return Outcome{}, err
	case err == nil && x.st.notExecuted.Load():
		// The function says it did nothing: keep nothing, free the key.
		x.rollback("", nil)
		x.release("the handler marked its answer NotExecuted after it recorded steps", nil)
		return Outcome{Result: res, NotStored: true}, nil
	case x.ctx.Err() != nil:
		return x.cancelled(res, err)
	case err != nil:
		// The function failed and says so: nothing of it is to be kept.
		x.rollback("the handler failed", err)
		x.release("the handler failed", err)
		return Outcome{}, err
	}
	return x.complete(x.ctx, res)
}

// cancelled ends an execution whose caller's context ended while the
// function ran.
func (x *execution) cancelled(res Result, err error) (Outcome, error) {
	e := x.e
	cause := x.ctx.Err()
	if e.info.Transactional {
		x.rollback("the caller's context ended", cause)
		x.release("the caller's context ended", cause)
		if err == nil {
			err = cause
		}
		return Outcome{}, err
	}
	// Nothing can be undone: the function's effects stand, so its answer
	// must be what every retry gets.
	if err != nil {
		x.keepInFlight("the caller's context ended and the handler returned no answer", err)
		return Outcome{}, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.ctx), e.config.CleanupTimeout)
	defer cancel()
	out, cerr := x.complete(ctx, res)
	if cerr != nil {
		return out, cerr
	}
	// The answer is stored; the caller is gone, and gets it on its retry.
	return out, cause
}

// complete stores res and commits the unit of work.
func (x *execution) complete(ctx context.Context, res Result) (Outcome, error) {
	e := x.e
	withoutWrites := x.st.rollbackWrites.Load() && e.info.Transactional
	if withoutWrites && e.unitClaimer != nil {
		// The claim is in the unit of work: rolling it back would free
		// the key. The unit rolls the writes back and stores the answer
		// alone itself (CompleteParams.WithoutWrites).
		err := e.completeUnit(ctx, x.unit, CompleteParams{Tenant: x.op.Tenant, Key: x.op.Key, Token: x.token, Result: res, WithoutWrites: true})
		return x.completed(ctx, res, err)
	}
	if withoutWrites {
		// Store the answer without the business writes: roll them back and
		// complete in a unit of work of its own.
		if err := e.rollbackUnit(ctx, x.unit); err != nil {
			x.release("the rollback of the business writes failed", err)
			return Outcome{}, storeError("rollback", err)
		}
		next, err := e.begin(ctx)
		if err != nil {
			x.release("the unit of work for the answer could not begin", err)
			return Outcome{}, storeError("begin", err)
		}
		x.unit = next
	}
	err := e.completeUnit(ctx, x.unit, CompleteParams{Tenant: x.op.Tenant, Key: x.op.Key, Token: x.token, Result: res})
	return x.completed(ctx, res, err)
}

// completed ends an execution after its Complete returned err.
func (x *execution) completed(ctx context.Context, res Result, err error) (Outcome, error) {
	e := x.e
	if err == nil {
		return Outcome{Result: res}, nil
	}
	_ = e.rollbackUnit(context.WithoutCancel(ctx), x.unit)
	if errors.Is(err, ErrWritesAborted) {
		// The handler's own failure, not the store's: it answered a
		// success whose writes a failed statement had undone.
		x.e.config.Logger.ErrorContext(x.ctx, "idem: the handler answered a success after a failed statement aborted its transaction; nothing stored, key released",
			slog.String("store", e.info.Name), tenantAttr(x.op.Tenant), slog.String("key", x.op.Key), slog.Int("status", res.Status))
		e.release(x.ctx, x.op, x.token)
		return Outcome{}, err
	}
	if errors.Is(err, ErrLeaseLost) {
		e.lostLease(x.ctx, x.op, "completion")
		e.warnRolledBack(x.ctx, x.op, "lease lost at completion", err)
		x.warnStepsKept("lease lost at completion", err)
		return Outcome{}, ErrLeaseLost
	}
	if !e.info.Transactional {
		// The completion may have been refused (a full Redis) while the
		// effects stand: releasing would run them again on the retry.
		x.keepInFlight("the completion failed", err)
		return Outcome{}, storeError("complete", err)
	}
	// The commit may or may not have happened (a connection lost
	// mid-commit). Release is fenced on the in-flight state and the
	// token, so it deletes nothing if the completion did commit.
	e.warnRolledBack(x.ctx, x.op, "the completion failed", err)
	x.release("the completion failed", err)
	return Outcome{}, storeError("complete", err)
}

// stepLostLease returns, when a step ran and was not recorded and the
// lease is known lost (the store refused that step's record, or a later
// one's, after a takeover), the error to end the execution with, wrapping
// ErrLeaseLost; nil otherwise.
func (x *execution) stepLostLease() error {
	p := x.st.unsavedStep.Load()
	switch {
	case p == nil:
		return nil
	case errors.Is(*p, ErrLeaseLost):
		return *p
	case x.st.lost.Load():
		return fmt.Errorf("%w; before that, %w", ErrLeaseLost, *p)
	}
	return nil
}

// lostAtStep ends an execution whose step the store refused after a
// takeover: rolled back, counted and logged as a lost lease, nothing
// released or kept (the key is the takeover's). It returns the step's
// error, which wraps ErrLeaseLost and ErrStepNotSaved.
func (x *execution) lostAtStep() error {
	cause := x.stepLostLease()
	x.rollback("lease lost", cause)
	x.e.lostLease(x.ctx, x.op, "step")
	x.warnStepsKept("lease lost", cause)
	return cause
}

// keepUnsaved ends an execution in which a step ran and was not
// recorded: its writes rolled back, its key in flight until the lease
// ends. It returns the step's error.
func (x *execution) keepUnsaved() error {
	cause := *x.st.unsavedStep.Load()
	reason := "a step ran but was not recorded"
	if errors.Is(cause, ErrOutcomeUnknown) {
		reason = "the handler's outcome is unknown (OutcomeUnknown)"
	}
	x.rollback(reason, cause)
	x.keepInFlight(reason, cause)
	return cause
}

// abandon ends an execution whose function panicked or ended its
// goroutine: rolled back and released on a transactional store; on
// another, its effects may stand, so the key stays in flight until the
// lease ends, as it does on any store when a step ran and was not
// recorded.
func (x *execution) abandon(cause error) {
	if x.stepLostLease() != nil {
		x.lostAtStep()
		return
	}
	if x.st.unsavedStep.Load() != nil {
		x.keepUnsaved()
		return
	}
	if !x.e.info.Transactional {
		_ = x.e.rollbackUnit(context.WithoutCancel(x.ctx), x.unit)
		x.keepInFlight("the handler did not return", cause)
		return
	}
	x.rollback("the handler did not return", cause)
	x.release("the handler did not return", cause)
}

// release gives the key back after a failed execution: a record that
// holds steps is kept by the store, its lease ended, which warnStepsKept
// says.
func (x *execution) release(reason string, cause error) {
	x.warnStepsKept(reason, cause)
	x.e.release(x.ctx, x.op, x.token)
}

// warnStepsKept logs, when this execution recorded steps (Step), that it
// ends without completing and its steps stay with the key: the execution
// that takes the key over gets their results instead of running them
// again, and a retry with another request under the key is refused.
func (x *execution) warnStepsKept(reason string, cause error) {
	st := &x.st
	st.mu.Lock()
	saved := st.savedSteps
	names := make([]string, 0, len(st.recorded))
	for _, s := range st.recorded {
		names = append(names, s.Name)
	}
	st.mu.Unlock()
	if !saved {
		return
	}
	e := x.e
	e.config.Logger.WarnContext(x.ctx, "idem: the execution recorded steps and ends without completing; the steps are kept with the key, and a retry of the same request takes it over and gets their results instead of running them again",
		slog.String("reason", reason), slog.String("store", e.info.Name),
		tenantAttr(x.op.Tenant), slog.String("key", x.op.Key),
		slog.Any("steps", names), errorAttr(cause))
}

// rollback abandons the unit of work, and says so when the handler ran
// and its writes were undone for a reason other than its own choice.
func (x *execution) rollback(reason string, cause error) {
	_ = x.e.rollbackUnit(context.WithoutCancel(x.ctx), x.unit)
	if reason != "" {
		x.e.warnRolledBack(x.ctx, x.op, reason, cause)
	}
}

// keepInFlight leaves the key held, unextended, until its lease ends, for
// an execution on a store without transactions whose effects may stand.
func (x *execution) keepInFlight(reason string, cause error) {
	e := x.e
	e.config.Logger.WarnContext(x.ctx, "idem: the key stays in flight until its lease ends, since the handler's effects cannot be undone and a retry would repeat them",
		slog.String("reason", reason), slog.String("store", e.info.Name),
		tenantAttr(x.op.Tenant), slog.String("key", x.op.Key),
		slog.Duration("lease", e.config.Lease), errorAttr(cause))
	x.warnStepsKept(reason, cause)
}

// tookOver logs and traces a claim won over an execution whose lease had
// ended: it died, stalled, or was rolled back after recording steps.
func (e *Engine) tookOver(ctx context.Context, op Operation, claim *ClaimResult) {
	point := ""
	if n := len(claim.Steps); n > 0 {
		point = claim.Steps[n-1].Name
	}
	e.config.Logger.InfoContext(ctx, "idem: key taken over from an earlier execution whose lease ended",
		slog.String("store", e.info.Name), tenantAttr(op.Tenant), slog.String("key", op.Key),
		slog.String("recovery_point", point))
	e.traceLease(ctx, LeaseTakeover, nil)
}

// lostLease logs and traces an execution whose lease was taken over, found
// by the heartbeat or at the completion. On a transactional store
// warnRolledBack says it too, with what was undone.
func (e *Engine) lostLease(ctx context.Context, op Operation, foundBy string) {
	if !e.info.Transactional {
		e.config.Logger.WarnContext(ctx, "idem: lease lost to a takeover; the answer is discarded and the handler's effects stand",
			slog.String("found_by", foundBy), slog.String("store", e.info.Name),
			tenantAttr(op.Tenant), slog.String("key", op.Key))
	}
	e.traceLease(ctx, LeaseLost, nil)
}

// warnRolledBack logs that a handler ran and its work was rolled back.
func (e *Engine) warnRolledBack(ctx context.Context, op Operation, reason string, cause error) {
	if !e.info.Transactional {
		return
	}
	e.config.Logger.WarnContext(ctx, "idem: the handler ran and its writes were rolled back; effects it made outside the store's transaction stand",
		slog.String("reason", reason), slog.String("store", e.info.Name),
		tenantAttr(op.Tenant), slog.String("key", op.Key), errorAttr(cause))
}

func callHandler(ctx context.Context, fn func(ctx context.Context) (Result, error)) (res Result, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(ctx)
}

// release gives the key back after a failed execution. It runs even when
// ctx has ended (that is often why it runs), bounded by CleanupTimeout.
func (e *Engine) release(ctx context.Context, op Operation, token int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.config.CleanupTimeout)
	defer cancel()
	if err := e.releaseKey(ctx, ReleaseParams{Tenant: op.Tenant, Key: op.Key, Token: token}); err != nil {
		// The record stays in flight until its lease ends, then a retry
		// takes it over: safe, only slower.
		e.config.Logger.WarnContext(ctx, "idem: release failed; the key stays locked until its lease ends",
			tenantAttr(op.Tenant), slog.String("key", op.Key), errorAttr(err))
	}
}

func storeError(op string, err error) error {
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrStore) {
		return err
	}
	return &StoreError{Op: op, Err: err}
}

// newToken returns a fresh, non-zero lease token. math/rand/v2's global
// generator is ChaCha8 seeded from the OS: tokens are unpredictable and a
// collision between two claims of one key is out of reach (2^-63).
func newToken() int64 {
	for {
		if t := rand.Int64(); t != 0 {
			return t
		}
	}
}
