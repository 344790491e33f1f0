package idem

import (
	"context"
	"errors"
	"time"
)

// Tracer observes the operations an Engine runs: one call when an
// operation starts, one when it ends. Set it in Config.Tracer; idemprom
// and idemotel provide tracers for Prometheus and OpenTelemetry.
//
// A Tracer may implement the optional interfaces below as well; the
// engine, the janitor, the front ends and ideminbox find them by type assertion
// on Config.Tracer and call those it implements: StoreTracer (every store
// call) and LeaseTracer (lost leases, takeovers, heartbeat failures). The
// packages around the engine find theirs on the same tracer:
// idemfront.RequestTracer (a front end's requests) and
// idemjanitor.PurgeTracer (the janitor's passes). ideminbox traces its
// messages with a tracer of its own (ideminbox.MessageTracer, set in
// ideminbox.Config.Tracer).
//
// Calls come from many goroutines at once; a Tracer must be safe for
// concurrent use, and fast: it runs on every request. With no tracer the
// engine pays a nil check and nothing else.
type Tracer interface {
	// TraceOperationStart is called when Engine.Do starts, before the
	// claim. The context it returns is the one the operation runs under:
	// the store calls and the function given to Do (the handler) get it,
	// or contexts derived from it, so a tracer may put a span there. It
	// must return ctx or a context derived from it.
	TraceOperationStart(ctx context.Context, data TraceOperationStartData) context.Context

	// TraceOperationEnd is called when Engine.Do returns, with the
	// context TraceOperationStart returned.
	TraceOperationEnd(ctx context.Context, data TraceOperationEndData)
}

// TraceOperationStartData describes an operation that starts.
type TraceOperationStartData struct {
	// Tenant and Key name the operation. They are the caller's: keep them
	// out of metric labels, and out of anything that must not hold
	// personal data (see idemotel's key hash).
	Tenant string
	Key    string
	// Store names the engine's store (StoreInfo.Name).
	Store string
}

// OperationOutcome is how an operation ended, as TraceOperationEndData
// reports it.
type OperationOutcome uint8

// The outcomes of an operation. Their String values are the label values
// idemprom and idemotel report.
const (
	// OutcomeExecuted: the function ran and its result was stored.
	OutcomeExecuted OperationOutcome = iota + 1
	// OutcomeReplayed: the stored result of an earlier execution was
	// returned; the function did not run.
	OutcomeReplayed
	// OutcomeInFlight: another execution holds the key (ErrInFlight).
	OutcomeInFlight
	// OutcomeFingerprintMismatch: the key was used for another request
	// (ErrFingerprintMismatch).
	OutcomeFingerprintMismatch
	// OutcomeLeaseLost: the lease was taken over while the function ran;
	// its work was discarded (ErrLeaseLost).
	OutcomeLeaseLost
	// OutcomeStoreUnavailable: a store call failed (ErrStore).
	OutcomeStoreUnavailable
	// OutcomeHandlerError: the function returned an error; nothing was
	// stored and the key was released.
	OutcomeHandlerError
	// OutcomeHandlerPanic: the function panicked or ended its goroutine.
	OutcomeHandlerPanic
	// OutcomeCancelled: the caller's context ended first.
	OutcomeCancelled
	// OutcomeNotExecuted: the function marked its answer with
	// NotExecuted; nothing was stored and the key was released.
	OutcomeNotExecuted
	// OutcomeInvalidKey: the key failed ValidateKey; nothing was claimed.
	OutcomeInvalidKey
	// OutcomeClosed: the engine was closed (ErrClosed).
	OutcomeClosed
	// OutcomeStepNotSaved: a step (Step) ran but its result was not
	// recorded (ErrStepNotSaved); the key is held until its lease ends.
	OutcomeStepNotSaved

	numOperationOutcomes = iota
)

var operationOutcomeNames = [...]string{
	"unknown", "executed", "replayed", "in_flight", "fingerprint_mismatch", "lease_lost",
	"store_unavailable", "handler_error", "handler_panic", "cancelled", "not_executed",
	"invalid_key", "closed", "step_not_saved",
}

// String returns the outcome's name: "executed", "replayed", "in_flight",
// "fingerprint_mismatch", "lease_lost", "store_unavailable",
// "handler_error", "handler_panic", "cancelled", "not_executed",
// "invalid_key", "closed" or "step_not_saved".
func (o OperationOutcome) String() string {
	if int(o) < len(operationOutcomeNames) {
		return operationOutcomeNames[o]
	}
	return "unknown"
}

// OperationOutcomes returns every outcome, for a tracer that prepares its
// label values ahead.
func OperationOutcomes() []OperationOutcome {
	out := make([]OperationOutcome, 0, numOperationOutcomes)
	for o := OutcomeExecuted; o <= OutcomeStepNotSaved; o++ {
		out = append(out, o)
	}
	return out
}

// TraceOperationEndData describes an operation that ended.
type TraceOperationEndData struct {
	Outcome OperationOutcome
	// Store names the engine's store.
	Store string
	// Takeover is true when the claim took the key over from an earlier
	// execution whose lease had ended.
	Takeover bool
	// ReplayAge is, for a replay, how long ago the replayed result was
	// completed: Record.CompletedAt, on the store's clock, against this
	// process's clock (the store interface does not tell the store's time
	// of the claim), so drift between the two shows here; never negative.
	ReplayAge time.Duration
	// ResponseBytes is the size of the stored body: what was stored, for
	// an execution; what was replayed, for a replay.
	ResponseBytes int
	// Err is what Engine.Do returned.
	Err error
}

// StoreOperation names a store call.
type StoreOperation uint8

// The store calls the engine, the heartbeat, the janitor and the inbox
// make.
const (
	StoreClaim StoreOperation = iota + 1
	StoreBegin
	StoreComplete
	StoreRollback
	StoreRelease
	StoreExtend
	StoreGet
	StorePurge
	// StoreSaveStep is StepStore.SaveStep, recording a step's result.
	StoreSaveStep

	numStoreOperations = iota
)

var storeOperationNames = [...]string{"unknown", "claim", "begin", "complete", "rollback", "release", "extend", "get", "purge", "save_step"}

// String returns "claim", "begin", "complete", "rollback", "release",
// "extend", "get", "purge" or "save_step".
func (o StoreOperation) String() string {
	if int(o) < len(storeOperationNames) {
		return storeOperationNames[o]
	}
	return "unknown"
}

// StoreOperations returns every store operation.
func StoreOperations() []StoreOperation {
	out := make([]StoreOperation, 0, numStoreOperations)
	for o := StoreClaim; o <= StoreSaveStep; o++ {
		out = append(out, o)
	}
	return out
}

// StoreTracer observes every store call of the engine (claim, begin,
// complete, rollback, release, including the late releases of failed
// claims), of the heartbeat (extend), of the janitor (purge) and of the
// inbox (get).
type StoreTracer interface {
	// TraceStoreStart is called before the call; the context it returns
	// is the one the store gets.
	TraceStoreStart(ctx context.Context, data TraceStoreStartData) context.Context
	// TraceStoreEnd is called after it, with that context.
	TraceStoreEnd(ctx context.Context, data TraceStoreEndData)
}

// TraceStoreStartData describes a store call that starts.
type TraceStoreStartData struct {
	Operation StoreOperation
	Store     string
}

// TraceStoreEndData describes a store call that ended.
type TraceStoreEndData struct {
	Operation StoreOperation
	Store     string
	Duration  time.Duration
	// Err is nil when the store answered, a Get or Release that found no
	// record (ErrNotFound) included; ErrLeaseLost when the store refused
	// a fenced call (Complete, Extend) because the lease is no longer
	// held; any other error when the call failed. idemprom and idemotel
	// report the three as the results "ok", "lease_lost" and "error".
	Err error
}

// LeaseEvent is something that happened to a lease.
type LeaseEvent uint8

// The lease events.
const (
	// LeaseLost: a running execution's lease was found taken over, by the
	// heartbeat or at the completion. Reported once per execution.
	LeaseLost LeaseEvent = iota + 1
	// LeaseTakeover: a claim took a key over from an earlier execution
	// whose lease had ended (it died, was cut off, or was released after
	// it recorded steps).
	LeaseTakeover
	// LeaseHeartbeatFailed: an extension of a running execution's lease
	// failed for another reason than a lost lease; it is tried again at
	// the next tick.
	LeaseHeartbeatFailed
)

// String returns "lost", "takeover" or "heartbeat_failed".
func (e LeaseEvent) String() string {
	switch e {
	case LeaseLost:
		return "lost"
	case LeaseTakeover:
		return "takeover"
	case LeaseHeartbeatFailed:
		return "heartbeat_failed"
	}
	return "unknown"
}

// LeaseTracer observes lease events.
type LeaseTracer interface {
	// TraceLease is called when ev happens. ctx is the operation's
	// context for a takeover and a lost lease, and the heartbeat's, which
	// carries the operation's values, for a heartbeat failure.
	TraceLease(ctx context.Context, data TraceLeaseData)
}

// TraceLeaseData describes a lease event.
type TraceLeaseData struct {
	Event LeaseEvent
	Store string
	// Err is the store's error for a heartbeat failure.
	Err error
}

// classifyOperation names the outcome of Engine.Do from what it returns.
func classifyOperation(ctx context.Context, out Outcome, err error) OperationOutcome {
	switch {
	case err == nil && out.Replayed:
		return OutcomeReplayed
	case err == nil && out.NotStored:
		return OutcomeNotExecuted
	case err == nil:
		return OutcomeExecuted
	case errors.Is(err, ErrInFlight):
		return OutcomeInFlight
	case errors.Is(err, ErrFingerprintMismatch):
		return OutcomeFingerprintMismatch
	case errors.Is(err, ErrLeaseLost):
		return OutcomeLeaseLost
	case isPanic(err), errors.Is(err, errGoexit):
		return OutcomeHandlerPanic
	case errors.Is(err, ErrClosed):
		return OutcomeClosed
	case errors.Is(err, ErrInvalidKey):
		return OutcomeInvalidKey
	case errors.Is(err, ErrStepNotSaved):
		return OutcomeStepNotSaved
	case errors.Is(err, ErrStore):
		return OutcomeStoreUnavailable
	case ctx.Err() != nil, isWaitEnded(err):
		// A waiter whose Operation.WaitContext ended (its client left)
		// ran nothing, although Do's context lives on.
		return OutcomeCancelled
	}
	return OutcomeHandlerError
}

// isPanic reports whether err is a *PanicError. A function of its own:
// the target of errors.As is allocated where it is declared, which
// classifyOperation must not pay for the answers that are no error.
func isPanic(err error) bool {
	var panicked *PanicError
	return errors.As(err, &panicked)
}

// opTrace collects, during one traced Engine.Do, what the end data needs
// beyond Do's answer.
type opTrace struct {
	takeover    bool
	completedAt time.Time // of the replayed record
}

// doTraced is Engine.Do under the tracer.
func (e *Engine) doTraced(ctx context.Context, op Operation, fn func(ctx context.Context) (Result, error)) (Outcome, error) {
	ctx = e.tracer.TraceOperationStart(ctx, TraceOperationStartData{Tenant: op.Tenant, Key: op.Key, Store: e.info.Name})
	var t opTrace
	ended := false
	defer func() {
		if !ended {
			// The function ended its goroutine (runtime.Goexit), or a
			// store panicked: Do does not return, the trace still ends.
			e.tracer.TraceOperationEnd(ctx, TraceOperationEndData{Outcome: OutcomeHandlerPanic, Store: e.info.Name,
				Takeover: t.takeover, Err: errGoexit})
		}
	}()
	out, err := e.do(ctx, op, fn, &t)
	ended = true
	end := TraceOperationEndData{
		Outcome:  classifyOperation(ctx, out, err),
		Store:    e.info.Name,
		Takeover: t.takeover,
		Err:      err,
	}
	if end.Outcome == OutcomeReplayed || end.Outcome == OutcomeExecuted {
		end.ResponseBytes = len(out.Result.Body)
	}
	if end.Outcome == OutcomeReplayed && !t.completedAt.IsZero() {
		end.ReplayAge = max(time.Since(t.completedAt), 0)
	}
	e.tracer.TraceOperationEnd(ctx, end)
	return out, err
}

// traceLease reports a lease event to the tracer, when it wants them.
func (e *Engine) traceLease(ctx context.Context, ev LeaseEvent, err error) {
	if e.leaseTracer != nil {
		e.leaseTracer.TraceLease(ctx, TraceLeaseData{Event: ev, Store: e.info.Name, Err: err})
	}
}

// clockBase anchors the durations the hooks measure. time.Since of a Time
// that carries a monotonic reading reads the monotonic clock alone, half
// the cost of time.Now, which reads the wall clock too: it counts on a
// path that runs them on every store call.
var clockBase = time.Now()

// monotonic returns the time elapsed since clockBase.
func monotonic() time.Duration { return time.Since(clockBase) }

// storeTrace measures one store call for a StoreTracer.
type storeTrace struct {
	st    StoreTracer
	op    StoreOperation
	store string
	start time.Duration // monotonic()
}

// startStore begins the trace of a store call; st is not nil.
func startStore(ctx context.Context, st StoreTracer, op StoreOperation, store string) (context.Context, storeTrace) {
	ctx = st.TraceStoreStart(ctx, TraceStoreStartData{Operation: op, Store: store})
	return ctx, storeTrace{st: st, op: op, store: store, start: monotonic()}
}

func (s storeTrace) end(ctx context.Context, err error) {
	if errors.Is(err, ErrNotFound) {
		err = nil // an answer: no record
	}
	s.st.TraceStoreEnd(ctx, TraceStoreEndData{Operation: s.op, Store: s.store, Duration: monotonic() - s.start, Err: err})
}

// The engine's store calls, traced when the tracer is a StoreTracer.

func (e *Engine) claim(ctx context.Context, p ClaimParams) (ClaimResult, error) {
	if e.storeTracer == nil {
		return e.store.Claim(ctx, p)
	}
	ctx, s := startStore(ctx, e.storeTracer, StoreClaim, e.info.Name)
	res, err := e.store.Claim(ctx, p)
	s.end(ctx, err)
	return res, err
}

func (e *Engine) begin(ctx context.Context) (UnitOfWork, error) {
	if e.storeTracer == nil {
		return e.store.Begin(ctx)
	}
	ctx, s := startStore(ctx, e.storeTracer, StoreBegin, e.info.Name)
	unit, err := e.store.Begin(ctx)
	s.end(ctx, err)
	return unit, err
}

func (e *Engine) completeUnit(ctx context.Context, unit UnitOfWork, p CompleteParams) error {
	if e.storeTracer == nil {
		return unit.Complete(ctx, p)
	}
	ctx, s := startStore(ctx, e.storeTracer, StoreComplete, e.info.Name)
	err := unit.Complete(ctx, p)
	s.end(ctx, err)
	return err
}

func (e *Engine) rollbackUnit(ctx context.Context, unit UnitOfWork) error {
	if e.storeTracer == nil {
		return unit.Rollback(ctx)
	}
	ctx, s := startStore(ctx, e.storeTracer, StoreRollback, e.info.Name)
	err := unit.Rollback(ctx)
	s.end(ctx, err)
	return err
}

func (e *Engine) releaseKey(ctx context.Context, p ReleaseParams) error {
	return releaseTraced(ctx, e.store, e.storeTracer, e.info.Name, p)
}

// saveStep is StepStore.SaveStep, traced when the tracer is a StoreTracer.
func (st *execState) saveStep(ctx context.Context, p SaveStepParams) error {
	if st.storeTracer == nil {
		return st.steps.SaveStep(ctx, p)
	}
	ctx, s := startStore(ctx, st.storeTracer, StoreSaveStep, st.info.Store)
	err := st.steps.SaveStep(ctx, p)
	s.end(ctx, err)
	return err
}

func releaseTraced(ctx context.Context, store Store, st StoreTracer, name string, p ReleaseParams) error {
	if st == nil {
		return store.Release(ctx, p)
	}
	ctx, s := startStore(ctx, st, StoreRelease, name)
	err := store.Release(ctx, p)
	s.end(ctx, err)
	return err
}

// MultiTracer returns a tracer that calls each of tracers in turn, and
// implements every optional interface of this package, forwarding each
// call to those of tracers that implement it; a front end finds its
// request tracers among them with idemfront.RequestTracerOf. The contexts returned by the Start calls
// are chained: each tracer starts from the previous one's. Nil tracers
// are skipped; with none left it returns nil.
func MultiTracer(tracers ...Tracer) Tracer {
	m := &multiTracer{}
	for _, t := range tracers {
		if t == nil {
			continue
		}
		m.all = append(m.all, t)
		if s, ok := t.(StoreTracer); ok {
			m.store = append(m.store, s)
		}
		if l, ok := t.(LeaseTracer); ok {
			m.lease = append(m.lease, l)
		}
	}
	switch len(m.all) {
	case 0:
		return nil
	case 1:
		return m.all[0]
	}
	return m
}

type multiTracer struct {
	all   []Tracer
	store []StoreTracer
	lease []LeaseTracer
}

// Unwrap returns the tracers m calls, so that a front end finds the
// interfaces of its own among them (idemfront.RequestTracerOf).
func (m *multiTracer) Unwrap() []Tracer { return m.all }

func (m *multiTracer) TraceOperationStart(ctx context.Context, data TraceOperationStartData) context.Context {
	for _, t := range m.all {
		ctx = t.TraceOperationStart(ctx, data)
	}
	return ctx
}

func (m *multiTracer) TraceOperationEnd(ctx context.Context, data TraceOperationEndData) {
	for _, t := range m.all {
		t.TraceOperationEnd(ctx, data)
	}
}

func (m *multiTracer) TraceStoreStart(ctx context.Context, data TraceStoreStartData) context.Context {
	for _, t := range m.store {
		ctx = t.TraceStoreStart(ctx, data)
	}
	return ctx
}

func (m *multiTracer) TraceStoreEnd(ctx context.Context, data TraceStoreEndData) {
	for _, t := range m.store {
		t.TraceStoreEnd(ctx, data)
	}
}

func (m *multiTracer) TraceLease(ctx context.Context, data TraceLeaseData) {
	for _, t := range m.lease {
		t.TraceLease(ctx, data)
	}
}
