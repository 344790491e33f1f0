package idemjanitor_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemmem"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// purges records what the janitor told it; it is also an idem.Tracer,
// so that it can be combined with idem.MultiTracer.
type purges struct {
	mu     sync.Mutex
	passes []idemjanitor.TracePurgeData
	calls  int // Store.Purge calls seen as a StoreTracer
}

func (p *purges) TraceOperationStart(ctx context.Context, _ idem.TraceOperationStartData) context.Context {
	return ctx
}
func (p *purges) TraceOperationEnd(context.Context, idem.TraceOperationEndData) {}
func (p *purges) TracePurge(_ context.Context, d idemjanitor.TracePurgeData) {
	p.mu.Lock()
	p.passes = append(p.passes, d)
	p.mu.Unlock()
}
func (p *purges) TraceStoreStart(ctx context.Context, _ idem.TraceStoreStartData) context.Context {
	return ctx
}
func (p *purges) TraceStoreEnd(_ context.Context, d idem.TraceStoreEndData) {
	if d.Operation == idem.StorePurge {
		p.mu.Lock()
		p.calls++
		p.mu.Unlock()
	}
}

type opsOnly struct{}

func (opsOnly) TraceOperationStart(ctx context.Context, _ idem.TraceOperationStartData) context.Context {
	return ctx
}
func (opsOnly) TraceOperationEnd(context.Context, idem.TraceOperationEndData) {}

// A pass deletes the expired records in batches of BatchSize, and is
// traced by the PurgeTracers inside an idem.MultiTracer, each batch as a
// store call.
func TestPurgeOnce(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.Unix(1e9, 0)}
	store := idemmem.NewStore(&idemmem.Config{NowFunc: clk.Now})
	engine, err := idem.NewEngine(store, &idem.Config{Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close(ctx)
	for i := range 25 {
		if _, err := engine.Do(ctx, idem.Operation{Key: fmt.Sprint("k", i)}, func(ctx context.Context) (idem.Result, error) {
			return idem.Result{Status: 201}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := &purges{}, &purges{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	j, err := idemjanitor.NewJanitor(store, &idemjanitor.Config{BatchSize: 10, Logger: quiet, Tracer: idem.MultiTracer(opsOnly{}, a, b)})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := j.PurgeOnce(ctx); err != nil || n != 0 {
		t.Fatalf("purge before retention: %d, %v; want 0", n, err)
	}
	clk.add(2 * time.Hour)
	if n, err := j.PurgeOnce(ctx); err != nil || n != 25 {
		t.Fatalf("purge after retention: %d, %v; want 25", n, err)
	}
	for _, p := range []*purges{a, b} {
		if len(p.passes) != 2 || p.passes[1].Deleted != 25 || p.passes[1].Batches != 3 || p.passes[1].Store != "memory" {
			t.Errorf("passes traced: %+v; want 2, the second 25 records in 3 batches", p.passes)
		}
		if p.calls != 4 {
			t.Errorf("store purge calls traced: %d, want 4 (1 + 3)", p.calls)
		}
	}
}

// Negative settings are refused, a nil store too.
func TestNewJanitorRefuses(t *testing.T) {
	if _, err := idemjanitor.NewJanitor(nil, nil); err == nil {
		t.Error("NewJanitor(nil) succeeded")
	}
	if _, err := idemjanitor.NewJanitor(idemmem.NewStore(nil), &idemjanitor.Config{BatchSize: -1}); err == nil {
		t.Error("a negative BatchSize was accepted")
	}
}

// Run purges until its context ends, then returns nil.
func TestRunStops(t *testing.T) {
	j, err := idemjanitor.NewJanitor(idemmem.NewStore(nil), &idemjanitor.Config{Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
