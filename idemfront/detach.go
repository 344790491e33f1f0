package idemfront

import "context"

// Detach returns the context a handler runs on when its caller's going
// away must not end it: ctx's values without its cancellation
// (context.WithoutCancel), ended only when life ends, with life's cause
// (context.Cause) and deadline, when life is not nil. The engine adds the
// end of the lease.
//
// A front end uses it by default, as Stripe behaves: an operation cut
// short by a caller who left and then retried could otherwise run twice
// (a payment charged twice on a store without transactions, or its
// downstream call repeated on one with). life is the server's shutdown
// context, so that a server stopping at once ends the handlers that run
// on without a caller. Call stop once Engine.Do has returned: the
// handler's own context has ended by then, and stop frees what Detach
// set up.
func Detach(ctx, life context.Context) (detached context.Context, stop func()) {
	detached = context.WithoutCancel(ctx)
	if life == nil {
		return detached, func() {}
	}
	var cancelDeadline context.CancelFunc = func() {}
	if d, ok := life.Deadline(); ok {
		detached, cancelDeadline = context.WithDeadline(detached, d)
	}
	detached, cancel := context.WithCancelCause(detached)
	stopAfter := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	return detached, func() {
		stopAfter()
		cancel(nil)
		cancelDeadline()
	}
}
