package idemfronttest

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemfront"
)

// disconnect: a caller that goes away while the handler runs does not
// cut it short (its work would otherwise be done again by the retry, or
// left half done): the handler runs on, its answer is stored, and the
// retry gets it.
func (s *suite) disconnect(t *testing.T) {
	t.Run("HandlerRunsOn", func(t *testing.T) {
		if s.f.NoDisconnect {
			t.Skip("skipping: a caller cannot go away mid-call (Features.NoDisconnect)")
		}
		t.Parallel()
		g := newGate()
		ended := make(chan error, 1)
		var e *env
		e = s.newEnv(t, Options{}, func(ctx context.Context, _ []byte) Response {
			if e.transactional() {
				e.write(ctx, "charge-"+e.tenant)
			}
			// Checked after the gate too: released, a handler whose
			// context had ended must not pass for one that ran on.
			if g.wait(ctx) || ctx.Err() != nil {
				ended <- context.Cause(ctx)
				return Response{Body: []byte("cut short")}
			}
			ended <- nil
			return Response{Body: []byte("charged once")}
		}, g)
		ctx, leave := context.WithCancel(t.Context())
		sent := make(chan error, 1)
		go func() {
			_, err := e.client.Send(ctx, e.call("k", "a"))
			sent <- err
		}()
		g.waitStarted(t)
		leave()
		if err := <-sent; err == nil {
			t.Log("the client returned an answer after its caller left; going on")
		}
		// The handler must still be running: release it only now.
		select {
		case err := <-ended:
			t.Fatalf("the handler's context ended with its caller: %v", err)
		default:
		}
		g.release()
		if err := <-ended; err != nil {
			t.Fatalf("the handler's context ended with its caller: %v", err)
		}
		wantAnswer(t, "the retry", e.untilSettled(e.call("k", "a")), idemfront.Replayed, []byte("charged once"))
		e.wantRuns(1, "the handler ran on for its caller who left")
		if e.transactional() {
			if n := e.count("charge-" + e.tenant); n != 1 {
				t.Errorf("%d business rows, want 1", n)
			}
		}
	})
}
