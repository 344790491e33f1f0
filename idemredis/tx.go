package idemredis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// tx is the unit of work of a store without transactions: Context hands
// the handler's context back unchanged (there is nothing to join), and
// Complete writes the result by itself, atomically and fenced by the
// lease token. A business write the handler made elsewhere is already
// committed, or not, by then; the package documentation says what that
// costs.
type tx struct{ s *Store }

// Context returns ctx unchanged.
func (t tx) Context(ctx context.Context) context.Context { return ctx }

// Rollback does nothing: there is nothing to roll back, and the record
// stays in flight, as idem.UnitOfWork requires.
func (t tx) Rollback(ctx context.Context) error { return nil }

// Complete stores the result in one Lua script, fenced by the token: it
// returns idem.ErrLeaseLost when the record is gone (expired, released,
// flushed), held under another token, or already complete. Each call
// draws a completion id, so that a resend of this very call is told apart
// from a second call (see scripts.go). Watchers of the key are woken
// (Store.Watch). When the script fails (Redis
// unreachable, the reply lost, a refusal), Complete sends it again, with
// the same id, until it is answered or Config.CompleteTimeout has passed.
func (t tx) Complete(ctx context.Context, p idem.CompleteParams) error {
	if _, known := modeNames[p.Result.Mode.String()]; !known {
		return fmt.Errorf("idemredis: complete: unknown storage mode %d", p.Result.Mode)
	}
	header, err := idemcodec.MarshalHeader(p.Result.Header)
	if err != nil {
		return fmt.Errorf("idemredis: complete: %w", err)
	}
	once := t.s.completeTimeout < 0
	if !once {
		// The handler has run: its answer is stored whatever its caller
		// does meanwhile.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), t.s.completeTimeout)
		defer cancel()
	}
	key := t.s.key(p.Tenant, p.Key)
	args := []any{strconv.FormatInt(p.Token, 10), p.Result.Mode.String(), p.Result.Status,
		header, p.Result.Body, p.Result.Reference,
		strconv.FormatUint(rand.Uint64(), 10), t.s.notify}
	for attempts, pause := 1, 20*time.Millisecond; ; attempts, pause = attempts+1, min(2*pause, 500*time.Millisecond) {
		ok, err := t.s.run(ctx, completeScript, key, args...).Int()
		if err == nil {
			if ok != 1 {
				return idem.ErrLeaseLost
			}
			return nil
		}
		if once || !pauseWithin(ctx, pause) {
			return fmt.Errorf("idemredis: complete (%d attempts): %w", attempts, err)
		}
	}
}

// pauseWithin waits for d, and reports false, at once, when ctx would end
// first.
func pauseWithin(ctx context.Context, d time.Duration) bool {
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
		return false
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
