package idemfronttest

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/internal/atonce"
)

// duplicatesAtOnce is how many copies of one call the barrier releases.
const duplicatesAtOnce = 20

// duplicates: copies of one call released at one barrier run the handler
// once; every copy gets the answer (fresh once, replayed with the marker)
// or the front end's "retry later".
func (s *suite) duplicates(t *testing.T) {
	t.Run("AtOneBarrier", func(t *testing.T) {
		t.Parallel()
		var e *env
		e = s.newEnv(t, Options{}, func(ctx context.Context, body []byte) Response {
			if e.transactional() {
				e.write(ctx, "dup-"+e.tenant)
			}
			return Response{Body: append([]byte("made once: "), body...)}
		})
		replies := make([]Reply, duplicatesAtOnce)
		errs := make([]error, duplicatesAtOnce)
		atonce.Run(duplicatesAtOnce, func(i int) {
			replies[i], errs[i] = e.client.Send(t.Context(), e.call("dup", "order 1"))
		})
		want := []byte("made once: order 1")
		fresh := 0
		for i, r := range replies {
			if errs[i] != nil {
				t.Fatalf("duplicate %d: %v", i, errs[i])
			}
			switch r.Kind {
			case idemfront.Executed:
				fresh++
			case idemfront.Replayed:
			case idemfront.InFlight:
				continue
			default:
				t.Fatalf("duplicate %d answered %s (%q), want executed, replayed or in flight", i, r.Kind, clip(r.Body))
			}
			if !bytes.Equal(r.Body, want) {
				t.Fatalf("duplicate %d got %q, want %q", i, clip(r.Body), want)
			}
		}
		e.wantRuns(1, fmt.Sprintf("%d duplicates released at once", duplicatesAtOnce))
		if fresh != 1 {
			t.Errorf("%d duplicates got a fresh answer (without the replay marker), want exactly 1", fresh)
		}
		wantAnswer(t, "a retry after them", e.untilSettled(e.call("dup", "order 1")), idemfront.Replayed, want)
		if e.transactional() {
			if n := e.count("dup-" + e.tenant); n != 1 {
				t.Errorf("%d business rows committed, want 1", n)
			}
		}
	})
}
