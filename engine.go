package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
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
