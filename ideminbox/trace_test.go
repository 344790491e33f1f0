package ideminbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/idemmem"
)

// bothTracer implements the engine's tracer and the inbox's, as idemprom
// and idemotel do, and counts what each hook saw.
type bothTracer struct {
	mu         sync.Mutex
	name       string
	operations int
	actions    []ideminbox.Action
	starts     []ideminbox.TraceMessageStartData
	order      *[]string
}

type traceKey struct{ name string }

func (b *bothTracer) TraceOperationStart(ctx context.Context, _ idem.TraceOperationStartData) context.Context {
	return ctx
}

func (b *bothTracer) TraceOperationEnd(context.Context, idem.TraceOperationEndData) {
	b.mu.Lock()
	b.operations++
	b.mu.Unlock()
}

func (b *bothTracer) TraceMessageStart(ctx context.Context, d ideminbox.TraceMessageStartData) context.Context {
	b.mu.Lock()
	b.starts = append(b.starts, d)
	if b.order != nil {
		*b.order = append(*b.order, b.name)
	}
	b.mu.Unlock()
	return context.WithValue(ctx, traceKey{b.name}, true)
}

func (b *bothTracer) TraceMessageEnd(ctx context.Context, d ideminbox.TraceMessageEndData) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ctx.Value(traceKey{b.name}) == nil {
		panic("TraceMessageEnd without the context TraceMessageStart returned")
	}
	b.actions = append(b.actions, d.Action)
}

// A tracer given to both the engine and the inbox sees each message once,
// with the inbox's typed action, and the engine's operations; given to the
// engine alone, it sees no message.
func TestTracerGivenToBoth(t *testing.T) {
	ctx := context.Background()
	tr := &bothTracer{}
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	in, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: "billing", Tracer: tr, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context) error { return nil }
	in.Process(ctx, ideminbox.Message{ID: "m1", Attempt: 1, Subject: "orders"}, ok)                                    //nolint:errcheck // the action is what is traced
	in.Process(ctx, ideminbox.Message{ID: "m1", Attempt: 2, Subject: "orders"}, ok)                                    //nolint:errcheck
	in.Process(ctx, ideminbox.Message{ID: "m2", Attempt: 1}, func(context.Context) error { return errors.New("bad") }) //nolint:errcheck
	in.Process(ctx, ideminbox.Message{Attempt: 1}, ok)                                                                 //nolint:errcheck
	want := []ideminbox.Action{ideminbox.Ack, ideminbox.AckDuplicate, ideminbox.AckPoison, ideminbox.Reject}
	if len(tr.actions) != len(want) {
		t.Fatalf("actions %v, want %v", tr.actions, want)
	}
	for i := range want {
		if tr.actions[i] != want[i] {
			t.Fatalf("actions %v, want %v", tr.actions, want)
		}
	}
	if s := tr.starts[1]; s.Consumer != "billing" || s.Subject != "orders" || s.Attempt != 2 {
		t.Errorf("start data %+v", s)
	}
	if tr.operations == 0 {
		t.Error("the engine's hooks were not called")
	}

	engineOnly := &bothTracer{}
	e2, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: engineOnly})
	if err != nil {
		t.Fatal(err)
	}
	in2, err := ideminbox.NewInbox(e2, &ideminbox.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	in2.Process(ctx, ideminbox.Message{ID: "m1", Attempt: 1}, ok) //nolint:errcheck
	if len(engineOnly.actions) != 0 || engineOnly.operations == 0 {
		t.Errorf("engine-only tracer: %d messages, %d operations; want 0 and some", len(engineOnly.actions), engineOnly.operations)
	}
}

// MultiTracer calls each tracer in turn, chaining the contexts, and
// skips nil ones.
func TestMultiTracer(t *testing.T) {
	var order []string
	a, b := &bothTracer{name: "a", order: &order}, &bothTracer{name: "b", order: &order}
	if ideminbox.MultiTracer(nil, nil) != nil {
		t.Fatal("MultiTracer of nils is not nil")
	}
	if ideminbox.MultiTracer(nil, a) != ideminbox.MessageTracer(a) {
		t.Fatal("MultiTracer of one tracer is not that tracer")
	}
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: "c", Tracer: ideminbox.MultiTracer(a, nil, b)})
	if err != nil {
		t.Fatal(err)
	}
	in.Process(context.Background(), ideminbox.Message{ID: "m", Attempt: 1}, func(context.Context) error { return nil }) //nolint:errcheck
	if len(order) != 2 || order[0] != "a" || order[1] != "b" || len(a.actions) != 1 || len(b.actions) != 1 {
		t.Fatalf("order %v, actions %v %v", order, a.actions, b.actions)
	}
}
