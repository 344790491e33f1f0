package inboxtest

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/internal/tcpproxy"
	"github.com/idem-go/idem/internal/testenv"
)

// Outage is a backend whose store a test can take down and bring back.
type Outage struct {
	*Backend
	// Down makes the store unreachable: the private redis-server killed,
	// or the proxy in front of PostgreSQL cut.
	Down func()
	// Up brings it back, and returns once it answers.
	Up func()
	// FailedClaims counts the claims (and reads) that failed, on every
	// store the backend opened: each is a moment the inbox met the store
	// down.
	FailedClaims atomic.Int64
}

// Outages runs fn as a subtest on each store that can be taken down: a
// private redis-server (no transactions; its effects are kept in memory),
// and PostgreSQL behind a proxy of the test's.
func Outages(t *testing.T, fn func(t *testing.T, o *Outage)) {
	for i, open := range []func(testing.TB) *Outage{RedisOutage, PostgresOutage} {
		t.Run([...]string{"redis", "postgres"}[i], func(t *testing.T) { fn(t, open(t)) })
	}
}

// Redis returns a backend on the shared Redis, under a key prefix of its
// own (no transactions; its effects are kept in memory).
func Redis(t testing.TB) *Backend {
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	mem := Mem(t)
	prefix := testenv.Name()
	return &Backend{
		Name: "redis",
		NewStore: func(t testing.TB) idem.Store {
			client := redis.NewClient(opts)
			t.Cleanup(func() { client.Close() })
			store, err := idemredis.NewStore(client, &idemredis.Config{Prefix: prefix})
			if err != nil {
				t.Fatalf("idemredis: %v", err)
			}
			return store
		},
		Insert: mem.Insert,
		Rows:   mem.Rows,
	}
}

// RedisOutage returns a backend over a private redis-server, which Down
// kills and Up starts again on the same data.
func RedisOutage(t testing.TB) *Outage {
	quietRedis.Do(func() { redis.SetLogger(discardLogger{}) })
	srv := StartRedis(t)
	o := &Outage{Down: srv.Kill, Up: srv.Start}
	mem := Mem(t)
	prefix := testenv.Name()
	o.Backend = &Backend{
		Name: "redis",
		NewStore: func(t testing.TB) idem.Store {
			// No retries inside the client: each failed call is one the
			// inbox sees, and the outage is counted in them.
			client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1})
			t.Cleanup(func() { client.Close() })
			store, err := idemredis.NewStore(client, &idemredis.Config{Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatalf("idemredis: %v", err)
			}
			return &countingStore{Store: store, failed: &o.FailedClaims}
		},
		Insert: mem.Insert,
		Rows:   mem.Rows,
	}
	return o
}

// PostgresOutage returns a backend on a fresh PostgreSQL schema whose
// stores connect through a proxy, which Down cuts (every connection
// dropped, new ones refused) and Up restores. The test reads its effects
// around the proxy.
func PostgresOutage(t testing.TB) *Outage {
	direct := testenv.PostgresSchema(t)
	b := postgresAt(t, direct, true)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := tcpproxy.NewProxy(u.Host)
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr()
	o := &Outage{Backend: b, Down: proxy.Cut, Up: proxy.Restore}
	b.NewStore = func(t testing.TB) idem.Store {
		pool, err := pgxpool.New(context.Background(), u.String())
		if err != nil {
			t.Fatalf("pgxpool: %v", err)
		}
		t.Cleanup(pool.Close)
		return &countingStore{Store: must(idempg.NewStore(pool, nil)), failed: &o.FailedClaims}
	}
	return o
}

// countingStore counts the claims and reads that fail.
type countingStore struct {
	idem.Store
	failed *atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	r, err := s.Store.Claim(ctx, p)
	if err != nil {
		s.failed.Add(1)
	}
	return r, err
}

func (s *countingStore) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	r, err := s.Store.Get(ctx, tenant, key)
	if err != nil && !errors.Is(err, idem.ErrNotFound) {
		s.failed.Add(1)
	}
	return r, err
}

// quietRedis silences go-redis, which logs every failed dial of an outage.
var quietRedis sync.Once

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}
