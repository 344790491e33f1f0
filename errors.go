package idem

import (
	"errors"
	"fmt"
)

var (
	// ErrInFlight means another execution holds the key and its lease is
	// still valid. Nothing ran; the caller may retry later (HTTP 409 with
	// Retry-After).
	ErrInFlight = errors.New("idem: an execution with this key is in flight")

	// ErrFingerprintMismatch means the key was used for a different request
	// (another body, path or method). Nothing ran (HTTP 422).
	ErrFingerprintMismatch = errors.New("idem: the key was used with a different request")

	// ErrLeaseLost means the execution's lease ended and another execution
	// took the key over, or the record was released. The completion was
	// refused and the whole transaction, business writes included, was
	// rolled back (HTTP 409).
	ErrLeaseLost = errors.New("idem: the lease on the key was lost")

	// ErrNotFound is returned by Store.Get when there is no record.
	ErrNotFound = errors.New("idem: record not found")

	// ErrInvalidKey is wrapped by the errors that ValidateKey returns.
	ErrInvalidKey = errors.New("idem: invalid idempotency key")

	// ErrStore is wrapped by every *StoreError, so that
	// errors.Is(err, ErrStore) tells a store failure from a handler error.
	ErrStore = errors.New("idem: store unavailable")

	// ErrNotApplied is wrapped by a store's error when the store knows the
	// operation did not take effect: it was never sent (no connection), or
	// the server refused it. A failed claim without it may still take
	// effect later, so the engine releases it (see Store.Claim).
	ErrNotApplied = errors.New("idem: the operation did not take effect")

	// ErrWritesAborted is returned by UnitOfWork.Complete, and then by
	// Engine.Do, when the handler answered a success (a status under 400,
	// or none) although a failed statement had aborted its transaction
	// (PostgreSQL): its writes are lost, so the success would be false.
	// Nothing is stored and the key is released, so a retry runs the
	// operation again. A handler that means to answer after a failed
	// statement answers an error status (its answer is then stored
	// without the writes), or runs the statement in a savepoint.
	ErrWritesAborted = errors.New("idem: the handler answered a success after a failed statement aborted its transaction; its writes are lost, so nothing was stored")

	// ErrClosed is returned by Engine.Do once Engine.Close was called.
	ErrClosed = errors.New("idem: the engine is closed")
)

// NotApplied wraps err so that errors.Is(err, ErrNotApplied) is true: a
// store returns it when it knows its operation did not take effect.
func NotApplied(err error) error {
	if err == nil || errors.Is(err, ErrNotApplied) {
		return err
	}
	return &notAppliedError{err}
}

type notAppliedError struct{ err error }

func (e *notAppliedError) Error() string   { return e.err.Error() }
func (e *notAppliedError) Unwrap() []error { return []error{e.err, ErrNotApplied} }

// StoreError reports a store that failed or could not be reached. The
// engine fails closed on it: when the claim fails the handler does not run
// (HTTP 503).
type StoreError struct {
	Op  string // the engine step: "claim", "begin", "rollback", "complete", "release", "extend"
	Err error
}

func (e *StoreError) Error() string { return fmt.Sprintf("idem: store %s: %v", e.Op, e.Err) }

// Unwrap returns both the cause and ErrStore.
func (e *StoreError) Unwrap() []error { return []error{ErrStore, e.Err} }

// PanicError wraps a value recovered from a panicking handler after the
// engine rolled back and released the key.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("idem: handler panicked: %v", e.Value) }
