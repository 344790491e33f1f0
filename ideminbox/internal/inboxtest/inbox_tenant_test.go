package inboxtest_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
)

// An HTTP tenant named like a consumer, on the engine and store the inbox
// shares, uses a key named like a message id. Neither touches the other:
// the message runs once and its status is its own; the request is
// replayed its own answer.
func TestHTTPTenantNamedLikeConsumer(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		engine, err := idem.NewEngine(b.NewStore(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		const consumer = "order-projector"
		mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{
			TenantFunc: func(*http.Request) (string, error) { return consumer, nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		posts := 0
		api := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			posts++
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("order o-7 created"))
		}))
		post := func() *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"id":"o-7"}`))
			req.Header.Set(idemhttp.HeaderKey, "o-7")
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, req)
			return rec
		}
		if rec := post(); rec.Code != http.StatusCreated {
			t.Fatalf("POST: %d %s", rec.Code, rec.Body)
		}

		in, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: consumer})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if st, err := in.Status(ctx, "o-7"); err != nil || st.State != ideminbox.StateAbsent {
			t.Fatalf("status of a message never delivered: %+v, %v; want absent", st, err)
		}
		runs := 0
		d, err := in.Process(ctx, ideminbox.Message{ID: "o-7", Attempt: 1}, func(ctx context.Context) error {
			runs++
			return b.Insert(ctx, inboxtest.Effects, "o-7", "message")
		})
		if d.Action != ideminbox.Ack || err != nil || runs != 1 {
			t.Fatalf("message o-7: %v, %v, %d runs; want ack after one run", d.Action, err, runs)
		}
		if st, err := in.Status(ctx, "o-7"); err != nil || st.State != ideminbox.StateProcessed {
			t.Fatalf("status: %+v, %v", st, err)
		}
		if rec := post(); rec.Code != http.StatusCreated || rec.Header().Get(idemhttp.HeaderReplayed) != "true" ||
			rec.Body.String() != "order o-7 created" || posts != 1 {
			t.Fatalf("POST again: %d %q replayed=%q, %d executions", rec.Code, rec.Body, rec.Header().Get(idemhttp.HeaderReplayed), posts)
		}
	})
}

// Every store keeps the inbox's tenant, control character included, as
// written: the record is read back under Tenant(consumer), never under
// the bare consumer name, and Status finds both a processed and a poison
// message.
func TestTenantStoredAsWritten(t *testing.T) {
	for _, tc := range everyStore() {
		t.Run(tc.name, func(t *testing.T) {
			store := tc.open(t)
			const consumer = "order-projector"
			in := newInbox(t, store, func(c *ideminbox.Config) { c.Consumer = consumer; c.MaxAttempts = 1 })
			ctx := context.Background()
			ok := func(context.Context) error { return nil }
			if d, err := in.Process(ctx, ideminbox.Message{ID: "o-7", Attempt: 1}, ok); d.Action != ideminbox.Ack || err != nil {
				t.Fatalf("o-7: %v, %v", d.Action, err)
			}
			bad := func(context.Context) error { return errors.New("malformed") }
			if d, _ := in.Process(ctx, ideminbox.Message{ID: "o-8", Attempt: 1, Data: []byte("{")}, bad); d.Action != ideminbox.AckPoison {
				t.Fatalf("o-8: %v", d.Action)
			}
			tenant := ideminbox.Tenant(consumer)
			if tenant != "\x1finbox:"+consumer {
				t.Fatalf("Tenant(%q) = %q", consumer, tenant)
			}
			for key, state := range map[string]ideminbox.State{"o-7": ideminbox.StateProcessed, "o-8": ideminbox.StatePoison} {
				rec, err := store.Get(ctx, tenant, key)
				if err != nil || rec.Tenant != tenant || rec.Key != key || rec.State != idem.StateComplete {
					t.Errorf("%s under %q: %+v, %v", key, tenant, rec, err)
				}
				if _, err := store.Get(ctx, consumer, key); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("%s under the bare consumer name: %v, want not found", key, err)
				}
				if st, err := in.Status(ctx, key); err != nil || st.State != state {
					t.Errorf("status of %s: %+v, %v; want %v", key, st, err, state)
				}
			}
		})
	}
}

// A consumer name that is not printable UTF-8 is refused by NewInbox,
// with an error that names the setting and prints the name escaped.
// Accepted, it would be the tenant of every key: PostgreSQL refuses NUL
// and invalid UTF-8 in text, so every claim would fail, the store checks
// too, and the consumer would wait forever for a store that never
// answers; control characters would reach logs and terminals. A printable
// name in any script is accepted and works.
func TestConsumerNameMustBePrintable(t *testing.T) {
	b := inboxtest.Postgres(t)
	store := b.NewStore(t)
	ctx := context.Background()
	for _, name := range []string{"orders\x00eu", "orders\xffeu"} {
		_, err := store.Claim(ctx, idem.ClaimParams{Tenant: ideminbox.Tenant(name), Key: "o-1", Token: 1, Lease: time.Minute, Retention: time.Hour})
		if err == nil {
			t.Errorf("PostgreSQL took a claim under the tenant of consumer %q", name)
		}
	}
	for _, name := range []string{"orders\x00eu", "orders\xffeu", "orders\neu", "orders\teu", "orders\x1b[2Jeu", "orders\u009beu", "orders\x7f"} {
		_, err := ideminbox.NewInbox(inboxtest.Engine(t, store), &ideminbox.Config{Consumer: name})
		if err == nil || !strings.Contains(err.Error(), "Config.Consumer") || strings.ContainsFunc(err.Error(), func(r rune) bool { return r < 0x20 || r == 0x7f || r == utf8.RuneError || (r >= 0x80 && r < 0xa0) }) {
			t.Errorf("NewInbox with Consumer %q: %v; want a printable refusal naming Config.Consumer", name, err)
		}
	}
	in, err := ideminbox.NewInbox(inboxtest.Engine(t, store), &ideminbox.Config{Consumer: "commandes-été"})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := in.Process(ctx, ideminbox.Message{ID: "o-1", Attempt: 1}, func(ctx context.Context) error {
		return b.Insert(ctx, inboxtest.Effects, "o-1", "é")
	}); d.Action != ideminbox.Ack || err != nil {
		t.Fatalf("consumer commandes-été: %+v, %v", d, err)
	}
}

// On every store, a poison record keeps the payload's first MaxPoisonData
// bytes and its whole length, whichever way the message became poison (its
// handler failed on its last attempt, or its last run never answered):
// the bound is applied before anything is written, so that the record
// always fits the store. The dead-letter hook gets the whole payload.
func TestPoisonDataBoundedOnEveryStore(t *testing.T) {
	for _, tc := range everyStore() {
		t.Run(tc.name, func(t *testing.T) {
			store := tc.open(t)
			const bound = 16
			var hooked []int
			engine, err := idem.NewEngine(store, &idem.Config{Lease: 200 * time.Millisecond, Heartbeat: -1})
			if err != nil {
				t.Fatal(err)
			}
			in := newInboxOn(t, engine, func(c *ideminbox.Config) {
				c.MaxAttempts = 1
				c.MaxPoisonData = bound
				c.InFlightDelay = 20 * time.Millisecond
				c.DeadLetterFunc = func(ctx context.Context, msg ideminbox.Message, cause error) error {
					hooked = append(hooked, len(msg.Data))
					return nil
				}
			})
			ctx := context.Background()
			payload := []byte(strings.Repeat("0123456789abcdef", 64))
			failing := func(context.Context) error { return errors.New("malformed") }
			if d, _ := in.Process(ctx, ideminbox.Message{ID: "failed", Attempt: 1, Data: payload}, failing); d.Action != ideminbox.AckPoison {
				t.Fatalf("failed: %v", d.Action)
			}
			// A last run that never answered: the key held by a claim
			// whose lease ends, once before the grant and once after it.
			for _, token := range []int64{41, 42} {
				c, err := store.Claim(ctx, idem.ClaimParams{Tenant: ideminbox.Tenant("orders"), Key: "crashed", Token: token, Lease: 200 * time.Millisecond, Retention: time.Hour})
				for err == nil && !c.Won {
					time.Sleep(20 * time.Millisecond)
					c, err = store.Claim(ctx, idem.ClaimParams{Tenant: ideminbox.Tenant("orders"), Key: "crashed", Token: token, Lease: 200 * time.Millisecond, Retention: time.Hour})
				}
				if err != nil {
					t.Fatal(err)
				}
				if token == 41 {
					// Past MaxAttempts, the key held: the grant of a last
					// run is recorded, and the delivery held.
					if d, err := in.Process(ctx, ideminbox.Message{ID: "crashed", Attempt: 2, Data: payload}, failing); d.Action != ideminbox.Hold || !errors.Is(err, idem.ErrInFlight) {
						t.Fatalf("crashed, delivery 2: %+v, %v; want held while the claim runs", d, err)
					}
				}
			}
			for {
				d, err := in.Process(ctx, ideminbox.Message{ID: "crashed", Attempt: 3, Data: payload}, failing)
				if d.Action == ideminbox.AckPoison {
					break
				}
				if d.Action != ideminbox.Hold {
					t.Fatalf("crashed, delivery 3: %+v, %v; want held, then poison", d, err)
				}
				time.Sleep(d.Delay)
			}
			for id, cause := range map[string]string{"failed": "malformed", "crashed": ideminbox.ErrUnanswered.Error()} {
				st, err := in.Status(ctx, id)
				if err != nil || st.State != ideminbox.StatePoison || st.Error != cause || !bytes.Equal(st.Data, payload[:bound]) || st.DataSize != len(payload) {
					t.Errorf("%s: status %+v, %v; want poison (%s), %d bytes of %d kept", id, st, err, cause, bound, len(payload))
				}
			}
			if !slices.Equal(hooked, []int{len(payload), len(payload)}) {
				t.Errorf("the dead-letter hook got %v bytes, want the whole payload twice", hooked)
			}
		})
	}
}

// namedStore opens one store for a test.
type namedStore struct {
	name string
	open func(t *testing.T) idem.Store
}

// everyStore lists every store, each on a fresh database, schema or key
// prefix.
func everyStore() []namedStore {
	return []namedStore{
		{"memory", func(t *testing.T) idem.Store { return idemmem.NewStore(nil) }},
		{"sqlite", func(t *testing.T) idem.Store {
			db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "inbox.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return migrated(t, db, idemmigrate.SQLite, idemsql.SQLite)
		}},
		{"mariadb", func(t *testing.T) idem.Store {
			return migrated(t, openDB(t, "mysql", testenv.MySQLDSN(t)), idemmigrate.MySQL, idemmysql.Dialect)
		}},
		{"postgres-sql", func(t *testing.T) idem.Store {
			return migrated(t, openDB(t, "pgx", testenv.PostgresSchema(t)), idemmigrate.Postgres, idemsql.Postgres)
		}},
		{"postgres-pgx", func(t *testing.T) idem.Store {
			pool, err := pgxpool.New(context.Background(), testenv.PostgresSchema(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			if err := idempg.Migrate(context.Background(), pool); err != nil {
				testenv.Unavailable(t, "PostgreSQL", err)
			}
			return testenv.Must(idempg.NewStore(pool, nil))
		}},
		{"redis", func(t *testing.T) idem.Store {
			opts, err := redis.ParseURL(testenv.RedisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			client := redis.NewClient(opts)
			t.Cleanup(func() { client.Close() })
			store, err := idemredis.NewStore(client, &idemredis.Config{Prefix: testenv.Name()})
			if err != nil {
				t.Fatal(err)
			}
			return store
		}},
	}
}

func openDB(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func migrated(t *testing.T, db *sql.DB, m idemmigrate.Dialect, d idemsql.Dialect) idem.Store {
	t.Helper()
	if err := idemmigrate.Migrate(context.Background(), db, m); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return testenv.Must(idemsql.NewStore(db, d))
}
