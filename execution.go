package idem

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Execution describes the execution of an operation that is running now:
// what a handler may want to know of where it stands. Read it with
// ExecutionFromContext.
type Execution struct {
	// Tenant and Key name the operation.
	Tenant string
	Key    string
	// LeaseToken is this execution's fencing token: the store accepts its
	// completion only while the key is held under it.
	LeaseToken int64
	// Store names the store that keeps the record (StoreInfo.Name).
	Store string
	// Takeover is true when this execution took the key over from an
	// earlier one that did not finish: it died, lost its lease, or was
	// rolled back after it recorded steps. Its effects outside the store
	// may have happened; the recovery points (Step) say which.
	Takeover bool
	// RecoveryPoint names the last step the earlier executions recorded,
	// "" when they recorded none.
	RecoveryPoint string
}

// execState is the part of a running execution that the handler may
// change through its context, read by the engine once the handler returned.
type execState struct {
	info           Execution
	notExecuted    atomic.Bool
	rollbackWrites atomic.Bool

	// Recovery points: those recorded by earlier executions, and those of
	// this one, under mu since a handler may run steps concurrently.
	steps       StepStore // nil when the store keeps none
	saveTimeout time.Duration
	storeTracer StoreTracer // the engine's, when it traces store calls
	// fingerprint is the operation's, which DownstreamKey binds to.
	fingerprint []byte
	// checkStep is the unit of work's StepChecker, nil when it has none.
	checkStep func(ctx context.Context) error
	// The step budget (Config.MaxStepBytes, Config.MaxStepsBytes).
	maxStep, maxSteps int
	// lost is set once the engine knows the lease is lost: the heartbeat
	// found it taken over, or the store refused a step for it. No step's
	// function runs after that.
	lost       atomic.Bool
	mu         sync.Mutex
	recorded   []RecordedStep
	stepsBytes int  // encoded size of recorded, and of the saves under way
	savedSteps bool // this execution recorded a step
	ended      bool // the handler returned: no step may begin
	// stepsRunning counts the steps whose function runs or whose record is
	// being saved.
	stepsRunning sync.WaitGroup
	// unsavedStep is the error of a step that ran but was not recorded.
	unsavedStep atomic.Pointer[error]
	// pending are the steps that ran and whose record the store failed
	// (not refused: the lease was not lost), under mu: the engine records
	// them later, while it still holds the lease (see saveLater).
	pending []RecordedStep
	// unrecordable is set when a step ran whose record no try can make
	// (its result does not encode, or passes the budget).
	unrecordable atomic.Bool

	// stepsRefused is what Step returns when steps is nil, when the
	// engine has a more precise reason than ErrStepsUnsupported.
	stepsRefused error
}

// execKey is the context key under which the handler's context carries
// its execState.
type execKey struct{}

func stateFrom(ctx context.Context) *execState {
	st, _ := ctx.Value(execKey{}).(*execState)
	return st
}

// ExecutionFromContext returns the execution running in ctx, and false
// outside one (a request without a key, or a context not derived from the
// one Engine.Do gave the function).
func ExecutionFromContext(ctx context.Context) (Execution, bool) {
	if st := stateFrom(ctx); st != nil {
		return st.info, true
	}
	return Execution{}, false
}

// NotExecuted marks the answer of the execution running in ctx as one that
// did not execute the operation: the request was refused before any work
// began (it failed validation, say). The engine then stores nothing, rolls
// back the unit of work and releases the key, so that a corrected retry
// with the same key runs; Engine.Do returns the answer with
// Outcome.NotStored set, for the front end to send. On a store without
// transactions, whatever the function did stays done: mark only answers
// that did nothing. It reports whether ctx carries an execution.
func NotExecuted(ctx context.Context) bool {
	st := stateFrom(ctx)
	if st == nil {
		return false
	}
	st.notExecuted.Store(true)
	return true
}

// RollbackWrites marks the execution running in ctx so that its business
// writes are rolled back while its answer is still stored and replayed: a
// payment refused by the card network, answered 402, that must leave no
// row behind, yet answer every retry the same. idemhttp does it for every
// 5xx answer. On a store without transactions there is nothing to roll
// back. It reports whether ctx carries an execution.
func RollbackWrites(ctx context.Context) bool {
	st := stateFrom(ctx)
	if st == nil {
		return false
	}
	st.rollbackWrites.Store(true)
	return true
}
