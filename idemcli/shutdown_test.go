package idemcli

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

// syncBuffer is a log sink the test reads while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A request still running when the grace period ends is cancelled, and
// Run waits for it to roll back and release its key before closing the
// database: the client's retry finds the key free, not locked for a whole
// lease. The stop is reported as an error, not a clean one.
func TestForcedStopReleasesKeys(t *testing.T) {
	defer func(g time.Duration) { shutdownGrace = g }(shutdownGrace)
	shutdownGrace = 300 * time.Millisecond
	db := postgresDB(t)
	logs := &syncBuffer{}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() {
		s := &Serve{CommandBase{Logger: slog.New(slog.NewTextHandler(logs, nil))}}
		done <- s.Run(ctx, &ServeOpts{Addr: "127.0.0.1:0", DB: db, Lease: time.Hour, Retention: time.Hour, PurgeInterval: 0})
	}()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == ""; time.Sleep(10 * time.Millisecond) {
		if m := regexp.MustCompile(`msg=listening addr=(\S+)`).FindStringSubmatch(logs.String()); m != nil {
			addr = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("never listening:\n%s", logs)
		}
	}

	// The order's insert waits on a lock the test holds: the request is
	// in flight, its key claimed, when the shutdown comes.
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	lock, err := conn.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background()) //nolint:errcheck
	if _, err := lock.Exec(context.Background(), `LOCK TABLE `+ordersTable+` IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/orders", strings.NewReader(goodOrder))
		req.Header.Set("Idempotency-Key", "held-at-stop")
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	cn, err := openDB(context.Background(), db, openOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	store := cn.keyStore()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if rec, err := store.Get(context.Background(), DefaultTenant, "held-at-stop"); err == nil && rec.State == idem.StateInFlight {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the request never got in flight:\n%s", logs)
		}
	}

	stop()
	select {
	case err := <-done:
		if !errors.Is(err, errForcedStop) {
			t.Fatalf("Run = %v, want the forced stop reported", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Run did not return:\n%s", logs)
	}
	// Run has returned: the release is done, not pending.
	if rec, err := store.Get(context.Background(), DefaultTenant, "held-at-stop"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("key after the forced stop: %+v, %v; want it released\n%s", rec, err, logs)
	}
}
