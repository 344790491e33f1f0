package idemprom_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
)

// base and since read the monotonic clock alone, as the engine and
// idemhttp do.
var base = time.Now()

func since() time.Duration { return time.Since(base) }

// BenchmarkHooksFirstExecution makes the tracer calls and clock reads
// that one first execution through idemhttp makes, and nothing else: the
// cost idemprom adds to a request, apart from the noise of a whole
// request. The end-to-end comparison is tests/observability's
// BenchmarkObserve*.
func BenchmarkHooksFirstExecution(b *testing.B) {
	c, _ := newCollector(b)
	ctx := context.Background()
	ops := []idem.StoreOperation{idem.StoreClaim, idem.StoreBegin, idem.StoreComplete}
	b.ReportAllocs()
	for b.Loop() {
		rctx := c.TraceRequestStart(ctx, idemfront.TraceRequestStartData{Method: "POST", Route: "/orders"})
		octx := c.TraceOperationStart(rctx, idem.TraceOperationStartData{Tenant: "acme", Key: "k", Store: "memory"})
		var handler time.Duration
		for _, op := range ops {
			sctx := c.TraceStoreStart(octx, idem.TraceStoreStartData{Operation: op, Store: "memory"})
			start := since()
			if op == idem.StoreBegin {
				handler = since()
			}
			c.TraceStoreEnd(sctx, idem.TraceStoreEndData{Operation: op, Store: "memory", Duration: since() - start})
		}
		c.TraceOperationEnd(octx, idem.TraceOperationEndData{Outcome: idem.OutcomeExecuted, Store: "memory", ResponseBytes: 45})
		c.TraceRequestEnd(rctx, idemfront.TraceRequestEndData{Method: "POST", Route: "/orders", Kind: idemfront.Executed, Status: 201, Execution: since() - handler})
	}
}

// BenchmarkHooksReplay is the same for a replay: one store call.
func BenchmarkHooksReplay(b *testing.B) {
	c, _ := newCollector(b)
	ctx := context.Background()
	completed := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		rctx := c.TraceRequestStart(ctx, idemfront.TraceRequestStartData{Method: "POST", Route: "/orders"})
		octx := c.TraceOperationStart(rctx, idem.TraceOperationStartData{Tenant: "acme", Key: "k", Store: "memory"})
		sctx := c.TraceStoreStart(octx, idem.TraceStoreStartData{Operation: idem.StoreClaim, Store: "memory"})
		start := since()
		c.TraceStoreEnd(sctx, idem.TraceStoreEndData{Operation: idem.StoreClaim, Store: "memory", Duration: since() - start})
		c.TraceOperationEnd(octx, idem.TraceOperationEndData{Outcome: idem.OutcomeReplayed, Store: "memory", ResponseBytes: 45, ReplayAge: time.Since(completed)})
		c.TraceRequestEnd(rctx, idemfront.TraceRequestEndData{Method: "POST", Route: "/orders", Kind: idemfront.Replayed, Status: 201})
	}
}
