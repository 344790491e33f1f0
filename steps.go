package idem

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// A recovery point records that one step of an operation (charge the
// card, send the e-mail) is done, with its result, so that an execution
// taking over from one that died gets the recorded result instead of
// doing the step again. See Step for the handler's side and StepStore for
// the store's.

// StepStore is implemented by stores that keep recovery points. Every
// store of this module implements it, and idemstoretest exercises it; a
// store that does not makes Step fail with ErrStepsUnsupported.
type StepStore interface {
	// SaveStep records a step's result under the record of (Tenant, Key),
	// fenced by the lease token, and makes it durable before it returns,
	// on its own: never inside the unit of work of the handler, whose
	// rollback must not forget that the step's effect happened. It returns
	// ErrLeaseLost when the record is not in flight under Token. A step
	// name already recorded keeps its first value, without error.
	//
	// A record that holds steps is never deleted by Release: Release
	// ends its lease instead (the record stays in flight, its lease past),
	// so that the next claim with the same fingerprint takes it over and
	// gets the steps (ClaimResult.Steps). Purge deletes it after its
	// retention, as any record.
	SaveStep(ctx context.Context, p SaveStepParams) error
}

// SaveStepParams are the arguments of StepStore.SaveStep.
type SaveStepParams struct {
	Tenant string
	Key    string
	Token  int64
	// Name names the step, unique within the operation.
	Name string
	// Value is the step's encoded result. Stores copy it.
	Value []byte
}

// RecordedStep is one recovery point of a record, in the order the steps
// were saved.
type RecordedStep struct {
	Name  string
	Value []byte
}

// ErrStepsUnsupported is returned by Step, before the step's function
// runs, when the engine's store does not implement StepStore, and, wrapped
// in an error that says so, on a store in the single-transaction mode
// (UnitClaimer), where nothing of an execution outlives its transaction.
var ErrStepsUnsupported = errors.New("idem: the store does not keep recovery points (it does not implement idem.StepStore)")

// ErrStepNotSaved is wrapped by the error Step returns when the step ran
// but its result could not be recorded (the store failed, the lease was
// lost, the result passed the step budget). The step's effect may stand
// without a record of it: return from the handler at once (see Step for
// what the engine does then), and make the step safe to run again with a
// downstream key (DownstreamKey).
var ErrStepNotSaved = errors.New("idem: the step ran but its result was not recorded")

// ErrStepTooLarge is wrapped by the error Step returns when a step's
// result is larger than Config.MaxStepBytes, or the record's steps would
// hold more than Config.MaxStepsBytes. Refused before the step's function
// runs when the record is full already; otherwise the function ran and
// the error wraps ErrStepNotSaved too.
var ErrStepTooLarge = errors.New("idem: the step's result passes the step budget (Config.MaxStepBytes, Config.MaxStepsBytes)")

// StepChecker is implemented by a UnitOfWork under which a step cannot be
// recorded in some of its states: Step calls CheckStep before it runs the
// step's function and, when it returns an error, returns that error
// without running the function, so that no effect happens that could not
// be recorded. idemsql's unit of work on SQLite refuses once the
// handler's transaction has begun, since it then holds the database's
// only write lock, which the step's record would wait for.
type StepChecker interface {
	CheckStep(ctx context.Context) error
}

// stepSize is the size of one step in the encoding stores keep
// (idemcodec.AppendStep): its name and its value, each after its length
// as a uvarint.
func stepSize(name string, value []byte) int {
	var n [binary.MaxVarintLen64]byte
	return binary.PutUvarint(n[:], uint64(len(name))) + len(name) + binary.PutUvarint(n[:], uint64(len(value))) + len(value)
}

// Step runs fn once per operation: the first execution of the key that
// reaches it runs fn and records its result (a recovery point) before
// Step returns; an execution that takes the key over later, after a
// crash, a lost lease or a rollback, gets the recorded result back
// without running fn. Use it for an effect outside the store's
// transaction that must not be repeated, such as a card charge:
//
//	charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (Charge, error) {
//		return cards.Charge(ctx, amount, idem.DownstreamKey(ctx, "charge"))
//	})
//
// The result is recorded as JSON, so T must survive a round trip through
// encoding/json. Name must be unique within the operation; steps of one
// execution may run one after the other or concurrently under different
// names. When fn fails, nothing is recorded and its error is returned: a
// retry runs fn again. When fn succeeded but its result could not be
// recorded, Step returns its result with an error wrapping ErrStepNotSaved:
// return from the handler at once. Whatever the handler answers then,
// even if it panics, Engine.Do discards the answer, stores nothing and
// returns the ErrStepNotSaved error (idemhttp answers 503 itself, with
// Retry-After), and the engine keeps the key in flight instead of
// releasing it to a retry that would repeat the effect at once: while the
// heartbeat holds the lease, it goes on trying to record the step after
// the handler returned (for up to one more Lease, the lease kept
// extended), then gives the key to the retry, which gets the step's
// result; without a heartbeat, or when the tries fail, the key stays in
// flight until its lease ends. When the store refused the record because the key was taken
// over, the error wraps ErrLeaseLost too: the key is the takeover's, and
// Do returns that error as a lost lease.
//
// Step does not run fn, and returns an error, when the engine already
// knows that the lease is lost (the heartbeat found the key taken over,
// and cancelled ctx; or the store refused an earlier step for it: the
// error wraps ErrLeaseLost), when the unit of work refuses steps
// (StepChecker: on SQLite, after the handler's first statement), or when
// the record's steps already fill Config.MaxStepsBytes (ErrStepTooLarge).
// A step's record waits as long as the store lets any write wait, within
// Config.Lease, even after ctx ended; its result may hold at most
// Config.MaxStepBytes.
//
// One window remains: a crash after fn's effect and before its record
// commits. A retry then runs fn again, which is why fn should pass a
// downstream key (DownstreamKey) to the service it calls.
//
// A step the handler leaves running in a goroutine holds the end of the
// execution back: the engine waits for it before it completes or releases
// the key, so that its record is not lost. A Step called once the handler
// has returned does not run fn and returns an error: nothing could record
// its effect any more.
//
// Outside an execution (a request without a key), Step just runs fn.
func Step[T any](ctx context.Context, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	st := stateFrom(ctx)
	if st == nil {
		return fn(ctx)
	}
	if name == "" {
		return zero, errors.New("idem: Step needs a name")
	}
	if st.steps == nil {
		return zero, cmp.Or(st.stepsRefused, ErrStepsUnsupported)
	}
	if value, ok := st.recordedStep(name); ok {
		var out T
		if err := json.Unmarshal(value, &out); err != nil {
			return zero, fmt.Errorf("idem: step %q: the recorded result does not decode into %T: %w", name, out, err)
		}
		return out, nil
	}
	if err := st.beginStep(ctx, name); err != nil {
		return zero, err
	}
	defer st.stepsRunning.Done()
	out, err := fn(ctx)
	if err != nil {
		return out, err
	}
	value, err := json.Marshal(out)
	if err != nil {
		st.unrecordable.Store(true)
		return out, st.notSaved(fmt.Errorf("%w: step %q: its result does not encode as JSON: %w", ErrStepNotSaved, name, err))
	}
	size, err := st.reserve(name, value)
	if err != nil {
		st.unrecordable.Store(true)
		return out, st.notSaved(err)
	}
	// The effect happened: record it even if the caller's context ended
	// meanwhile. The store bounds the wait as it bounds any write (on
	// SQLite, the busy timeout), not a cleanup timeout shorter than a
	// claim's wait: a step that gave up first would leave the key held
	// with no record of an effect that stands. Past the lease the record
	// is of no use: a takeover may have begun.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), st.saveTimeout)
	defer cancel()
	if err := st.saveStep(sctx, SaveStepParams{
		Tenant: st.info.Tenant, Key: st.info.Key, Token: st.info.LeaseToken,
		Name: name, Value: value,
	}); err != nil {
		st.mu.Lock()
		st.stepsBytes -= size
		st.mu.Unlock()
		if errors.Is(err, ErrLeaseLost) {
			// No later step may run: its record would be refused too.
			st.lost.Store(true)
		} else {
			st.mu.Lock()
			st.pending = append(st.pending, RecordedStep{Name: name, Value: value})
			st.mu.Unlock()
		}
		return out, st.notSaved(fmt.Errorf("%w: step %q: %w", ErrStepNotSaved, name, err))
	}
	st.mu.Lock()
	st.recorded = append(st.recorded, RecordedStep{Name: name, Value: value})
	st.savedSteps = true
	st.mu.Unlock()
	return out, nil
}

// initSteps sets up the recovery points of an execution of op on the
// engine e, under unit, with the steps the claim returned.
func (st *execState) initSteps(e *Engine, op Operation, unit UnitOfWork, recorded []RecordedStep) {
	st.steps, st.storeTracer = e.steps, e.storeTracer
	st.saveTimeout = e.config.Lease
	st.fingerprint = op.Fingerprint
	st.maxStep, st.maxSteps = e.config.MaxStepBytes, e.config.MaxStepsBytes
	if c, ok := unit.(StepChecker); ok {
		st.checkStep = c.CheckStep
	}
	if n := len(recorded); n > 0 {
		st.recorded = recorded
		st.info.RecoveryPoint = recorded[n-1].Name
		for _, r := range recorded {
			st.stepsBytes += stepSize(r.Name, r.Value)
		}
	}
}

// notSaved records err, the error of a step that ran and was not
// recorded, for the engine, and returns it.
func (st *execState) notSaved(err error) error {
	st.unsavedStep.CompareAndSwap(nil, &err)
	return err
}

// reserve counts the record of step name with value against the step
// budget, and returns the bytes it counted, or an error when it does not
// fit.
func (st *execState) reserve(name string, value []byte) (int, error) {
	if len(value) > st.maxStep {
		return 0, fmt.Errorf("%w: step %q: %w: its result is %d bytes, over MaxStepBytes (%d)", ErrStepNotSaved, name, ErrStepTooLarge, len(value), st.maxStep)
	}
	size := stepSize(name, value)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.stepsBytes+size > st.maxSteps {
		return 0, fmt.Errorf("%w: step %q: %w: the record's steps would hold %d bytes, over MaxStepsBytes (%d)", ErrStepNotSaved, name, ErrStepTooLarge, st.stepsBytes+size, st.maxSteps)
	}
	st.stepsBytes += size
	return size, nil
}

// errStepAfterEnd is returned by a Step called once the execution's
// handler has returned: the engine has decided what becomes of the key,
// so a step run then could not be recorded, and the next execution would
// run it again.
var errStepAfterEnd = errors.New("idem: Step was called after the handler returned; its function did not run")

// beginStep counts a step whose function is about to run, or, counting
// nothing, returns why it must not run: the lease is known lost, the unit
// of work refuses steps, the handler has returned, or the record's steps
// fill their budget.
func (st *execState) beginStep(ctx context.Context, name string) error {
	if st.lost.Load() {
		return fmt.Errorf("idem: step %q: the lease was lost to a takeover, so its function did not run: %w", name, ErrLeaseLost)
	}
	if st.checkStep != nil {
		if err := st.checkStep(ctx); err != nil {
			return fmt.Errorf("idem: step %q: its function did not run: %w", name, err)
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.ended {
		return fmt.Errorf("idem: step %q: %w", name, errStepAfterEnd)
	}
	if st.stepsBytes >= st.maxSteps {
		return fmt.Errorf("idem: step %q: %w: the record's steps hold %d bytes, MaxStepsBytes (%d); its function did not run", name, ErrStepTooLarge, st.stepsBytes, st.maxSteps)
	}
	st.stepsRunning.Add(1)
	return nil
}

// endSteps refuses the steps not yet begun and waits for those under way
// (a handler may leave one running in a goroutine), so that the engine
// decides on the key knowing whether each was recorded.
func (st *execState) endSteps() {
	st.mu.Lock()
	st.ended = true
	st.mu.Unlock()
	st.stepsRunning.Wait()
}

// recordedStep returns the value recorded for name, by this execution or
// an earlier one.
func (st *execState) recordedStep(name string) ([]byte, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, s := range st.recorded {
		if s.Name == name {
			return s.Value, true
		}
	}
	return nil, false
}

// DownstreamKey returns a stable idempotency key for the call that step
// name of the operation running in ctx makes to another service: the same
// for every execution of the operation, takeovers included, and different
// for every (tenant, key, request, step): it is bound to the operation's
// fingerprint, so that another request sent later under the same key
// (after an execution that stored nothing, NotExecuted or a failure) never
// reuses the downstream key of the first, which a service answering by
// key alone would answer with the first request's result. Send it as that
// service's own Idempotency-Key, so that a step run twice (the window Step
// cannot close) is one operation there. It is 64 hexadecimal characters,
// a SHA-256 that reveals neither the tenant, the key nor the request.
// Outside an execution it returns "".
func DownstreamKey(ctx context.Context, name string) string {
	st := stateFrom(ctx)
	if st == nil {
		return ""
	}
	h := sha256.New()
	for _, part := range []string{"idem downstream key v2", st.info.Tenant, st.info.Key, string(st.fingerprint), name} {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil))
}
