package idemfront_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemmem"
)

func newFront(t *testing.T, cfg *idemfront.Config) *idemfront.Front {
	t.Helper()
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := idemfront.NewFront(engine, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Every error the engine names gets its kind and advice, however deeply
// it is wrapped.
func TestClassify(t *testing.T) {
	f := newFront(t, &idemfront.Config{RetryAfter: 3 * time.Second})
	live := context.Background()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		err   error
		state idemfront.State
		kind  idemfront.Kind
		retry idemfront.Retry
	}{
		{idem.ErrInFlight, idemfront.State{Ctx: live}, idemfront.InFlight, idemfront.RetryLater},
		{idem.ErrFingerprintMismatch, idemfront.State{Ctx: live}, idemfront.Mismatch, idemfront.NewKey},
		{idem.ErrLeaseLost, idemfront.State{Ran: true, Ctx: live}, idemfront.LeaseLost, idemfront.RetryNow},
		{&idem.StoreError{Op: "claim", Err: errors.New("down")}, idemfront.State{Ctx: live}, idemfront.StoreUnavailable, idemfront.RetryLater},
		{&idem.PanicError{Value: "boom"}, idemfront.State{Ran: true, Ctx: live}, idemfront.Panicked, idemfront.RetryLater},
		{fmt.Errorf("x: %w", idem.ErrStepNotSaved), idemfront.State{Ran: true, Ctx: live}, idemfront.StepNotSaved, idemfront.RetryLater},
		{idem.ErrInvalidKey, idemfront.State{Ctx: live}, idemfront.InvalidKey, idemfront.DontRetry},
		{idem.ErrClosed, idemfront.State{Ctx: live}, idemfront.Closed, idemfront.RetryLater},
		{idem.ErrWritesAborted, idemfront.State{Ran: true, Ctx: live}, idemfront.Internal, idemfront.RetryNow},
		{fmt.Errorf("%w: %w", idem.ErrOutcomeUnknown, errors.New("upstream silent")), idemfront.State{Ran: true, Ctx: live}, idemfront.Internal, idemfront.RetryLater},
		{fmt.Errorf("h: %w", idemfront.ErrResponseTooLarge), idemfront.State{Ran: true, Ctx: live}, idemfront.ResponseTooLarge, idemfront.DontRetry},
		{errors.New("what"), idemfront.State{Ctx: live}, idemfront.Internal, idemfront.RetryNow},
		// A claim cancelled with its caller also fails as a store error:
		// the store is not to blame.
		{&idem.StoreError{Op: "claim", Err: context.Canceled}, idemfront.State{Ctx: gone}, idemfront.Cancelled, idemfront.RetryNow},
		// Once the handler ran, a store error is the store's.
		{&idem.StoreError{Op: "complete", Err: context.Canceled}, idemfront.State{Ran: true, Ctx: gone}, idemfront.StoreUnavailable, idemfront.RetryLater},
		// A waiter whose caller left, on a detached context.
		{context.Canceled, idemfront.State{Ctx: live, CallerCtx: gone}, idemfront.Cancelled, idemfront.RetryNow},
	} {
		a := f.Classify(fmt.Errorf("wrapped: %w", tc.err), tc.state)
		if a.Kind != tc.kind || a.Retry != tc.retry || a.Ran != tc.state.Ran {
			t.Errorf("Classify(%v, ran=%v) = %s retry %d ran %v; want %s retry %d", tc.err, tc.state.Ran, a.Kind, a.Retry, a.Ran, tc.kind, tc.retry)
		}
		if (a.Retry == idemfront.RetryLater) != (a.RetryAfter == 3*time.Second) {
			t.Errorf("Classify(%v): RetryAfter %v with advice %d", tc.err, a.RetryAfter, a.Retry)
		}
		if a.Undone {
			t.Errorf("Classify(%v) on idemmem says the work was undone", tc.err)
		}
	}
	if k := f.Classify(nil, idemfront.State{}).Kind; k != idemfront.Internal {
		t.Errorf("Classify(nil) = %s, want internal", k)
	}
}

// Every kind has a name and an outcome for the tracers.
func TestKinds(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range idemfront.Kinds() {
		name := k.String()
		if name == "unknown" || seen[name] {
			t.Errorf("kind %d named %q", k, name)
		}
		seen[name] = true
		if k.Label() == "unknown" {
			t.Errorf("kind %s has no label for the tracers", k)
		}
	}
	// The labels are the first releases' names: dashboards depend on them.
	want := map[idemfront.Kind]string{
		idemfront.Replayed: "replayed", idemfront.Mismatch: "fingerprint_mismatch",
		idemfront.Panicked: "handler_panic", idemfront.Cancelled: "request_cancelled",
		idemfront.NotStored: "not_executed", idemfront.Closed: "internal_error",
		idemfront.InvalidTenant: "internal_error", idemfront.Internal: "internal_error",
		idemfront.RequestTooLarge: "request_too_large", idemfront.Incomplete: "incomplete",
	}
	for k, label := range want {
		if k.Label() != label {
			t.Errorf("%s labelled %q, want %q", k, k.Label(), label)
		}
	}
}

type countingTracer struct {
	idem.Tracer
	starts, ends *int
}

func (c countingTracer) TraceRequestStart(ctx context.Context, _ idemfront.TraceRequestStartData) context.Context {
	*c.starts++
	return ctx
}

func (c countingTracer) TraceRequestEnd(context.Context, idemfront.TraceRequestEndData) { *c.ends++ }

type plainTracer struct{ idem.Tracer }

// RequestTracerOf finds the request tracers inside an idem.MultiTracer.
func TestRequestTracerOf(t *testing.T) {
	if idemfront.RequestTracerOf(nil) != nil || idemfront.RequestTracerOf(plainTracer{}) != nil {
		t.Fatal("a tracer without requests gave a request tracer")
	}
	var starts, ends int
	one := countingTracer{starts: &starts, ends: &ends}
	if idemfront.RequestTracerOf(one) == nil {
		t.Fatal("a request tracer was not found")
	}
	multi := idem.MultiTracer(plainTracer{}, one, one)
	r := idemfront.RequestTracerOf(multi)
	if r == nil {
		t.Fatal("no request tracer inside MultiTracer")
	}
	r.TraceRequestEnd(r.TraceRequestStart(context.Background(), idemfront.TraceRequestStartData{}), idemfront.TraceRequestEndData{})
	if starts != 2 || ends != 2 {
		t.Fatalf("starts %d ends %d, want 2 and 2", starts, ends)
	}
}

type valueKey struct{}

// Detach keeps the caller's values and drops its cancellation; the life
// context ends it, with its cause.
func TestDetach(t *testing.T) {
	errGone, errStopping := errors.New("client gone"), errors.New("server stopping")
	caller, leave := context.WithCancelCause(context.WithValue(context.Background(), valueKey{}, "v"))
	never, stopNever := idemfront.Detach(caller, nil)
	defer stopNever()
	life, stop := context.WithCancelCause(context.Background())
	bounded, stopBounded := idemfront.Detach(caller, life)
	defer stopBounded()
	child, cancelChild := context.WithCancel(bounded)
	defer cancelChild()

	leave(errGone)
	for name, ctx := range map[string]context.Context{"never": never, "bounded": bounded, "child": child} {
		if ctx.Err() != nil || context.Cause(ctx) != nil || ctx.Value(valueKey{}) != "v" {
			t.Fatalf("%s after the caller left: err %v, cause %v, value %v", name, ctx.Err(), context.Cause(ctx), ctx.Value(valueKey{}))
		}
	}
	stop(errStopping)
	<-child.Done()
	if !errors.Is(context.Cause(child), errStopping) || !errors.Is(context.Cause(bounded), errStopping) {
		t.Fatalf("cause %v, want the life context's", context.Cause(child))
	}
	if never.Err() != nil {
		t.Fatal("a context without life ended")
	}

	deadline := time.Now().Add(time.Hour)
	timed, cancelTimed := context.WithDeadline(context.Background(), deadline)
	defer cancelTimed()
	d, stopD := idemfront.Detach(caller, timed)
	defer stopD()
	if got, ok := d.Deadline(); !ok || !got.Equal(deadline) {
		t.Fatalf("Deadline() = %v, %v; want the life context's", got, ok)
	}
}

func TestValidateTenant(t *testing.T) {
	for _, tenant := range []string{"", "acme", "société", "東京", "a b", "\uFFFD"} {
		if err := idemfront.ValidateTenant(tenant); err != nil {
			t.Errorf("ValidateTenant(%q): %v", tenant, err)
		}
	}
	for _, tenant := range []string{"\x1finbox", "a\nb", "a\x00", "del\x7f", "tab\t", "\xff", "ok\xc3", "csi\u009b", "\u0085"} {
		err := idemfront.ValidateTenant(tenant)
		if !errors.Is(err, idemfront.ErrInvalidTenant) {
			t.Errorf("ValidateTenant(%q) = %v, want ErrInvalidTenant", tenant, err)
			continue
		}
		// The error may reach a tracer: it never quotes the tenant.
		if strings.Contains(err.Error(), tenant) && tenant != "" {
			t.Errorf("ValidateTenant(%q) = %q quotes the tenant", tenant, err)
		}
	}
}

func TestOneKey(t *testing.T) {
	if k, err := idemfront.OneKey(nil); k != "" || err != nil {
		t.Fatalf("OneKey(nil) = %q, %v", k, err)
	}
	if k, err := idemfront.OneKey([]string{"k1"}); k != "k1" || err != nil {
		t.Fatalf("OneKey(k1) = %q, %v", k, err)
	}
	for _, values := range [][]string{{"a", "b"}, {""}, {"a b"}, {strings.Repeat("k", 256)}} {
		if _, err := idemfront.OneKey(values); !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("OneKey(%q) = %v, want ErrInvalidKey", values, err)
		}
	}
}

// The allowlist ignores case: HTTP's canonical names and gRPC's lowercase
// metadata follow one rule.
func TestHeaders(t *testing.T) {
	h, err := idemfront.NewHeaders([]string{"Content-Type", "ETag", "x-request-kind"}, []string{"Set-Cookie", "Idempotent-Replayed"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Content-Type", "content-type", "CONTENT-TYPE", "Etag", "ETag", "etag", "X-Request-Kind", "x-request-kind"} {
		if !h.Stored(name) {
			t.Errorf("Stored(%q) = false", name)
		}
	}
	for _, name := range []string{"Location", "set-cookie", "Set-Cookie"} {
		if h.Stored(name) {
			t.Errorf("Stored(%q) = true", name)
		}
	}
	for _, name := range []string{"set-cookie", "SET-COOKIE", "Idempotent-Replayed", "idempotent-replayed"} {
		if h.Replayable(name) {
			t.Errorf("Replayable(%q) = true", name)
		}
	}
	if !h.Replayable("location") {
		t.Error("Replayable(location) = false")
	}
	if _, err := idemfront.NewHeaders([]string{"set-cookie"}, []string{"Set-Cookie"}); err == nil {
		t.Error("NewHeaders accepted a never-replayed name in another case")
	}
	if _, err := idemfront.NewHeaders([]string{"X Foo"}, nil); err == nil {
		t.Error("NewHeaders accepted a name that is not a token")
	}
}

// A lookup of a name in canonical form or in lowercase costs no
// allocation: it runs on every header of every answer.
func TestHeadersLookupAllocs(t *testing.T) {
	h, err := idemfront.NewHeaders([]string{"Content-Type", "ETag"}, []string{"Set-Cookie"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Content-Type", "content-type", "Location", "location", "Etag"} {
		if n := testing.AllocsPerRun(100, func() { h.Stored(name); h.Replayable(name) }); n != 0 {
			t.Errorf("looking up %q allocates %v times", name, n)
		}
	}
}

func TestKindOf(t *testing.T) {
	for _, tc := range []struct {
		out  idem.Outcome
		want idemfront.Kind
	}{
		{idem.Outcome{}, idemfront.Executed},
		{idem.Outcome{Replayed: true}, idemfront.Replayed},
		{idem.Outcome{NotStored: true}, idemfront.NotStored},
	} {
		if got := idemfront.KindOf(tc.out); got != tc.want {
			t.Errorf("KindOf(%+v) = %s, want %s", tc.out, got, tc.want)
		}
	}
}
