// Package inboxtest runs the inbox tests on every store that can carry a
// consumer's effects in its transaction (SQLite, PostgreSQL), and counts
// those effects; and it holds the broker-adapter conformance suite,
// ExerciseAdapter, which every adapter (idemjetstream, idemamqp) runs on
// its real broker through a Destination of three methods: Publish,
// Consume (with kill), Pending.
//
// An effect is a row inserted through the store's transaction into a table
// without any unique constraint: a message that took effect twice shows up
// as two rows, it is never hidden by a constraint violation.
package inboxtest

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// Backend is one store and the database its effects are written to.
type Backend struct {
	Name string
	// Transactional is true when effects commit with the dedup record (and
	// roll back with a handler error). idemmem is not.
	Transactional bool
	// NewStore opens a new store over the backend's database, with its own
	// connections, as a second consumer process would.
	NewStore func(t testing.TB) idem.Store
	// Insert writes one row to table through ctx's transaction.
	Insert func(ctx context.Context, table, id, note string) error
	// Rows returns table's ids, one per row.
	Rows func(t testing.TB, table string) []string

	dsn string // the database, for a child process (see Env)
}

// Environment variables that pass a backend to a child process.
const (
	envBackend = "IDEMINBOX_TEST_BACKEND"
	envDSN     = "IDEMINBOX_TEST_DSN"
)

// Env returns the environment that lets a child process reopen the
// backend's database with FromEnv.
func (b *Backend) Env() []string {
	return []string{envBackend + "=" + b.Name, envDSN + "=" + b.dsn}
}

// FromEnv reopens, in a child process, the database of the backend that
// Env described, or returns nil when the environment names none.
func FromEnv(t testing.TB) *Backend {
	dsn := os.Getenv(envDSN)
	switch os.Getenv(envBackend) {
	case "sqlite":
		return sqliteAt(t, dsn, false)
	case "postgres":
		return postgresAt(t, dsn, false)
	}
	return nil
}

// Tables every backend creates.
const (
	Effects     = "effects"
	DeadLetters = "dead_letters"
)

// Mem returns a backend over one idemmem store (no transactions).
func Mem(t testing.TB) *Backend {
	store := idemmem.NewStore(nil)
	var mu sync.Mutex
	rows := map[string][]string{}
	return &Backend{
		Name:     "mem",
		NewStore: func(testing.TB) idem.Store { return store },
		Insert: func(ctx context.Context, table, id, note string) error {
			mu.Lock()
			defer mu.Unlock()
			rows[table] = append(rows[table], id)
			return nil
		},
		Rows: func(t testing.TB, table string) []string {
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), rows[table]...)
		},
	}
}

// Count returns how many rows each id has in ids.
func Count(ids []string) map[string]int {
	m := make(map[string]int, len(ids))
	for _, id := range ids {
		m[id]++
	}
	return m
}

// Engine returns an engine over store with the default settings, closed
// when the test ends: what ideminbox.NewInbox takes.
func Engine(t testing.TB, store idem.Store) *idem.Engine {
	t.Helper()
	e, err := idem.NewEngine(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}
