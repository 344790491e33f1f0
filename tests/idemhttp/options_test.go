package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/internal/atonce"
)

// optionsHarness serves the suite through a route derived with
// Middleware.With onto an engine of its own over the same store, under
// the canonical-JSON fingerprint: a route's policy changes who serves it,
// never the contract.
var optionsHarness = idemhttptest.Harness{
	Config: idemhttp.Config{CanonicalJSON: true, IgnoreJSON: []string{"/sent_at"}},
	Server: func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler {
		base, err := idemhttp.NewMiddleware(engine, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ec := engine.Config()
		own, err := idem.NewEngine(engine.Store(), &ec)
		if err != nil {
			t.Fatal(err)
		}
		p := base.Policy()
		p.Engine = own
		route, err := base.With(p)
		if err != nil {
			t.Fatal(err)
		}
		return route.Handler(protected)
	},
}

func TestConformanceOptionsSQLite(t *testing.T) {
	idemfronttest.Exercise(t, optionsHarness, idemfronttest.Features{}, func(t *testing.T) *idemfronttest.Store {
		e := newSQLiteEnv(t)
		return &idemfronttest.Store{
			Store: e.store,
			BusinessWrite: func(ctx context.Context, id string) error {
				_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, id)
				return err
			},
			BusinessCount: func(ctx context.Context, id string) (n int, err error) {
				err = e.db.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE item = ?`, id).Scan(&n)
				return n, err
			},
		}
	})
}

func TestConformanceOptionsPostgres(t *testing.T) {
	pg := newPGEnv(t)
	idemfronttest.Exercise(t, optionsHarness, idemfronttest.Features{}, func(*testing.T) *idemfronttest.Store {
		return &idemfronttest.Store{
			Store: pg.store,
			BusinessWrite: func(ctx context.Context, id string) error {
				_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (item) VALUES ($1)`, id)
				return err
			},
			BusinessCount: func(ctx context.Context, id string) (n int, err error) {
				err = pg.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE item = $1`, id).Scan(&n)
				return n, err
			},
		}
	})
}

// TestPostgresPolicyLeaseAtOneBarrier: on PostgreSQL (leases on the
// server's clock), a route whose policy runs it on an engine with a
// 300ms lease (heartbeat off) is taken over by exactly one of the
// duplicates released together once its stalled first execution's lease
// has run out; the first execution is then refused and its order rolled
// back. On the middleware's own route (the default lease) the same
// duplicates, released as late, all get 409.
func TestPostgresPolicyLeaseAtOneBarrier(t *testing.T) {
	const n = 6
	e := newPGEnv(t)
	engine, err := idem.NewEngine(e.store, &idem.Config{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	short, err := idem.NewEngine(e.store, &idem.Config{Lease: 300 * time.Millisecond, Heartbeat: -1, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	base, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{TenantFunc: tenantOf, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	p := base.Policy()
	p.Engine = short
	route, err := base.With(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		mw        *idemhttp.Middleware
		key       string
		lease     time.Duration
		takeovers int64
	}{
		{"default lease", base, "k-base", idem.DefaultLease, 0},
		{"per-route lease", route, "k-route", 300 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs, takeovers atomic.Int64
			release := make(chan struct{})
			h := tc.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					pgInsert(t, r, tc.key+"-first")
					<-release
					w.WriteHeader(http.StatusCreated)
					return
				}
				if !idemhttp.FirstExecution(r.Context()) {
					takeovers.Add(1)
				}
				pgInsert(t, r, tc.key+"-takeover")
				w.WriteHeader(http.StatusCreated)
			}))
			first := make(chan *httptest.ResponseRecorder)
			go func() { first <- serve(h, request(http.MethodPost, "/orders", tc.key, "a")) }()
			waitFor(t, "the first execution", func() bool { return runs.Load() == 1 })
			// Past the short lease on the server's clock: both routes'
			// duplicates are released as late.
			waitFor(t, "the short lease to run out", func() bool {
				var past bool
				err := e.pool.QueryRow(t.Context(), `SELECT now() > $1::timestamptz + interval '300 milliseconds'`, claimedAt(t, e, tc.key, tc.lease)).Scan(&past)
				return err == nil && past
			})
			answers := make([]*httptest.ResponseRecorder, n)
			atonce.Run(n, func(i int) { answers[i] = serve(h, request(http.MethodPost, "/orders", tc.key, "a")) })
			close(release)
			w1 := <-first
			if got := takeovers.Load(); got != tc.takeovers || runs.Load() != 1+tc.takeovers {
				t.Fatalf("%d runs, %d takeovers; want %d, %d", runs.Load(), got, 1+tc.takeovers, tc.takeovers)
			}
			var fresh int64
			for i, w := range answers {
				switch {
				case w.Code == http.StatusCreated && w.Header().Get(idemhttp.HeaderReplayed) == "true":
				case w.Code == http.StatusCreated:
					fresh++
				case w.Code == http.StatusConflict:
					wantProblem(t, w, http.StatusConflict, "in-flight")
				default:
					t.Fatalf("answer %d: %d %s", i, w.Code, w.Body)
				}
			}
			if fresh != tc.takeovers {
				t.Fatalf("%d fresh answers among the duplicates, want %d", fresh, tc.takeovers)
			}
			if tc.takeovers == 1 {
				wantProblem(t, w1, http.StatusConflict, "lease-lost")
			} else if w1.Code != http.StatusCreated {
				t.Fatalf("first execution: %d, want 201", w1.Code)
			}
		})
	}
	// The refused first execution's order was rolled back.
	want := map[string]bool{"k-base-first": true, "k-route-takeover": true}
	items := e.items(t)
	if len(items) != len(want) {
		t.Fatalf("orders %q, want %v", items, want)
	}
	for _, it := range items {
		if !want[it] {
			t.Fatalf("orders %q, want %v", items, want)
		}
	}
}

// claimedAt is when the key's lease began, on the server's clock: its
// end less its length. The heartbeat may have moved it later since,
// which only makes the wait longer.
func claimedAt(t *testing.T, e *pgEnv, key string, lease time.Duration) time.Time {
	t.Helper()
	rec, err := e.store.Get(t.Context(), testTenant, key)
	if err != nil {
		t.Fatal(err)
	}
	return rec.LockedUntil.Add(-lease)
}

// waitFor polls cond until it holds or the test's patience runs out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
