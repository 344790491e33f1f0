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

// blockingExtends is a memory store whose extensions wait for a signal.
type blockingExtends struct {
	*idemmem.Store
	calls   atomic.Int32
	entered chan struct{} // receives one value per Extend call
	release chan struct{} // closed to let the extensions through
}

func (s *blockingExtends) Extend(ctx context.Context, p idem.ExtendParams) error {
	s.calls.Add(1)
	s.entered <- struct{}{}
	<-s.release
	return s.Store.Extend(context.WithoutCancel(ctx), p)
}

// Close, once it gives up on an execution still running, stops its
// heartbeat: it waits for the extension under way, and no other starts.
func TestCloseStopsHeartbeat(t *testing.T) {
	const heartbeat = 20 * time.Millisecond
	store := &blockingExtends{Store: idemmem.NewStore(nil), entered: make(chan struct{}, 16), release: make(chan struct{})}
	e := newEngine(t, store, &idem.Config{Lease: time.Minute, Heartbeat: heartbeat, Logger: slog.New(slog.DiscardHandler)})
	handlerDone := make(chan struct{})
	doDone := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), idem.Operation{Key: "k"}, func(ctx context.Context) (idem.Result, error) {
			<-handlerDone
			return idem.Result{Status: 201}, nil
		})
		doDone <- err
	}()
	<-store.entered // an extension is under way

	gaveUp, cancel := context.WithCancel(context.Background())
	cancel()
	closed := make(chan error, 1)
	go func() { closed <- e.Close(gaveUp) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while an extension was under way", err)
	case <-time.After(20 * heartbeat):
	}
	close(store.release)
	if err := <-closed; !errors.Is(err, context.Canceled) {
		t.Fatalf("Close = %v, want its context's error", err)
	}
	calls := store.calls.Load()
	time.Sleep(20 * heartbeat)
	if n := store.calls.Load(); n != calls {
		t.Errorf("%d extensions after Close, want none", n-calls)
	}
	close(handlerDone)
	if err := <-doDone; err != nil {
		t.Fatalf("Do = %v", err)
	}
}
