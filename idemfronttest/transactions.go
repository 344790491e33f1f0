package idemfronttest

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemfront"
)

// transactions: on a transactional store, the handler reaches the
// store's transaction through its context, and what it writes there
// commits with its answer: once, however often the call is retried.
func (s *suite) transactions(t *testing.T) {
	t.Run("WritesCommitWithTheAnswer", func(t *testing.T) {
		t.Parallel()
		var e *env
		e = s.newEnv(t, Options{}, func(ctx context.Context, _ []byte) Response {
			e.write(ctx, "order-"+e.tenant)
			return Response{Body: []byte("order placed")}
		})
		e.requireTransactional()
		wantAnswer(t, "the order", e.send(e.call("k", "a")), idemfront.Executed, []byte("order placed"))
		wantAnswer(t, "its retry", e.send(e.call("k", "a")), idemfront.Replayed, []byte("order placed"))
		if n := e.count("order-" + e.tenant); n != 1 {
			t.Errorf("%d business rows, want 1", n)
		}
	})
	t.Run("RejectedKeepsNoLeftovers", func(t *testing.T) {
		// The refusal is stored; the retry gets it and writes nothing more.
		t.Parallel()
		var e *env
		e = s.newEnv(t, Options{}, func(ctx context.Context, _ []byte) Response {
			e.write(ctx, "refused-"+e.tenant)
			return Response{Body: []byte("no"), Rejected: true}
		})
		e.requireTransactional()
		e.send(e.call("k", "a"))
		wantAnswer(t, "the retry", e.send(e.call("k", "a")), idemfront.Replayed, []byte("no"))
		if n := e.count("refused-" + e.tenant); n > 1 {
			t.Errorf("%d business rows, want at most 1", n)
		}
	})
}
