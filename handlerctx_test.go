package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

type handlerCtxKey struct{}

// TestHandlerContext checks the context the handler runs under: the
// caller's values and deadline, the execution, and its end (cancelled
// once Do returns, for a goroutine that outlives the handler), keeping
// the first cause it was ended with.
func TestHandlerContext(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	errParent := errors.New("parent gone")

	t.Run("running, then returned", func(t *testing.T) {
		e := newEngine(t, idemmem.NewStore(nil), &idem.Config{Logger: quiet})
		deadline := time.Now().Add(time.Hour)
		parent, cancel := context.WithDeadline(context.WithValue(context.Background(), handlerCtxKey{}, "v"), deadline)
		defer cancel()
		var kept context.Context
		_, err := e.Do(parent, idem.Operation{Key: "k"}, func(ctx context.Context) (idem.Result, error) {
			kept = ctx
			if ctx.Err() != nil || context.Cause(ctx) != nil || ctx.Value(handlerCtxKey{}) != "v" {
				t.Errorf("running: err %v, cause %v, value %v", ctx.Err(), context.Cause(ctx), ctx.Value(handlerCtxKey{}))
			}
			if d, ok := ctx.Deadline(); !ok || !d.Equal(deadline) {
				t.Errorf("running: deadline %v %v, want the caller's %v", d, ok, deadline)
			}
			if x, ok := idem.ExecutionFromContext(ctx); !ok || x.Key != "k" {
				t.Errorf("running: execution %+v, %v", x, ok)
			}
			return idem.Result{Status: 201}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(kept.Err(), context.Canceled) || !errors.Is(context.Cause(kept), context.Canceled) {
			t.Fatalf("after Do: err %v, cause %v", kept.Err(), context.Cause(kept))
		}
		select {
		case <-kept.Done():
		default:
			t.Fatal("Done not closed after Do returned")
		}
		if kept.Value(handlerCtxKey{}) != "v" {
			t.Fatal("the caller's value lost after Do returned")
		}
		if _, ok := idem.ExecutionFromContext(kept); !ok {
			t.Fatal("the execution lost after Do returned")
		}
	})

	t.Run("parent cancelled", func(t *testing.T) {
		e := newEngine(t, idemmem.NewStore(nil), &idem.Config{Logger: quiet})
		parent, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		var kept context.Context
		_, _ = e.Do(parent, idem.Operation{Key: "k"}, func(ctx context.Context) (idem.Result, error) {
			kept = ctx
			cancel(errParent)
			<-ctx.Done()
			if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), errParent) {
				t.Errorf("running: err %v, cause %v", ctx.Err(), context.Cause(ctx))
			}
			return idem.Result{}, ctx.Err()
		})
		if !errors.Is(context.Cause(kept), errParent) {
			t.Fatalf("the end of the handler replaced the cause: %v", context.Cause(kept))
		}
	})

	t.Run("lease lost", func(t *testing.T) {
		var skew atomic.Int64
		store := idemmem.NewStore(&idemmem.Config{NowFunc: func() time.Time {
			return time.Now().Add(time.Duration(skew.Load()))
		}})
		e := newEngine(t, store, &idem.Config{Lease: time.Minute, Heartbeat: 20 * time.Millisecond, Logger: quiet})
		op := idem.Operation{Key: "k"}
		started := make(chan struct{})
		var kept context.Context
		done := make(chan error, 1)
		go func() {
			_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
				kept = ctx
				derived, stop := context.WithTimeout(ctx, time.Hour)
				defer stop()
				fired := make(chan struct{})
				context.AfterFunc(ctx, func() { close(fired) })
				close(started)
				select {
				case <-fired:
				case <-time.After(30 * time.Second):
					t.Error("AfterFunc did not run after the lease was lost")
				}
				<-derived.Done()
				if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) ||
					!errors.Is(context.Cause(derived), idem.ErrLeaseLost) {
					t.Errorf("after the loss: err %v, cause %v, derived cause %v", ctx.Err(), context.Cause(ctx), context.Cause(derived))
				}
				return idem.Result{}, ctx.Err()
			})
			done <- err
		}()
		<-started
		skew.Store(int64(2 * time.Minute))
		if _, err := e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
			return idem.Result{Status: 202}, nil
		}); err != nil {
			t.Fatalf("takeover: %v", err)
		}
		if err := <-done; !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("Do whose lease was taken = %v, want idem.ErrLeaseLost", err)
		}
		if !errors.Is(context.Cause(kept), idem.ErrLeaseLost) {
			t.Fatalf("the end of the handler replaced the cause: %v", context.Cause(kept))
		}
	})
}
