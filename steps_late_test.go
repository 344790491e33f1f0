package idem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// A handler starts a step in a goroutine and returns (with an error, so
// the key is released) before the step begins. The step must not run its
// effect once the execution has ended: nothing could record it, and the
// retry, which finds no step, would repeat the effect.
func TestStepAfterHandlerReturned(t *testing.T) {
	store := idemmem.NewStore(nil)
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var c charger
	op := idem.Operation{Tenant: "t", Key: "late-step", Fingerprint: []byte("f")}
	returned := make(chan struct{})
	stepDone := make(chan error, 1)
	_, err = engine.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		go func() {
			<-returned
			_, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) { return c.charge(ctx) })
			stepDone <- err
		}()
		return idem.Result{}, errors.New("handler failed")
	})
	if err == nil {
		t.Fatal("Do succeeded, want the handler's error")
	}
	close(returned)
	lateErr := <-stepDone
	if lateErr == nil {
		t.Errorf("Step after the handler returned succeeded, want an error")
	}
	// The retry runs the handler afresh and charges.
	_, err = engine.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		if _, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) { return c.charge(ctx) }); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.n.Load(); n != 1 {
		t.Errorf("the card was charged %d times for one key, want 1 (late step error: %v)", n, lateErr)
	}
}

// A handler leaves a step running in a goroutine and fails. The engine
// must wait for the step before it releases the key: released first, the
// key would lose the step's record, and the retry would charge again.
func TestStepRunningWhenHandlerReturns(t *testing.T) {
	store := idemmem.NewStore(nil)
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var c charger
	op := idem.Operation{Tenant: "t", Key: "running-step", Fingerprint: []byte("f")}
	returning := make(chan struct{})
	doReturned := make(chan struct{})
	stepDone := make(chan error, 1)
	_, err = engine.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		started := make(chan struct{})
		go func() {
			_, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
				close(started)
				<-returning
				// Without the engine waiting for this step, Do returns
				// now; with it, Do waits, and the charge goes on after a
				// pause.
				select {
				case <-doReturned:
				case <-time.After(300 * time.Millisecond):
				}
				return c.charge(ctx)
			})
			stepDone <- err
		}()
		<-started
		close(returning)
		return idem.Result{}, errors.New("handler failed")
	})
	close(doReturned)
	if err == nil {
		t.Fatal("Do succeeded, want the handler's error")
	}
	stepErr := <-stepDone
	_, err = engine.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		if _, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) { return c.charge(ctx) }); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.n.Load(); n != 1 {
		t.Errorf("the card was charged %d times for one key, want 1 (the running step's error: %v)", n, stepErr)
	}
}
