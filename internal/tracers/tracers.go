// Package tracers serves the packages around the engine that observe
// through its tracer: it finds their optional interfaces (idemfront's
// request tracer, idemjanitor's purge tracer) on an engine's tracer,
// including inside idem.MultiTracer, which implements only the root's
// interfaces and lists its tracers with Unwrap; and it traces the store
// calls they make themselves as the engine traces its own.
package tracers

import (
	"context"
	"errors"
	"time"

	"github.com/idem-go/idem"
)

// Find returns the tracers of t that implement T: t itself, or those
// idem.MultiTracer combined, in order. Nil when none does.
func Find[T any](t idem.Tracer) []T {
	if x, ok := t.(T); ok {
		return []T{x}
	}
	u, ok := t.(interface{ Unwrap() []idem.Tracer })
	if !ok {
		return nil
	}
	var out []T
	for _, t := range u.Unwrap() {
		out = append(out, Find[T](t)...)
	}
	return out
}

// Store runs call, a call of store's operation op, under tracer's
// idem.StoreTracer when it has one, reported as the engine reports its
// own store calls: a record not found (idem.ErrNotFound) is an answer,
// not an error. It returns call's error unchanged.
func Store(ctx context.Context, tracer idem.Tracer, op idem.StoreOperation, store string, call func(ctx context.Context) error) error {
	st, _ := tracer.(idem.StoreTracer)
	if st == nil {
		return call(ctx)
	}
	ctx = st.TraceStoreStart(ctx, idem.TraceStoreStartData{Operation: op, Store: store})
	start := time.Now()
	err := call(ctx)
	reported := err
	if errors.Is(err, idem.ErrNotFound) {
		reported = nil
	}
	st.TraceStoreEnd(ctx, idem.TraceStoreEndData{Operation: op, Store: store, Duration: time.Since(start), Err: reported})
	return err
}

// StoreResultNames are the values observers report for a store call's
// result, indexed by StoreResult: the store answered, refused a fenced
// call, or failed. Index 0 is never returned.
var StoreResultNames = [...]string{"unknown", "ok", "lease_lost", "error"}

// StoreFailed is StoreResult's "error".
const StoreFailed = 3

// StoreResult classifies a store call by its error (see
// idem.TraceStoreEndData.Err), as an index of StoreResultNames.
func StoreResult(err error) int {
	switch {
	case err == nil:
		return 1
	case errors.Is(err, idem.ErrLeaseLost):
		return 2
	}
	return StoreFailed
}
