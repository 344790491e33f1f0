package idem

import "context"

// Watcher is implemented by a Store that can say when a record changes,
// so that a duplicate waiting for an execution in flight
// (Operation.WaitInFlight) wakes when that execution ends rather than at
// its next poll. It is optional: the engine polls every store, and a
// Watcher only makes the wait shorter and the polls rarer.
//
// Implementations: idemmem (in the process), idempg (LISTEN/NOTIFY, across
// processes), idemredis (pub/sub, across processes), idemsql (completions
// and releases made through the same Store).
type Watcher interface {
	// Watch subscribes to the record of (tenant, key). The channel is
	// closed once the record may have changed after Watch was called:
	// completed, released, its lease ended or taken over. A store may
	// close it for other reasons too (a lost connection, a change to
	// another record): the engine reads the record again, and watches
	// again, each time it is closed.
	//
	// ctx bounds the subscribing only, as a dial's context bounds the
	// dial: when it ends before the subscription is in place, Watch
	// returns its error and holds nothing. Once Watch has returned, ctx
	// no longer matters: the subscription lasts until stop is called,
	// and only stop ends it. The caller calls stop exactly once (a
	// second call does nothing), whether the channel was closed or not;
	// stop never closes the channel.
	//
	// Watch must return promptly: when the store cannot subscribe (its
	// notification channel is down), it returns an error, and the engine
	// polls without it until a later Watch succeeds.
	Watch(ctx context.Context, tenant, key string) (changed <-chan struct{}, stop func(), err error)
}

// StateReader is implemented by a Store that can read a record without
// its payload. The engine's poller, which reads a waited key a few times
// a second while its execution runs, then reads only what tells it
// whether to wake the waiters; a record's result is read once, when it
// completed, and its recovery points never. Without it the poller uses
// Get.
//
// Implementations: idemmem, idempg, idemsql, idemredis.
type StateReader interface {
	// GetState reads the record of (tenant, key) as Get does, whatever
	// its state or retention, without its result and its recovery points:
	// Result and Steps are left zero, every other field is set. It returns
	// ErrNotFound when there is no record.
	GetState(ctx context.Context, tenant, key string) (*Record, error)
}
