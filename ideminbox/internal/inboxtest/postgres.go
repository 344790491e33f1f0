package inboxtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/testenv"
)

// Postgres returns a backend on a fresh PostgreSQL schema, with idempg.
func Postgres(t testing.TB) *Backend {
	return postgresAt(t, testenv.PostgresSchema(t), true)
}

func postgresAt(t testing.TB, url string, create bool) *Backend {
	open := func(t testing.TB) *pgxpool.Pool {
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatalf("pgxpool: %v", err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	pool := open(t)
	ctx := context.Background()
	if err := idempg.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if create {
		for _, table := range []string{Effects, DeadLetters} {
			if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (seq bigserial PRIMARY KEY, id text NOT NULL, note text NOT NULL)`); err != nil {
				t.Fatalf("create %s: %v", table, err)
			}
		}
	}
	return &Backend{
		Name:          "postgres",
		dsn:           url,
		Transactional: true,
		NewStore:      func(t testing.TB) idem.Store { return must(idempg.NewStore(open(t), nil)) },
		Insert: func(ctx context.Context, table, id, note string) error {
			_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO `+table+` (id, note) VALUES ($1, $2)`, id, note)
			return err
		},
		Rows: func(t testing.TB, table string) []string {
			rows, err := pool.Query(context.Background(), `SELECT id FROM `+table+` ORDER BY seq`)
			if err != nil {
				t.Fatalf("select %s: %v", table, err)
			}
			ids, err := collectStrings(rows)
			if err != nil {
				t.Fatalf("select %s: %v", table, err)
			}
			return ids
		},
	}
}

type stringRows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close()
}

func collectStrings(rows stringRows) ([]string, error) {
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
