package inboxtest

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
)

// SQLite returns a backend on a fresh SQLite file, with idemsql. Each
// NewStore opens the file again, with its own pool, as another process
// would.
func SQLite(t testing.TB) *Backend {
	return sqliteAt(t, filepath.Join(t.TempDir(), "inbox.db"), true)
}

func sqliteAt(t testing.TB, path string, create bool) *Backend {
	open := func(t testing.TB) *sql.DB {
		db, err := idemsqlite.Open(path)
		if err != nil {
			t.Fatalf("open sqlite: %v", err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	db := open(t)
	ctx := context.Background()
	if create {
		for _, table := range []string{Effects, DeadLetters} {
			if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, note TEXT NOT NULL)`); err != nil {
				t.Fatalf("create %s: %v", table, err)
			}
		}
	}
	if err := idemmigrate.Migrate(ctx, db, idemmigrate.SQLite); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return &Backend{
		Name:          "sqlite",
		dsn:           path,
		Transactional: true,
		NewStore:      func(t testing.TB) idem.Store { return must(idemsql.NewStore(open(t), idemsql.SQLite)) },
		Insert: func(ctx context.Context, table, id, note string) error {
			_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO `+table+` (id, note) VALUES (?, ?)`, id, note)
			return err
		},
		Rows: func(t testing.TB, table string) []string {
			rows, err := db.QueryContext(context.Background(), `SELECT id FROM `+table+` ORDER BY seq`)
			if err != nil {
				t.Fatalf("select %s: %v", table, err)
			}
			ids, err := collectStrings(sqlRows{rows})
			if err != nil {
				t.Fatalf("select %s: %v", table, err)
			}
			return ids
		},
	}
}

// sqlRows fits *sql.Rows to the shape of pgx.Rows.
type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }
