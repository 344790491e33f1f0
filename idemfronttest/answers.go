package idemfronttest

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem/idemfront"
)

// inFlight: a duplicate that meets the execution in flight is told to
// retry later, with a delay, and nothing more runs.
func (s *suite) inFlight(t *testing.T) {
	t.Run("RetryLater", func(t *testing.T) {
		t.Parallel()
		g := newGate()
		e := s.newEnv(t, Options{}, func(ctx context.Context, _ []byte) Response {
			g.wait(ctx)
			return Response{Body: []byte("slow answer")}
		}, g)
		first := make(chan Reply, 1)
		go func() {
			r, err := e.client.Send(context.WithoutCancel(t.Context()), e.call("k", "a"))
			if err != nil {
				t.Errorf("first call: %v", err)
			}
			first <- r
		}()
		g.waitStarted(t)
		r := e.send(e.call("k", "a"))
		wantKind(t, "a duplicate while the first call runs", r, idemfront.InFlight)
		if r.RetryAfter <= 0 && !s.f.NoRetryAfter {
			t.Errorf("the in-flight answer advises no delay before the retry")
		}
		g.release()
		wantAnswer(t, "the first call", <-first, idemfront.Executed, []byte("slow answer"))
		wantAnswer(t, "the retry after it", e.send(e.call("k", "a")), idemfront.Replayed, []byte("slow answer"))
		e.wantRuns(1, "a call, a duplicate in flight, a retry")
	})
}

// mismatch: another request under a key used already is refused, and
// nothing runs: its answer is never the first request's.
func (s *suite) mismatch(t *testing.T) {
	t.Run("AfterCompletion", func(t *testing.T) {
		t.Parallel()
		e := s.newEnv(t, Options{}, func(_ context.Context, body []byte) Response {
			return Response{Body: append([]byte("charged "), body...)}
		})
		wantAnswer(t, "first request", e.send(e.call("k", "1 cent")), idemfront.Executed, []byte("charged 1 cent"))
		r := e.send(e.call("k", "100000 cents"))
		wantKind(t, "another request under the key", r, idemfront.Mismatch)
		e.wantRuns(1, "the other request must not run")
		wantAnswer(t, "the first request again", e.send(e.call("k", "1 cent")), idemfront.Replayed, []byte("charged 1 cent"))
	})
	t.Run("WhileInFlight", func(t *testing.T) {
		t.Parallel()
		g := newGate()
		e := s.newEnv(t, Options{}, func(ctx context.Context, body []byte) Response {
			g.wait(ctx)
			return Response{Body: body}
		}, g)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = e.client.Send(context.WithoutCancel(t.Context()), e.call("k", "first"))
		}()
		g.waitStarted(t)
		wantKind(t, "another request while the first runs", e.send(e.call("k", "second")), idemfront.Mismatch)
		g.release()
		<-done
		e.wantRuns(1, "the other request must not run")
	})
	t.Run("UnderWaitMode", func(t *testing.T) {
		// The wait mode waits for the same request only: another one is
		// refused, never handed the first one's answer once it is done.
		if s.f.NoWait {
			t.Skip("skipping: the front end has no wait mode (Features.NoWait)")
		}
		t.Parallel()
		g := newGate()
		e := s.newEnv(t, Options{WaitInFlight: time.Minute}, func(ctx context.Context, body []byte) Response {
			g.wait(ctx)
			return Response{Body: body}
		}, g)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = e.client.Send(context.WithoutCancel(t.Context()), e.call("k", "first"))
		}()
		g.waitStarted(t)
		second := make(chan Reply, 1)
		go func() {
			r, err := e.client.Send(t.Context(), e.call("k", "second"))
			if err != nil {
				t.Errorf("the other request: %v", err)
			}
			second <- r
		}()
		// Released once the other request has met the first: whether it
		// was answered already or (wrongly) waits, its answer comes now.
		for e.store.lost.Load() < 1 {
			time.Sleep(time.Millisecond)
		}
		g.release()
		<-done
		wantKind(t, "another request while the first runs", <-second, idemfront.Mismatch)
		e.wantRuns(1, "the other request must not run")
	})
}

// storeDown: when the store cannot be reached the front end fails
// closed: unavailable, retry later, and the handler does not run.
func (s *suite) storeDown(t *testing.T) {
	t.Run("HandlerNotRun", func(t *testing.T) {
		t.Parallel()
		e := s.newEnv(t, Options{}, ok("ran"))
		e.store.failClaim.Store(true)
		r := e.send(e.call("k", "a"))
		wantKind(t, "a call while the store is down", r, idemfront.StoreUnavailable)
		if r.RetryAfter <= 0 && !s.f.NoRetryAfter {
			t.Errorf("the unavailable answer advises no delay before the retry")
		}
		e.wantRuns(0, "the store was down")
		e.store.failClaim.Store(false)
		wantAnswer(t, "the retry once the store is back", e.send(e.call("k", "a")), idemfront.Executed, []byte("ran"))
	})
	t.Run("CompletionFails", func(t *testing.T) {
		// The store goes away while the handler runs: the answer cannot
		// be recorded, so it is not sent as if it were. On a
		// transactional store the handler's writes roll back with it.
		t.Parallel()
		var e *env
		e = s.newEnv(t, Options{}, func(ctx context.Context, _ []byte) Response {
			if e.transactional() {
				e.write(ctx, "lost-"+e.tenant)
			}
			return Response{Body: []byte("done")}
		})
		e.store.failComplete.Store(true)
		wantKind(t, "a call whose completion fails", e.send(e.call("k", "a")), idemfront.StoreUnavailable)
		e.wantRuns(1, "the handler ran once")
		if !e.transactional() {
			return
		}
		if n := e.count("lost-" + e.tenant); n != 0 {
			t.Errorf("%d business rows committed after the failed completion, want 0", n)
		}
		e.store.failComplete.Store(false)
		wantAnswer(t, "the retry", e.untilSettled(e.call("k", "a")), idemfront.Executed, []byte("done"))
		if n := e.count("lost-" + e.tenant); n != 1 {
			t.Errorf("%d business rows after the retry, want 1", n)
		}
	})
}
