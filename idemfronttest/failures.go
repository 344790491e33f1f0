package idemfronttest

import (
	"context"
	"runtime"
	"testing"

	"github.com/idem-go/idem/idemfront"
)

// failures: a handler that panics or ends its goroutine leaves no answer
// stored; on a transactional store its writes roll back and a retry runs
// it again; on another, what it did may stand, so the key is held until
// its lease ends and a retry meanwhile is told to retry later. A
// transient answer is sent and never stored.
func (s *suite) failures(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func()
	}{
		{"Panic", func() { panic("idemfronttest: a handler's panic") }},
		{"Goexit", runtime.Goexit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "Goexit" && s.f.NoGoexit {
				t.Skip("skipping: runtime.Goexit in a handler takes the front end down (Features.NoGoexit)")
			}
			t.Parallel()
			var e *env
			e = s.newEnv(t, Options{}, func(ctx context.Context, _ []byte) Response {
				if e.transactional() {
					e.write(ctx, "fail-"+e.tenant)
				}
				if e.runs.Load() == 1 {
					tc.fail()
				}
				return Response{Body: []byte("second time lucky")}
			})
			r, err := e.client.Send(t.Context(), e.call("k", "a"))
			switch {
			case err != nil && tc.name == "Goexit":
				// No answer: the front end's goroutine ended with the
				// handler's, as net/http closes the connection.
			case err != nil:
				t.Fatalf("a panicking handler left no answer: %v", err)
			case r.Kind == idemfront.Executed || r.Kind == idemfront.Replayed:
				t.Fatalf("a handler that did not return was answered %s (%q)", r.Kind, clip(r.Body))
			case tc.name == "Panic" && r.Kind != idemfront.Panicked:
				t.Fatalf("a panicking handler: answered %s, want panicked", r.Kind)
			}
			again := e.send(e.call("k", "a"))
			if !e.transactional() {
				// What the handler did stands: a retry now would repeat it.
				wantKind(t, "the retry on a store without transactions", again, idemfront.InFlight)
				e.wantRuns(1, "the key is held until the lease ends")
				return
			}
			wantAnswer(t, "the retry", again, idemfront.Executed, []byte("second time lucky"))
			e.wantRuns(2, "a failure, then a retry")
			if n := e.count("fail-" + e.tenant); n != 1 {
				t.Errorf("%d business rows committed, want 1 (the failed execution's rolled back)", n)
			}
		})
	}
	t.Run("TransientNotStored", func(t *testing.T) {
		t.Parallel()
		var e *env
		e = s.newEnv(t, Options{}, func(ctx context.Context, _ []byte) Response {
			if e.transactional() {
				e.write(ctx, "transient-"+e.tenant)
			}
			if e.runs.Load() == 1 {
				return Response{Body: []byte("busy downstream"), Transient: true}
			}
			return Response{Body: []byte("done")}
		})
		first := e.send(e.call("k", "a"))
		wantAnswer(t, "a transient failure", first, idemfront.Executed, []byte("busy downstream"))
		if !first.Transient {
			t.Fatalf("the transient failure was answered as an ordinary answer")
		}
		wantAnswer(t, "the retry", e.send(e.call("k", "a")), idemfront.Executed, []byte("done"))
		e.wantRuns(2, "a transient failure is never replayed")
		if e.transactional() {
			if n := e.count("transient-" + e.tenant); n != 1 {
				t.Errorf("%d business rows committed, want 1 (the transient failure's rolled back)", n)
			}
		}
	})
}
