package idemredis

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// flushDB is the database index the flush tests own. They FLUSHDB it, so
// nothing else in the test suite may use it; every other test uses the
// database of IDEM_TEST_REDIS (0 by default) and never flushes.
const flushDB = 13

// newClient returns a client of its own (own connection pool, like a
// separate process would have) to the test server, on database db, or on
// the database of the URL when db is negative.
func newClient(t testing.TB, db int) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS: %v", err)
	}
	if db >= 0 {
		opt.DB = db
	}
	// Enough connections that 50 goroutines released at one barrier reach
	// the server together rather than queueing for the pool.
	opt.PoolSize = 64
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newStore returns a store with a fresh prefix on its own client, and
// deletes the prefix's keys when the test ends.
func newStore(t testing.TB) *Store {
	t.Helper()
	return newStoreOn(t, newClient(t, -1), testenv.Name())
}

// newStoreOn returns a store over client with prefix, and deletes the
// prefix's keys when the test ends.
func newStoreOn(t testing.TB, client *redis.Client, prefix string) *Store {
	t.Helper()
	s, err := NewStore(client, &Config{Prefix: prefix})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { deletePrefix(client, prefix) })
	return s
}

// deletePrefix deletes the keys under prefix, so that the shared server
// does not keep test records for their whole retention.
func deletePrefix(client *redis.Client, prefix string) {
	ctx := context.Background()
	iter := client.Scan(ctx, 0, prefix+":*", 100).Iterator()
	for iter.Next(ctx) {
		client.Del(ctx, iter.Val())
	}
}

// logBuffer is a concurrency-safe log sink for asserting on warnings.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// barrier releases goroutines together: each calls wait, and release
// returns once all n are waiting, then lets them go at once.
type barrier struct {
	ready sync.WaitGroup
	start chan struct{}
}

func newBarrier(n int) *barrier {
	b := &barrier{start: make(chan struct{})}
	b.ready.Add(n)
	return b
}

func (b *barrier) wait() {
	b.ready.Done()
	<-b.start
}

func (b *barrier) release() {
	b.ready.Wait()
	close(b.start)
}
