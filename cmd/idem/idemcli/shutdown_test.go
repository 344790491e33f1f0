package idemcli

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/demo"
	"github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
	"github.com/idem-go/idem/internal/testenv"
)

// A request still running when the grace period ends is cancelled, and
// run waits for it to roll back and release its key before closing the
// database: the client's retry finds the key free, not locked for a whole
// lease. The stop is reported as an error, not a clean one.
func TestForcedStopReleasesKeys(t *testing.T) {
	defer func(g time.Duration) { shutdownGrace = g }(shutdownGrace)
	shutdownGrace = 300 * time.Millisecond
	db := postgresDB(t)
	p := serveInProcess(t, serveOpts{db: db, lease: time.Hour, retention: time.Hour})

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
	if _, err := lock.Exec(context.Background(), `LOCK TABLE `+demo.Table+` IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	go demotest.Send(http.DefaultClient, demotest.Req{Method: "POST", URL: "http://" + p.addr + "/orders", Body: demotest.GoodOrder, Key: "held-at-stop"})
	cn, err := openDB(context.Background(), db, openOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	store := testenv.Must(cn.keyStore())
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if rec, err := store.Get(context.Background(), defaultTenant, "held-at-stop"); err == nil && rec.State == idem.StateInFlight {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the request never got in flight:\n%s", p.logs)
		}
	}

	if err := p.wait(t); !errors.Is(err, errForcedStop) {
		t.Fatalf("run = %v, want the forced stop reported", err)
	}
	// run has returned: the release is done, not pending.
	if rec, err := store.Get(context.Background(), defaultTenant, "held-at-stop"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("key after the forced stop: %+v, %v; want it released\n%s", rec, err, p.logs)
	}
	if strings.Contains(p.logs.String(), "msg=stopped") {
		t.Errorf("a forced stop logged a clean one:\n%s", p.logs)
	}
}
