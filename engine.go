package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"time"
)

// Defaults for Config.
const (
	DefaultLease      = 90 * time.Second
	DefaultRetention  = 24 * time.Hour
	DefaultRetryAfter = time.Second
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

	// RetryAfter is the delay suggested to a caller that met an execution
	// in flight (HTTP Retry-After). Defaults to 1s.
	RetryAfter time.Duration

	// ReleaseTimeout bounds the clean-up calls (release of a failed
	// execution) that run after the caller's context has ended. Defaults to
	// 5s.
	ReleaseTimeout time.Duration

	// Logger receives the engine's warnings (heartbeat failures, release
	// failures). Defaults to slog.Default().
	Logger *slog.Logger
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
	if out.RetryAfter <= 0 {
		out.RetryAfter = DefaultRetryAfter
	}
	if out.ReleaseTimeout <= 0 {
		out.ReleaseTimeout = 5 * time.Second
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
// An Engine is safe for concurrent use.
type Engine struct {
	store  Store
	config Config
	keeper *keeper // nil when the heartbeat is off
}

// NewEngine returns an engine over store. A nil config means every default.
func NewEngine(store Store, config *Config) (*Engine, error) {
	if store == nil {
		return nil, errors.New("idem: NewEngine needs a Store")
	}
	e := &Engine{store: store, config: config.withDefaults()}
	if e.config.Heartbeat >= e.config.Lease {
		// The lease would end before its first extension: every handler
		// slower than the lease would lose its key, the very thing the
		// heartbeat is for.
		return nil, fmt.Errorf("idem: Heartbeat %v is not shorter than Lease %v; keep it well under (the default is Lease/3), or negative to turn it off",
			e.config.Heartbeat, e.config.Lease)
	}
	if e.config.Heartbeat > 0 {
		e.keeper = newKeeper(store, e.config.Heartbeat, e.config.Logger)
	}
	return e, nil
}

// Store returns the engine's store.
func (e *Engine) Store() Store { return e.store }

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.config }

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
}

// Outcome is the answer of Engine.Do.
type Outcome struct {
	// Result is the fresh result or the stored one.
	Result Result
	// Replayed is true when Result comes from an earlier execution and the
	// function did not run.
	Replayed bool
}

// Do runs fn at most once for op. It claims the key, and:
//
//   - if the operation already completed with the same fingerprint, returns
//     the stored result with Replayed set, without running fn;
//   - if it completed or is in flight with another fingerprint, returns
//     ErrFingerprintMismatch;
//   - if another execution holds a valid lease, returns ErrInFlight;
//   - otherwise runs fn with a context carrying the store's transaction
//     (idemsql.Tx(ctx), idempg.Tx(ctx)) and completes the record inside
//     that same transaction, fenced by the lease token.
//
// When fn returns an error, panics (the panic comes back as *PanicError),
// or ctx ends while it runs, the transaction is rolled back and the key
// released, so a retry runs again. When the lease was lost to a takeover,
// the completion is refused, everything is rolled back, and Do returns
// ErrLeaseLost. Store failures come back as *StoreError; when the claim
// fails, fn does not run.
func (e *Engine) Do(ctx context.Context, op Operation, fn func(ctx context.Context) (Result, error)) (Outcome, error) {
	if err := ValidateKey(op.Key); err != nil {
		return Outcome{}, err
	}
	token := newToken()
	claim, err := e.store.Claim(ctx, ClaimParams{
		Tenant:      op.Tenant,
		Key:         op.Key,
		Fingerprint: op.Fingerprint,
		Token:       token,
		Lease:       e.config.Lease,
		// Never shorter than the lease: a record past retention counts
		// as absent, so a retry would take over a key still held.
		Retention: max(e.config.Retention, e.config.Lease),
	})
	if err != nil {
		return Outcome{}, storeError("claim", err)
	}
	if !claim.Won {
		return decide(claim.Record, op.Fingerprint)
	}
	return e.run(ctx, op, token, fn)
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

func (e *Engine) run(ctx context.Context, op Operation, token int64, fn func(ctx context.Context) (Result, error)) (Outcome, error) {
	tx, err := e.store.Begin(ctx)
	if err != nil {
		e.release(ctx, op, token)
		return Outcome{}, storeError("begin", err)
	}
	// Through a closure, so that the second unit of work RollbackWrites
	// opens below is ended too. Skipped after a successful Complete, which
	// has ended the unit of work already (and the detached context would
	// cost an allocation on every request for nothing); errors are
	// reported by Complete.
	completed := false
	defer func() {
		if !completed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()

	runCtx := tx.Context(ctx)
	var held *lease
	if e.keeper != nil {
		lc := newLeaseCtx(runCtx)
		defer lc.end()
		runCtx = lc
		held = e.keeper.add(op, token, e.config.Lease, lc)
	}

	res, err := callHandler(runCtx, fn)
	leaseLost := held != nil && e.keeper.remove(held)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if leaseLost {
			// The handler saw its context end because the heartbeat found
			// the lease taken over: report that, not the cancellation.
			return Outcome{}, ErrLeaseLost
		}
		e.release(ctx, op, token)
		return Outcome{}, err
	}

	complete := CompleteParams{Tenant: op.Tenant, Key: op.Key, Token: token, Result: res}
	complete.Result.RollbackWrites = false
	if res.RollbackWrites {
		// Store the answer without the business writes: roll them back and
		// complete in a unit of work of its own.
		if err := tx.Rollback(ctx); err != nil {
			e.release(ctx, op, token)
			return Outcome{}, storeError("rollback", err)
		}
		// A failed Begin returns no Tx: keep the ended one for the
		// deferred Rollback, which is harmless on it.
		next, err := e.store.Begin(ctx)
		if err != nil {
			e.release(ctx, op, token)
			return Outcome{}, storeError("begin", err)
		}
		tx = next
	}
	if err := tx.Complete(ctx, complete); err != nil {
		if errors.Is(err, ErrLeaseLost) {
			return Outcome{}, ErrLeaseLost
		}
		// The commit may or may not have happened (a connection lost
		// mid-commit). Release is fenced on the in-flight state and the
		// token, so it deletes nothing if the completion did commit.
		e.release(ctx, op, token)
		return Outcome{}, storeError("complete", err)
	}
	completed = true
	return Outcome{Result: complete.Result}, nil
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
// ctx has ended (that is often why it runs), bounded by ReleaseTimeout.
func (e *Engine) release(ctx context.Context, op Operation, token int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.config.ReleaseTimeout)
	defer cancel()
	if err := e.store.Release(ctx, ReleaseParams{Tenant: op.Tenant, Key: op.Key, Token: token}); err != nil {
		// The record stays in flight until its lease ends, then a retry
		// takes it over: safe, only slower.
		e.config.Logger.WarnContext(ctx, "idem: release failed; the key stays locked until its lease ends",
			slog.String("tenant", op.Tenant), slog.String("key", op.Key), slog.Any("error", err))
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
