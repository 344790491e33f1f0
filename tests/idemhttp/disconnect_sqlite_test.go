package idemhttp_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
	"github.com/idem-go/idem/idemsql"
)

// With CancelOnDisconnect, a client that hangs up cancels its handler; on
// a transactional store its writes roll back and the key is released, so
// the retry runs again. (By default the handler runs on: the conformance
// suite's Disconnect case.)
func TestCancelOnDisconnectSQLite(t *testing.T) {
	e := newSQLiteEnv(t)
	var runs atomic.Int64
	started := make(chan struct{})
	finished := make(chan error, 1)
	client := idemhttptest.Harness{Config: idemhttp.Config{CancelOnDisconnect: true}}.Serve(t, e.engine, idemfronttest.Options{},
		func(ctx context.Context, body []byte) idemfronttest.Response {
			if _, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, string(body)); err != nil {
				t.Errorf("insert: %v", err)
			}
			if runs.Add(1) == 1 {
				close(started)
				<-ctx.Done()
				finished <- ctx.Err()
				return idemfronttest.Response{}
			}
			return idemfronttest.Response{Body: []byte("made")}
		})
	call := idemfronttest.Call{Tenant: testTenant, Key: "k1", Body: []byte("tea")}
	ctx, leave := context.WithCancel(t.Context())
	sent := make(chan error, 1)
	go func() {
		_, err := client.Send(ctx, call)
		sent <- err
	}()
	<-started
	leave()
	if err := <-sent; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client's request: %v, want it cancelled", err)
	}
	if err := <-finished; !errors.Is(err, context.Canceled) {
		t.Fatalf("handler context: %v, want cancelled", err)
	}
	var r idemfronttest.Reply
	for {
		var err error
		if r, err = client.Send(t.Context(), call); err != nil {
			t.Fatal(err)
		}
		if r.Kind != idemfront.InFlight { // the release may come after the client's error
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r.Kind != idemfront.Executed || runs.Load() != 2 || e.orders(t) != 1 {
		t.Fatalf("retry: %s, ran %d times, %d orders; want a fresh run and 1 order", r.Kind, runs.Load(), e.orders(t))
	}
	rec, err := e.store.Get(t.Context(), testTenant, "k1")
	if err != nil || rec.State != idem.StateComplete {
		t.Fatalf("record %+v, %v", rec, err)
	}
}
