package idem

import (
	"context"
	"errors"
	"fmt"
)

// ErrOutcomeUnknown is wrapped by the error Engine.Do returns after the
// function marked its execution with OutcomeUnknown.
var ErrOutcomeUnknown = errors.New("idem: the execution's outcome is unknown")

// OutcomeUnknown marks the execution running in ctx as one whose effects
// may have happened and cannot be known: a request sent to another
// service that never answered (a timeout, a connection lost after the
// request went out). Whatever the function returns then, nothing is
// stored, its writes are rolled back, and the key stays in flight,
// unextended, until its lease ends, instead of being released to a retry
// that could repeat the effects at once; a retry after that takes the key
// over and runs again. Engine.Do returns cause wrapped in
// ErrOutcomeUnknown. It reports whether ctx carries an execution.
//
// It is the reverse proxy's answer to an upstream that went silent
// (idemproxy); a handler that knows nothing ran calls NotExecuted
// instead, and one that knows the effect happened returns its answer.
func OutcomeUnknown(ctx context.Context, cause error) bool {
	st := stateFrom(ctx)
	if st == nil {
		return false
	}
	err := fmt.Errorf("%w: %w", ErrOutcomeUnknown, cause)
	// The engine keeps the key of an execution whose step ran unrecorded
	// in flight until its lease ends: the same fate, for the same reason.
	st.unsavedStep.CompareAndSwap(nil, &err)
	return true
}
