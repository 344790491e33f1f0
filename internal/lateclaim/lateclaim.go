// Package lateclaim releases a claim whose caller was told it failed.
//
// A claim statement that is cancelled, or whose connection is lost, after
// it was sent may still run on the server, and commit, after the error has
// reached the caller: the key is then held under a token nobody will run
// or complete, until the lease ends (90s by default), and the client's
// retries get 409 all that time. The SQL stores and idemredis therefore
// release such a claim, fenced by its token, which is harmless when it was
// never made. One release right away can come before the late statement
// itself, so the release is repeated over a few seconds.
package lateclaim

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// Schedule is when each release is sent, counted from the failure.
var Schedule = []time.Duration{0, 20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second, 5 * time.Second}

// attemptTimeout bounds each release.
const attemptTimeout = 2 * time.Second

// maxRunning bounds the release schedules running at once in a process:
// about 1 200 releases a second at most (each a fenced DELETE by primary
// key). The stores start one only for a claim that was sent and may have
// run (never for one that found no connection), so a database that is
// down gets none; one that is overloaded, and cancels many claims it may
// still run, gets these rather than 409s for a whole lease on each key.
// Past the bound a claim is not released here: its key stays held until
// its lease ends, the same as when a release fails.
const maxRunning = 1024

var running = make(chan struct{}, maxRunning)

// started counts the schedules Go started, for tests.
var started atomic.Int64

// Started returns how many release schedules Go has started in this
// process, for tests that must see none (or some).
func Started() int64 { return started.Load() }

// Releaser is the part of idem.Store that Release uses.
type Releaser interface {
	Release(ctx context.Context, p idem.ReleaseParams) error
}

// Go runs Release in a goroutine of its own, unless maxRunning schedules
// are running already; it reports whether it started one.
func Go(ctx context.Context, store Releaser, p idem.ClaimParams) bool {
	select {
	case running <- struct{}{}:
	default:
		return false
	}
	started.Add(1)
	go func() {
		defer func() { <-running }()
		Release(ctx, store, p)
	}()
	return true
}

// Release releases p's claim from store, fenced by its token, at each
// point of Schedule, each call with a context of its own (ctx's values,
// not its end), and ignores the errors: the claim may never have happened, and a store that is down
// keeps the key until its lease ends whatever is done here. It returns
// when the schedule is done; callers run it through Go.
func Release(ctx context.Context, store Releaser, p idem.ClaimParams) {
	rp := idem.ReleaseParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token}
	base := context.WithoutCancel(ctx)
	start := time.Now()
	for _, at := range Schedule {
		if d := time.Until(start.Add(at)); d > 0 {
			time.Sleep(d)
		}
		c, cancel := context.WithTimeout(base, attemptTimeout)
		_ = store.Release(c, rp)
		cancel()
	}
}

// NotSent marks a claim error that came before anything was sent (no
// connection could be had): there is no claim to release.
type NotSent struct{ Err error }

func (e NotSent) Error() string { return e.Err.Error() }
func (e NotSent) Unwrap() error { return e.Err }

// WasSent reports whether err may come after the claim was sent, that is
// whether it is not marked NotSent.
func WasSent(err error) bool {
	var ns NotSent
	return !errors.As(err, &ns)
}
