package idem

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// TestLeaseCtx checks that the lazily made handler context answers as
// context.WithCancelCause(parent) would, whichever call makes it.
func TestLeaseCtx(t *testing.T) {
	parentOf := func() (context.Context, context.CancelCauseFunc) {
		return context.WithCancelCause(context.WithValue(context.Background(), ctxKey{}, "v"))
	}
	errParent := errors.New("parent gone")

	t.Run("untouched", func(t *testing.T) {
		parent, cancel := parentOf()
		defer cancel(nil)
		c := newRunCtx(parent)
		if c.Err() != nil || context.Cause(c) != nil || c.Value(ctxKey{}) != "v" {
			t.Fatalf("live context: err %v, cause %v, value %v", c.Err(), context.Cause(c), c.Value(ctxKey{}))
		}
		if c.inner.Load() != nil {
			t.Fatal("Err, Value and Cause made the cancellable context")
		}
		c.end()
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(context.Cause(c), context.Canceled) {
			t.Fatalf("after end: err %v, cause %v", c.Err(), context.Cause(c))
		}
		select {
		case <-c.Done():
		default:
			t.Fatal("Done not closed after end")
		}
		if c.Value(ctxKey{}) != "v" {
			t.Fatal("value lost after end")
		}
	})

	t.Run("lost", func(t *testing.T) {
		parent, cancel := parentOf()
		defer cancel(nil)
		c := newRunCtx(parent)
		derived, stop := context.WithTimeout(c, time.Hour)
		defer stop()
		fired := make(chan struct{})
		context.AfterFunc(c, func() { close(fired) })
		c.lose(ErrLeaseLost)
		<-fired
		<-derived.Done()
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(context.Cause(c), ErrLeaseLost) ||
			!errors.Is(context.Cause(derived), ErrLeaseLost) {
			t.Fatalf("after loss: err %v, cause %v, derived cause %v", c.Err(), context.Cause(c), context.Cause(derived))
		}
		c.end()
		if !errors.Is(context.Cause(c), ErrLeaseLost) {
			t.Fatalf("end replaced the cause: %v", context.Cause(c))
		}
	})

	t.Run("parent cancelled", func(t *testing.T) {
		for _, watched := range []bool{false, true} {
			parent, cancel := parentOf()
			c := newRunCtx(parent)
			if watched {
				c.Done()
			}
			cancel(errParent)
			if watched {
				<-c.Done()
			}
			if !errors.Is(c.Err(), context.Canceled) || !errors.Is(context.Cause(c), errParent) {
				t.Fatalf("watched %v: err %v, cause %v", watched, c.Err(), context.Cause(c))
			}
			c.end()
			if !errors.Is(context.Cause(c), errParent) {
				t.Fatalf("watched %v: end replaced the cause: %v", watched, context.Cause(c))
			}
		}
	})

	t.Run("deadline", func(t *testing.T) {
		deadline := time.Now().Add(time.Hour)
		parent, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		c := newRunCtx(parent)
		if d, ok := c.Deadline(); !ok || !d.Equal(deadline) {
			t.Fatalf("deadline %v %v", d, ok)
		}
		c.end()
	})
}
