package idemfronttest

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemfront"
)

// awkward is a body a careless front end would alter: bytes that are not
// text, line ends of both kinds, a NUL, trailing spaces and newline.
var awkward = []byte("{\"id\":1}\r\n\x00\xff\xfe binary\t \n\n  ")

// replay: a retry gets the first answer byte for byte, marked as a
// replay, and the handler does not run again.
func (s *suite) replay(t *testing.T) {
	t.Run("ByteForByte", func(t *testing.T) {
		t.Parallel()
		e := s.newEnv(t, Options{}, func(context.Context, []byte) Response { return Response{Body: awkward} })
		wantAnswer(t, "first call", e.send(e.call("k", "a")), idemfront.Executed, awkward)
		for i := range 3 {
			r := e.send(e.call("k", "a"))
			wantAnswer(t, "retry", r, idemfront.Replayed, awkward)
			if r.Rejected || r.Transient {
				t.Fatalf("retry %d: replayed as rejected=%v transient=%v", i, r.Rejected, r.Transient)
			}
		}
		e.wantRuns(1, "a first call and three retries")
	})
	t.Run("EmptyBody", func(t *testing.T) {
		t.Parallel()
		e := s.newEnv(t, Options{}, ok(""))
		wantAnswer(t, "first call", e.send(e.call("k", "")), idemfront.Executed, nil)
		wantAnswer(t, "retry", e.send(e.call("k", "")), idemfront.Replayed, nil)
		e.wantRuns(1, "a call and its retry")
	})
	t.Run("Rejected", func(t *testing.T) {
		// A refusal is the operation's result as much as a success is: it
		// is stored and replayed, still a refusal.
		t.Parallel()
		e := s.newEnv(t, Options{}, func(context.Context, []byte) Response {
			return Response{Body: []byte("card declined"), Rejected: true}
		})
		first := e.send(e.call("k", "a"))
		wantAnswer(t, "first call", first, idemfront.Executed, []byte("card declined"))
		again := e.send(e.call("k", "a"))
		wantAnswer(t, "retry", again, idemfront.Replayed, []byte("card declined"))
		if !first.Rejected || !again.Rejected {
			t.Fatalf("rejected=%v then %v, want the refusal both times", first.Rejected, again.Rejected)
		}
		e.wantRuns(1, "a refused call and its retry")
	})
	t.Run("SameKeyOtherCallers", func(t *testing.T) {
		// Keys are the callers' names: another key is another operation.
		t.Parallel()
		e := s.newEnv(t, Options{}, func(_ context.Context, body []byte) Response {
			return Response{Body: append([]byte("for "), body...)}
		})
		wantAnswer(t, "k1", e.send(e.call("k1", "a")), idemfront.Executed, []byte("for a"))
		wantAnswer(t, "k2", e.send(e.call("k2", "a")), idemfront.Executed, []byte("for a"))
		wantAnswer(t, "k1 again", e.send(e.call("k1", "a")), idemfront.Replayed, []byte("for a"))
		e.wantRuns(2, "two keys")
	})
}
