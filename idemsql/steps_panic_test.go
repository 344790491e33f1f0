package idemsql_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// unencodable is a step result encoding/json refuses: the step's effect
// happens and its record cannot be written.
type unencodable struct{ C chan int }

// TestStepNotSavedThenHandlerDies: a step ran and was not recorded, then
// the handler panics or ends its goroutine instead of returning the
// error. The key must stay held until its lease ends, as it does when the
// handler returns: released, the retry would repeat the effect at once.
func TestStepNotSavedThenHandlerDies(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		for _, how := range []string{"panic", "goexit"} {
			t.Run(how, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				engine := newEngine(t, env.store, nil)
				op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1", Fingerprint: []byte("POST /pay")}
				var runs atomic.Int32
				handler := func(ctx context.Context) (idem.Result, error) {
					_, err := idem.Step(ctx, "charge", func(context.Context) (unencodable, error) {
						runs.Add(1)
						return unencodable{}, nil
					})
					if !errors.Is(err, idem.ErrStepNotSaved) {
						t.Errorf("Step = %v, want idem.ErrStepNotSaved", err)
					}
					if how == "panic" {
						panic("the handler trips over the step's error")
					}
					runtime.Goexit()
					return idem.Result{}, nil
				}
				done := make(chan struct{})
				var doErr error
				go func() {
					defer close(done) // Goexit ends this goroutine inside Do
					_, doErr = engine.Do(ctx, op, handler)
				}()
				<-done
				if how == "panic" && doErr == nil {
					t.Fatal("Do after a panic returned no error")
				}
				_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
					runs.Add(1)
					return idem.Result{Status: 201}, nil
				})
				if !errors.Is(err, idem.ErrInFlight) {
					t.Errorf("retry at once = %v, want idem.ErrInFlight (the key held until its lease ends)", err)
				}
				if n := runs.Load(); n != 1 {
					t.Errorf("the handler's effect ran %d times, want once", n)
				}
			})
		}
	})
}
