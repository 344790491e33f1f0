package idemhttp

import (
	"context"
	"errors"
	"testing"
)

type valueKey struct{}

type otherKey struct{}

// detached answers as context.WithoutCancel does, ended by its life
// context only, whose cause it reports.
func TestDetachedContext(t *testing.T) {
	errGone := errors.New("client gone")
	errStopping := errors.New("server stopping")
	req, cancelReq := context.WithCancelCause(context.WithValue(context.Background(), valueKey{}, "v"))
	req = context.WithValue(req, otherKey{}, 1) // a middleware's value on top
	life, stop := context.WithCancelCause(context.Background())

	never := &detached{values: req}
	bounded := &detached{values: req, life: life}
	childNever, cancel1 := context.WithCancel(never)
	defer cancel1()
	childBounded, cancel2 := context.WithCancel(bounded)
	defer cancel2()

	cancelReq(errGone)
	for name, ctx := range map[string]context.Context{"detached": never, "bounded": bounded, "child": childNever, "bounded child": childBounded} {
		if ctx.Err() != nil || context.Cause(ctx) != nil {
			t.Errorf("%s after the request ended: Err %v, Cause %v; want nil", name, ctx.Err(), context.Cause(ctx))
		}
		if ctx.Value(valueKey{}) != "v" {
			t.Errorf("%s lost the request's value", name)
		}
	}
	stop(errStopping)
	<-childBounded.Done()
	if context.Cause(childBounded) != errStopping || context.Cause(bounded) != errStopping {
		t.Fatalf("after the shutdown: causes %v and %v, want %v", context.Cause(childBounded), context.Cause(bounded), errStopping)
	}
	if childNever.Err() != nil {
		t.Fatal("a context without life ended")
	}
}
