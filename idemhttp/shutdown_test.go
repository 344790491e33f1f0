package idemhttp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
)

// ShutdownContext ends the handlers that run on after their client left
// (the conformance suite's Disconnect case shows that they run on), with
// the shutdown's cause.
func TestShutdownContextEndsDetachedHandlers(t *testing.T) {
	e := newEnv(t, nil)
	shutdown, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	errStopping := errors.New("server stopping")
	started, giveUp := make(chan struct{}), make(chan struct{})
	ended := make(chan error, 1)
	client := idemhttptest.Harness{Config: idemhttp.Config{ShutdownContext: shutdown}}.Serve(t, e.engine, idemfronttest.Options{},
		func(ctx context.Context, _ []byte) idemfronttest.Response {
			close(started)
			select {
			case <-ctx.Done():
				ended <- context.Cause(ctx)
			case <-giveUp: // the test failed: let the server close
			}
			return idemfronttest.Response{}
		})
	t.Cleanup(func() { close(giveUp) }) // before the server's Close, which waits for the handler
	ctx, leave := context.WithCancel(t.Context())
	sent := make(chan error, 1)
	go func() {
		_, err := client.Send(ctx, idemfronttest.Call{Tenant: testTenant, Key: "k1", Body: []byte("tea")})
		sent <- err
	}()
	<-started
	leave()
	if err := <-sent; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client's request: %v, want it cancelled", err)
	}
	select {
	case err := <-ended:
		t.Fatalf("the handler's context ended with its client (%v), before the shutdown", err)
	default:
	}
	stop(errStopping)
	select {
	case err := <-ended:
		if !errors.Is(err, errStopping) {
			t.Fatalf("the handler's context ended with %v, want the shutdown's cause", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the shutdown did not end the handler's context")
	}
}
