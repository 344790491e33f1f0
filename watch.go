package idem

import "context"

// Watcher is implemented by a Store that can say when a record changes,
// so that a duplicate waiting for an execution in flight
// (Operation.WaitInFlight) wakes when that execution ends rather than at
// its next poll. It is optional: the engine polls every store, and a
// Watcher only makes the wait shorter and the polls rarer.
//
// Implementations: idemmem (in the process), idempg (LISTEN/NOTIFY, across
// processes), idemsql (completions and releases made through the same
// Store).
type Watcher interface {
	// Watch subscribes to the record of (tenant, key). The channel is
	// closed once the record may have changed after Watch was called:
	// completed, released, its lease ended or taken over. A store may
	// close it for other reasons too (a lost connection, a change to
	// another record): the engine reads the record again, and watches
	// again, each time it is closed. stop unsubscribes; call it once,
	// whether the channel was closed or not.
	//
	// Watch must return promptly: when the store cannot subscribe (its
	// notification channel is down), it returns an error, and the engine
	// polls without it until a later Watch succeeds.
	Watch(ctx context.Context, tenant, key string) (changed <-chan struct{}, stop func(), err error)
}
