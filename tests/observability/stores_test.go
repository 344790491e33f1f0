package observability

import (
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // testenv makes schemas through it
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
)

// store is one real store under test, with the name it reports.
type store struct {
	name string // StoreInfo.Name
	open func(t *testing.T) idem.Store
}

var stores = []store{
	{"sqlite", func(t *testing.T) idem.Store {
		db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if err := idemmigrate.Migrate(t.Context(), db, idemmigrate.SQLite); err != nil {
			t.Fatal(err)
		}
		s, err := idemsql.NewStore(db, idemsql.SQLite)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
	{"postgresql", func(t *testing.T) idem.Store {
		cfg, err := pgxpool.ParseConfig(testenv.PostgresSchema(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 8 // shared server; enough for the duplicates
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			testenv.Unavailable(t, "PostgreSQL", err)
		}
		t.Cleanup(pool.Close)
		if err := idempg.Migrate(t.Context(), pool); err != nil {
			t.Fatal(err)
		}
		s, err := idempg.NewStore(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
	{"redis", func(t *testing.T) idem.Store {
		opts, err := redis.ParseURL(testenv.RedisURL(t))
		if err != nil {
			t.Fatal(err)
		}
		client := redis.NewClient(opts)
		t.Cleanup(func() { client.Close() })
		s, err := idemredis.NewStore(client, &idemredis.Config{Prefix: testenv.Name()})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
}
