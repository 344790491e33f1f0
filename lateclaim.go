package idem

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// A claim that failed may still take effect: a statement cancelled after
// it was sent can run on the server, and commit, after the error reached
// the engine. The key would then stay held under a token nobody runs or
// completes, and every retry would get "in flight" until the lease ends
// (90s by default). So the engine releases such a claim, fenced by its
// token, which is harmless when it never happened. One release at once
// can come before the late statement itself, so it is repeated over a few
// seconds.

// lateReleaseSchedule is when each release is sent, counted from the
// failed claim.
var lateReleaseSchedule = []time.Duration{0, 20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second, 5 * time.Second}

// lateReleaseTimeout bounds each release.
const lateReleaseTimeout = 2 * time.Second

// maxLateReleases bounds the release schedules running at once in one
// engine: about 1 200 releases a second at most (each a fenced delete by
// primary key). Past the bound a claim is not released: its key stays
// held until its lease ends, as when a release fails. Stores mark the
// claims they know did not take effect (ErrNotApplied), so a store that
// is down gets none.
const maxLateReleases = 1024

// lateReleases runs the release schedules of one engine. Engine.Close
// cuts the schedules short (one last release each, at once) and waits for
// them.
type lateReleases struct {
	store  Store
	st     StoreTracer // nil: the releases are not traced
	name   string      // the store's
	logger *slog.Logger
	// dropped is when a schedule was last refused for want of a slot (in
	// UnixNano), so that the warning is logged at most once a second.
	dropped atomic.Int64
	slots   chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup

	mu     sync.Mutex // orders wg.Add before the Wait of close
	closed bool
}

func newLateReleases(store Store, st StoreTracer, name string, logger *slog.Logger) *lateReleases {
	return &lateReleases{store: store, st: st, name: name, logger: logger, slots: make(chan struct{}, maxLateReleases), stop: make(chan struct{})}
}

// start schedules the releases of a failed claim, and reports whether it
// did (not past maxLateReleases, nor after close).
func (lr *lateReleases) start(ctx context.Context, p ReleaseParams) bool {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if lr.closed {
		return false
	}
	select {
	case lr.slots <- struct{}{}:
	default:
		if now, last := time.Now().UnixNano(), lr.dropped.Load(); now-last > int64(time.Second) && lr.dropped.CompareAndSwap(last, now) {
			lr.logger.WarnContext(ctx, "idem: too many failed claims being released at once; this one is not, and its key may stay held until its lease ends (logged at most once a second)",
				slog.String("store", lr.name), slog.Int("limit", maxLateReleases))
		}
		return false
	}
	lr.logger.DebugContext(ctx, "idem: a failed claim may still take effect; releasing it over the next seconds",
		slog.String("store", lr.name), slog.String("key", p.Key))
	lr.wg.Add(1)
	go func() {
		defer lr.wg.Done()
		defer func() { <-lr.slots }()
		lr.run(context.WithoutCancel(ctx), p)
	}()
	return true
}

// run sends the releases of p at each point of the schedule, each with a
// context of its own (ctx's values, not its end), and ignores their
// errors: the claim may never have happened, and a store that is down
// keeps the key until its lease ends whatever is done here.
func (lr *lateReleases) run(ctx context.Context, p ReleaseParams) {
	start := time.Now()
	for _, at := range lateReleaseSchedule {
		closing := false
		if d := time.Until(start.Add(at)); d > 0 {
			timer := time.NewTimer(d)
			select {
			case <-timer.C:
			case <-lr.stop:
				timer.Stop()
				closing = true
			}
		}
		c, cancel := context.WithTimeout(ctx, lateReleaseTimeout)
		_ = releaseTraced(c, lr.store, lr.st, lr.name, p)
		cancel()
		if closing {
			return
		}
	}
}

// close ends the schedules after one last release each, and waits for
// them until ctx ends.
func (lr *lateReleases) close(ctx context.Context) error {
	lr.mu.Lock()
	if !lr.closed {
		lr.closed = true
		close(lr.stop)
	}
	lr.mu.Unlock()
	done := make(chan struct{})
	go func() {
		lr.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
