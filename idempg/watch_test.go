package idempg_test

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// patience bounds the waits for what must happen; it only runs out on a
// failure.
const patience = 30 * time.Second

// channel returns the notification channel of e's idem_keys table.
func (e *env) channel(t *testing.T) string {
	t.Helper()
	var oid uint32
	if err := e.pool.QueryRow(context.Background(), `SELECT 'idem_keys'::regclass::oid`).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("idem_keys_%d", oid)
}

// listeners counts the connections listening on e's channel.
func (e *env) listeners(t *testing.T) int {
	t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE query = $1`,
		`LISTEN "`+e.channel(t)+`"`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func claimIn(t *testing.T, st *idempg.Store, tenant, key string, lease time.Duration) idem.ClaimParams {
	t.Helper()
	p := idem.ClaimParams{Tenant: tenant, Key: key, Token: time.Now().UnixNano(), Lease: lease, Retention: time.Hour}
	res, err := st.Claim(context.Background(), p)
	if err != nil || !res.Won {
		t.Fatalf("Claim(%q, %q) = %+v, %v; want won", tenant, key, res, err)
	}
	return p
}

func completeIn(t *testing.T, st *idempg.Store, p idem.ClaimParams) {
	t.Helper()
	ctx := context.Background()
	u, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Rollback(ctx) //nolint:errcheck // harmless after Complete
	if err := u.Complete(ctx, idem.CompleteParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token, Result: idem.Result{Status: 201}}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
}

func watch(t *testing.T, st *idempg.Store, tenant, key string) (<-chan struct{}, func()) {
	t.Helper()
	changed, stop, err := st.Watch(context.Background(), tenant, key)
	if err != nil {
		t.Fatalf("Watch(%q, %q): %v", tenant, key, err)
	}
	return changed, stop
}

func mustClose(t *testing.T, changed <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-changed:
	case <-time.After(patience):
		t.Fatalf("%s: Watch's channel still open", what)
	}
}

// Another process's completion and release reach the waiters of this
// one: the notifications go through the database. So does a release that
// keeps the record, its lease ended, for its recovery points.
func TestWatchAcrossStores(t *testing.T) {
	e := newEnv(t, 4)
	ctx := context.Background()

	p := claimIn(t, e.other, "t", "completed", time.Hour)
	changed, stop := watch(t, e.store, p.Tenant, p.Key)
	defer stop()
	completeIn(t, e.other, p)
	mustClose(t, changed, "completed by the other store")

	p = claimIn(t, e.other, "t", "released", time.Hour)
	changed, stop = watch(t, e.store, p.Tenant, p.Key)
	defer stop()
	if err := e.other.Release(ctx, idem.ReleaseParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token}); err != nil {
		t.Fatal(err)
	}
	mustClose(t, changed, "released by the other store")

	p = claimIn(t, e.other, "t", "released-with-steps", time.Hour)
	if err := e.other.SaveStep(ctx, idem.SaveStepParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token, Name: "charge", Value: []byte("ch_1")}); err != nil {
		t.Fatal(err)
	}
	changed, stop = watch(t, e.store, p.Tenant, p.Key)
	defer stop()
	if err := e.other.Release(ctx, idem.ReleaseParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token}); err != nil {
		t.Fatal(err)
	}
	if rec, err := e.store.Get(ctx, p.Tenant, p.Key); err != nil || rec.State != idem.StateInFlight {
		t.Fatalf("record released with steps = %+v, %v; want kept in flight", rec, err)
	}
	mustClose(t, changed, "released with its steps (lease ended) by the other store")
}

// Only records somebody waits for notify, and only when they change in a
// way a waiter cares about: an execution nobody waits for never calls
// pg_notify (whose commit queues on a global lock), and a heartbeat wakes
// nobody. Notifications arrive in commit order, so a sentinel sent after
// the statements under test comes first exactly when they sent nothing.
func TestWatchNotifiesOnlyWaitedChanges(t *testing.T) {
	e := newEnv(t, 4)
	ctx := context.Background()
	raw, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(ctx)
	channel := e.channel(t)
	if _, err := raw.Exec(ctx, `LISTEN "`+channel+`"`); err != nil {
		t.Fatal(err)
	}
	sentinel := 0
	next := func(what string) string {
		t.Helper()
		sentinel++
		mark := fmt.Sprint("sentinel-", sentinel)
		if _, err := e.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, mark); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, patience)
		defer cancel()
		n, err := raw.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("%s: no notification: %v", what, err)
		}
		if n.Payload != mark {
			// Read up to the sentinel, so that the next check starts clean.
			for n.Payload != mark {
				if n, err = raw.WaitForNotification(wctx); err != nil {
					t.Fatal(err)
				}
			}
			return "another notification before the sentinel"
		}
		return mark
	}
	noNotification := func(what string) {
		t.Helper()
		if got := next(what); !strings.HasPrefix(got, "sentinel-") {
			t.Errorf("%s: %s; want none", what, got)
		}
	}

	// Nobody waits: claim, heartbeat, complete; claim, release.
	p := claimIn(t, e.store, "t", "unwaited", time.Hour)
	if err := e.store.Extend(ctx, idem.ExtendParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	completeIn(t, e.store, p)
	p = claimIn(t, e.store, "t", "unwaited-released", time.Hour)
	if err := e.store.Release(ctx, idem.ReleaseParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token}); err != nil {
		t.Fatal(err)
	}
	noNotification("executions nobody waits for")

	// Waited on: a heartbeat says nothing, the completion does.
	p = claimIn(t, e.store, "t", "waited", time.Hour)
	changed, stop := watch(t, e.other, p.Tenant, p.Key)
	defer stop()
	if err := e.store.Extend(ctx, idem.ExtendParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token, Lease: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	noNotification("a heartbeat of a record waited on")
	completeIn(t, e.store, p)
	wctx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	n, err := raw.WaitForNotification(wctx)
	if err != nil {
		t.Fatalf("completion of a record waited on: no notification: %v", err)
	}
	checkToken(t, e.pool, n.Payload, p.Tenant, p.Key)
	mustClose(t, changed, "completion of a record waited on")

	// Waited on, released: the release notifies.
	p = claimIn(t, e.store, "t", "waited-released", time.Hour)
	changed, stop = watch(t, e.other, p.Tenant, p.Key)
	defer stop()
	if err := e.store.Release(ctx, idem.ReleaseParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token}); err != nil {
		t.Fatal(err)
	}
	if n, err = raw.WaitForNotification(wctx); err != nil {
		t.Fatalf("release of a record waited on: no notification: %v", err)
	}
	checkToken(t, e.pool, n.Payload, p.Tenant, p.Key)
	mustClose(t, changed, "release of a record waited on")
}

// checkToken fails the test unless payload is the opaque token of
// (tenant, key) of migration 0005, which names neither: the keyed hash
// the database computes, holding neither the key nor the md5 of the
// tenant that the notifications carried before.
func checkToken(t *testing.T, pool *pgxpool.Pool, payload, tenant, key string) {
	t.Helper()
	var want string
	if err := pool.QueryRow(context.Background(), `SELECT idem_notify_token($1, $2)`, tenant, key).Scan(&want); err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum([]byte(tenant))
	if payload != want || len(payload) != 64 || strings.Contains(payload, key) || strings.Contains(payload, hex.EncodeToString(sum[:])) {
		t.Errorf("notification payload %q; want the opaque token %q, holding neither the key %q nor the tenant's md5", payload, want, key)
	}
}

// A thousand duplicates waiting on one key, in four engines over one
// Store, cost one listening connection; so do a thousand Watch calls on
// a thousand keys.
func TestWatchThousandWaitersOneConnection(t *testing.T) {
	const waiters, engines = 1000, 4
	e := newEnv(t, 8)
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var es []*idem.Engine
	for range engines {
		eng, err := idem.NewEngine(e.store, &idem.Config{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = eng.Close(ctx) })
		es = append(es, eng)
	}
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), WaitInFlight: time.Minute}
	running, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := es[0].Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			close(running)
			<-release
			return idem.Result{Status: 201, Body: []byte("first")}, insertOrder(ctx, "first")
		})
		first <- err
	}()
	<-running

	var ran, replayed atomic.Int32
	var failures atomic.Pointer[error]
	all := make(chan struct{})
	go func() {
		defer close(all)
		atonce.Run(waiters, func(i int) {
			out, err := es[i%engines].Do(ctx, op, func(context.Context) (idem.Result, error) {
				ran.Add(1)
				return idem.Result{}, errors.New("a duplicate ran")
			})
			switch {
			case err != nil:
				failures.Store(&err)
			case out.Replayed && string(out.Result.Body) == "first":
				replayed.Add(1)
			}
		})
	}()
	// The waiters' pollers watch once the first of each engine waits.
	deadline := time.Now().Add(patience)
	for e.listeners(t) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("nobody listens while duplicates wait")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the rest of the waiters arrive
	if n := e.listeners(t); n != 1 {
		t.Errorf("%d connections listen while %d duplicates wait in %d engines over one Store, want 1", n, waiters, engines)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first execution: %v", err)
	}
	<-all
	if p := failures.Load(); p != nil {
		t.Fatalf("a duplicate failed: %v", *p)
	}
	if ran.Load() != 0 || replayed.Load() != waiters {
		t.Fatalf("%d duplicates ran, %d replayed; want 0 and %d", ran.Load(), replayed.Load(), waiters)
	}
	if n := e.countOrders(t, "first"); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}

	var stops []func()
	for i := range waiters {
		p := claimIn(t, e.store, "t", fmt.Sprint("many-", i), time.Hour)
		_, stop := watch(t, e.store, p.Tenant, p.Key)
		stops = append(stops, stop)
	}
	if n := e.listeners(t); n != 1 {
		t.Errorf("%d connections listen for %d Watch calls on one Store, want 1", n, waiters)
	}
	for _, stop := range stops {
		stop()
	}
	if n := idempg.ListenSessions(e.store); n != 1 {
		t.Errorf("the Store started %d listening sessions, want 1", n)
	}
}

// When the listening connection is lost, the subscribers are told (the
// notifications sent meanwhile are lost with it), and Watch works again
// once the Store has connected again.
func TestWatchReconnects(t *testing.T) {
	e := newEnv(t, 4)
	ctx := context.Background()
	p := claimIn(t, e.other, "t", "k", time.Hour)
	changed, stop := watch(t, e.store, p.Tenant, p.Key)
	defer stop()
	var killed int
	if err := e.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = $1`,
		`LISTEN "`+e.channel(t)+`"`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listening connections (%v), want 1", killed, err)
	}
	mustClose(t, changed, "the listening connection was lost")

	deadline := time.Now().Add(patience)
	for {
		changed, stop, err := e.store.Watch(ctx, p.Tenant, p.Key)
		if err == nil {
			defer stop()
			completeIn(t, e.other, p)
			mustClose(t, changed, "completed after the reconnection")
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Watch still fails long after the connection was lost: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The listening connection is given back once nobody watches.
func TestWatchConnectionEndsWhenIdle(t *testing.T) {
	e := newEnv(t, 4)
	idempg.SetListenLinger(e.store, 50*time.Millisecond)
	p := claimIn(t, e.store, "t", "k", time.Hour)
	_, stop := watch(t, e.store, p.Tenant, p.Key)
	if n := e.listeners(t); n != 1 {
		t.Fatalf("%d connections listen while a Watch runs, want 1", n)
	}
	stop()
	deadline := time.Now().Add(patience)
	for e.listeners(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the listening connection is still open long after the last Watch stopped")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// migratedUpTo returns a pool on a fresh schema migrated with the files
// before version stop.
func migratedUpTo(t *testing.T, stop string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool := newPool(t, testenv.PostgresSchema(t), 4)
	files := idemmigrate.Files(idemmigrate.Postgres)
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if strings.HasPrefix(name, stop) {
			break
		}
		sql, err := fs.ReadFile(files, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, string(sql)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return pool
}

// On a schema migrated up to 0004 (an upgrade deployed before Migrate
// ran), waiters are still woken, by the payload that schema's completion
// sends, and the release, whose token function is missing, still
// releases and notifies.
func TestWatchBeforeNotifyToken(t *testing.T) {
	ctx := context.Background()
	pool := migratedUpTo(t, "0005")
	st := testenv.Must(idempg.NewStore(pool, nil))
	p := claimIn(t, st, "t", "completed", time.Hour)
	changed, stop := watch(t, st, p.Tenant, p.Key)
	defer stop()
	completeIn(t, st, p)
	mustClose(t, changed, "completion on a schema without migration 0005")

	p = claimIn(t, st, "t", "released", time.Hour)
	changed, stop = watch(t, st, p.Tenant, p.Key)
	defer stop()
	if err := st.Release(ctx, idem.ReleaseParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token}); err != nil {
		t.Fatalf("Release on a schema without migration 0005: %v", err)
	}
	mustClose(t, changed, "release on a schema without migration 0005")
	if _, err := st.Get(ctx, p.Tenant, p.Key); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the released record: %v, want idem.ErrNotFound", err)
	}
}

// On a schema without migration 0004 Watch says what to do.
func TestWatchWithoutMigration(t *testing.T) {
	ctx := context.Background()
	pool := migratedUpTo(t, "0004")
	st := testenv.Must(idempg.NewStore(pool, nil))
	p := claimIn(t, st, "t", "k", time.Hour)
	if _, _, err := st.Watch(ctx, p.Tenant, p.Key); err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Watch without the waiters column = %v, want an error saying to run Migrate", err)
	}
}
