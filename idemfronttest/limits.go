package idemfronttest

import (
	"bytes"
	"context"
	"testing"

	"github.com/idem-go/idem/idemfront"
)

// limit is the request and answer limit the Limits cases set.
const limit = 1 << 10

// limits: a request over the limit is refused before anything runs; an
// answer over it is neither sent unstored nor stored truncated, and the
// key is released for a retry.
func (s *suite) limits(t *testing.T) {
	t.Run("Request", func(t *testing.T) {
		if s.f.NoRequestLimit {
			t.Skip("skipping: the front end does not bound requests (Features.NoRequestLimit)")
		}
		t.Parallel()
		e := s.newEnv(t, Options{MaxRequestBody: limit}, func(_ context.Context, body []byte) Response {
			return Response{Body: []byte{byte(len(body) >> 8), byte(len(body))}}
		})
		at := string(bytes.Repeat([]byte("r"), limit))
		wantAnswer(t, "a request at the limit", e.send(e.call("at", at)), idemfront.Executed, []byte{limit >> 8, limit & 0xff})
		wantKind(t, "a request over the limit", e.send(e.call("over", at+"r")), idemfront.RequestTooLarge)
		e.wantRuns(1, "the request over the limit must not run")
	})
	t.Run("Response", func(t *testing.T) {
		if s.f.NoResponseLimit {
			t.Skip("skipping: the front end does not bound answers (Features.NoResponseLimit)")
		}
		t.Parallel()
		var e *env
		over := bytes.Repeat([]byte("a"), limit+1)
		at := bytes.Repeat([]byte("b"), limit)
		e = s.newEnv(t, Options{MaxResponseBody: limit}, func(ctx context.Context, body []byte) Response {
			if e.transactional() {
				e.write(ctx, "big-"+e.tenant)
			}
			if string(body) == "big" && e.runs.Load() == 1 {
				return Response{Body: over}
			}
			return Response{Body: at}
		})
		wantKind(t, "an answer over the limit", e.send(e.call("k", "big")), idemfront.ResponseTooLarge)
		// Released: the retry runs, and its answer at the limit is stored
		// whole.
		wantAnswer(t, "the retry", e.send(e.call("k", "big")), idemfront.Executed, at)
		wantAnswer(t, "the retry's retry", e.send(e.call("k", "big")), idemfront.Replayed, at)
		e.wantRuns(2, "an answer too large, then a retry")
		if e.transactional() {
			if n := e.count("big-" + e.tenant); n != 1 {
				t.Errorf("%d business rows committed, want 1 (the answer too large rolled back)", n)
			}
		}
	})
}
