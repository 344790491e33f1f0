package idemredis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/idem-go/idem"
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
// draws a completion id, so that a resend of this very call by go-redis
// is told apart from a second call (see scripts.go).
func (t tx) Complete(ctx context.Context, p idem.CompleteParams) error {
	if _, known := modeNames[p.Result.Mode.String()]; !known {
		return fmt.Errorf("idemredis: complete: unknown storage mode %d", p.Result.Mode)
	}
	header, err := idem.MarshalHeader(p.Result.Header)
	if err != nil {
		return fmt.Errorf("idemredis: complete: %w", err)
	}
	ok, err := t.s.sendPatiently(ctx, completeScript, t.s.key(p.Tenant, p.Key),
		strconv.FormatInt(p.Token, 10), p.Result.Mode.String(), p.Result.Status,
		header, p.Result.Body, p.Result.Reference,
		strconv.FormatUint(rand.Uint64(), 10)).Int()
	if err != nil {
		return fmt.Errorf("idemredis: complete: %w", err)
	}
	if ok != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}
