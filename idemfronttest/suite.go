package idemfronttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemmem"
)

type suite struct {
	h        Harness
	f        Features
	newStore func(t *testing.T) *Store
}

// env is one case: its store (behind the faults the case may turn on),
// its engine, its front end, and its own tenant.
type env struct {
	t      *testing.T
	s      *suite
	fx     *Store
	store  *faultStore
	engine *idem.Engine
	client Client
	tenant string

	runs atomic.Int64 // calls of the handler
}

// newEnv starts the front end over a fresh store for one case, protecting
// h (counted in env.runs).
//
// The gates h waits at are opened when the case ends, before the engine
// is closed: a failing case must not leave a handler blocked, which the
// engine's Close would wait for.
func (s *suite) newEnv(t *testing.T, opts Options, h Handler, gates ...*gate) *env {
	t.Helper()
	var fx *Store
	if s.newStore != nil {
		fx = s.newStore(t)
	} else {
		fx = &Store{Store: idemmem.NewStore(nil)}
	}
	e := &env{t: t, s: s, fx: fx, store: &faultStore{Store: fx.Store}, tenant: "idemfronttest-" + randomHex()}
	engine, err := idem.NewEngine(e.store, &idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e.engine = engine
	// Registered before Serve's own cleanup, so run after it: the front
	// end stops first, then the engine.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = engine.Close(ctx)
	})
	t.Cleanup(func() {
		for _, g := range gates {
			g.release()
		}
	})
	e.client = s.h.Serve(t, engine, opts, func(ctx context.Context, body []byte) Response {
		e.runs.Add(1)
		return h(ctx, body)
	})
	return e
}

// quiet drops the engine's logs: the cases provoke failures on purpose.
var quiet = slog.New(slog.DiscardHandler)

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// transactional reports whether the case's store rolls the handler's
// writes back.
func (e *env) transactional() bool { return e.fx.Store.Info().Transactional }

// requireTransactional skips a case that needs business writes.
func (e *env) requireTransactional() {
	e.t.Helper()
	if !e.transactional() {
		e.t.Skip("skipping: the store is not transactional (the handler's writes do not commit with its answer)")
	}
	if e.fx.BusinessWrite == nil || e.fx.BusinessCount == nil {
		e.t.Fatal("the store is transactional, but Store.BusinessWrite or Store.BusinessCount is nil")
	}
}

// call is a call of the case's tenant.
func (e *env) call(key, body string) Call {
	return Call{Tenant: e.tenant, Key: key, Body: []byte(body)}
}

// send makes c and fails the case when no answer comes back.
func (e *env) send(c Call) Reply {
	e.t.Helper()
	reply, err := e.client.Send(e.t.Context(), c)
	if err != nil {
		e.t.Fatalf("Send(tenant %q, key %q): %v", c.Tenant, c.Key, err)
	}
	return reply
}

// wantRuns fails the case unless the handler ran n times.
func (e *env) wantRuns(n int64, why string) {
	e.t.Helper()
	if got := e.runs.Load(); got != n {
		e.t.Errorf("the handler ran %d times, want %d: %s", got, n, why)
	}
}

// count returns the committed business rows id.
func (e *env) count(id string) int {
	e.t.Helper()
	n, err := e.fx.BusinessCount(e.t.Context(), id)
	if err != nil {
		e.t.Fatalf("BusinessCount(%q): %v", id, err)
	}
	return n
}

// write inserts the business row id through the handler's transaction,
// and panics when it cannot: a handler that cannot write must not answer
// as if it had.
func (e *env) write(ctx context.Context, id string) {
	if err := e.fx.BusinessWrite(ctx, id); err != nil {
		panic(fmt.Sprintf("idemfronttest: BusinessWrite(%q) through the handler's context: %v", id, err))
	}
}

// untilSettled sends c until it is no longer answered in flight: the
// execution it met has ended. It fails the case after a minute.
func (e *env) untilSettled(c Call) Reply {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		r := e.send(c)
		if r.Kind != idemfront.InFlight {
			return r
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("key %q still in flight after a minute", c.Key)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wantKind fails the case unless r is of kind k.
func wantKind(t *testing.T, what string, r Reply, k idemfront.Kind) {
	t.Helper()
	if r.Kind != k {
		t.Fatalf("%s: answered %s (body %q), want %s", what, r.Kind, clip(r.Body), k)
	}
}

// wantAnswer fails the case unless r is the handler's answer body, fresh
// (Executed) or replayed with the marker, as kind says.
func wantAnswer(t *testing.T, what string, r Reply, kind idemfront.Kind, body []byte) {
	t.Helper()
	wantKind(t, what, r, kind)
	if !bytes.Equal(r.Body, body) {
		t.Fatalf("%s: body %q, want %q byte for byte", what, clip(r.Body), clip(body))
	}
}

// clip shortens a body for a failure message.
func clip(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + "…"
	}
	return string(b)
}

// ok is a plain successful handler answering body.
func ok(body string) Handler {
	return func(context.Context, []byte) Response { return Response{Body: []byte(body)} }
}

// gate blocks the first handler that reaches it until opened, and says
// when it is waiting. Later handlers (a front end that runs one it should
// not have) pass at once, so that the case fails on what they did instead
// of hanging.
type gate struct {
	started chan struct{} // closed when the first handler is waiting
	open    chan struct{}
	first   atomic.Bool
	once    sync.Once
	opened  sync.Once
}

// newGate returns a closed gate; pass it to newEnv.
func newGate() *gate {
	return &gate{started: make(chan struct{}), open: make(chan struct{})}
}

// wait blocks until the gate opens, or ctx ends; it reports whether ctx
// ended first.
func (g *gate) wait(ctx context.Context) (cancelled bool) {
	if !g.first.CompareAndSwap(false, true) {
		return ctx.Err() != nil
	}
	g.once.Do(func() { close(g.started) })
	select {
	case <-g.open:
		return false
	case <-ctx.Done():
		return true
	}
}

func (g *gate) release() { g.opened.Do(func() { close(g.open) }) }

// waitStarted waits for a handler to be in the gate.
func (g *gate) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-g.started:
	case <-time.After(time.Minute):
		t.Fatal("the handler never started")
	}
}

// faultStore is the case's store, with the faults a case turns on: claims
// that fail (a store that cannot be reached), completions that fail (a
// store lost while the handler ran). It counts lost claims, so that a
// case knows duplicates have met the execution in flight.
type faultStore struct {
	idem.Store
	failClaim    atomic.Bool
	failComplete atomic.Bool
	lost         atomic.Int64 // claims answered "not won"
}

var errDown = errors.New("idemfronttest: the store is down")

func (s *faultStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if s.failClaim.Load() {
		return idem.ClaimResult{}, idem.NotApplied(errDown)
	}
	res, err := s.Store.Claim(ctx, p)
	if err == nil && !res.Won {
		s.lost.Add(1)
	}
	return res, err
}

func (s *faultStore) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	u, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &faultUnit{UnitOfWork: u, s: s}, nil
}

// Watch passes the inner store's notifications on, so that the wait mode
// is woken as it would be without the faults; a store without them is
// polled.
func (s *faultStore) Watch(ctx context.Context, tenant, key string) (<-chan struct{}, func(), error) {
	if w, ok := s.Store.(idem.Watcher); ok {
		return w.Watch(ctx, tenant, key)
	}
	return nil, nil, errors.New("idemfronttest: the store has no notifications")
}

type faultUnit struct {
	idem.UnitOfWork
	s *faultStore
}

func (u *faultUnit) Complete(ctx context.Context, p idem.CompleteParams) error {
	if u.s.failComplete.Load() {
		// As a lost connection does: nothing of the unit commits.
		_ = u.UnitOfWork.Rollback(context.WithoutCancel(ctx))
		return errDown
	}
	return u.UnitOfWork.Complete(ctx, p)
}
