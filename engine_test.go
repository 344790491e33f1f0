package idem_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/atonce"
)

// atOnce runs fn(0) … fn(n-1) on n goroutines released together by one
// barrier.
var atOnce = atonce.Run

func newEngine(t *testing.T, store idem.Store, cfg *idem.Config) *idem.Engine {
	t.Helper()
	e, err := idem.NewEngine(store, cfg)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	return e
}

// A slow handler whose lease is shorter than its run keeps the key through
// the heartbeat: retries arriving together, long after the first lease
// would have ended, are told it is in flight and never run.
func TestDoHeartbeatKeepsSlowHandler(t *testing.T) {
	const lease = 200 * time.Millisecond
	store := idemmem.NewStore(nil)
	e := newEngine(t, store, &idem.Config{Lease: lease, Heartbeat: 50 * time.Millisecond})
	op := idem.Operation{Tenant: "t", Key: "slow", Fingerprint: []byte("req")}

	started := make(chan struct{})
	finished := make(chan struct{})
	type result struct {
		out idem.Outcome
		err error
	}
	slow := make(chan result, 1)
	go func() {
		out, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			close(started)
			defer close(finished)
			select {
			case <-time.After(3 * lease):
			case <-ctx.Done():
				return idem.Result{}, context.Cause(ctx)
			}
			return idem.Result{Status: 201, Body: []byte("slow")}, nil
		})
		slow <- result{out, err}
	}()
	select {
	case <-started:
	case r := <-slow:
		t.Fatalf("the slow Do ended before its handler ran: %+v, %v", r.out, r.err)
	}

	var retriesRan atomic.Int32
	var lastRetry time.Time
	for running := true; running; {
		const retries = 5
		errs := make([]error, retries)
		atOnce(retries, func(i int) {
			_, errs[i] = e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
				retriesRan.Add(1)
				return idem.Result{Status: 201, Body: []byte("retry")}, nil
			})
		})
		lastRetry = time.Now()
		for i, err := range errs {
			if !errors.Is(err, idem.ErrInFlight) {
				t.Errorf("retry %d while the slow handler runs = %v, want idem.ErrInFlight", i, err)
			}
		}
		select {
		case <-finished:
			running = false
		case <-time.After(lease / 4):
		}
	}

	r := <-slow
	if r.err != nil || r.out.Replayed || string(r.out.Result.Body) != "slow" {
		t.Fatalf("slow Do = %+v, %v; want its own fresh result", r.out, r.err)
	}
	if n := retriesRan.Load(); n != 0 {
		t.Errorf("retries ran %d times while the slow handler held the key", n)
	}
	rec, err := store.Get(context.Background(), op.Tenant, op.Key)
	if err != nil {
		t.Fatal(err)
	}
	// The store's record proves the heartbeat extended the lease, and that
	// retries came after the first lease would have ended.
	if end := rec.CreatedAt.Add(lease); !rec.LockedUntil.After(end) || !lastRetry.After(end) {
		t.Errorf("lease ends %v, last retry %v; want both after the first lease end %v",
			rec.LockedUntil, lastRetry, end)
	}
}

// Without a heartbeat, a handler outliving its lease loses the key to a
// retry, which runs; the slow handler's completion is refused.
func TestDoHeartbeatOffLosesLease(t *testing.T) {
	const lease = 200 * time.Millisecond
	store := idemmem.NewStore(nil)
	e := newEngine(t, store, &idem.Config{Lease: lease, Heartbeat: -1})
	op := idem.Operation{Tenant: "t", Key: "slow", Fingerprint: []byte("req")}

	started := make(chan struct{})
	taken := make(chan struct{})
	slowErr := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			close(started)
			select {
			case <-taken:
			case <-time.After(10 * time.Second):
				// No takeover: the retry loop below fails the test.
			}
			return idem.Result{Status: 201, Body: []byte("slow")}, nil
		})
		slowErr <- err
	}()
	select {
	case <-started:
	case err := <-slowErr:
		t.Fatalf("the slow Do ended before its handler ran: %v", err)
	}

	// Retry until the lease ends and a retry runs; before that, each one
	// is told the key is in flight.
	var out idem.Outcome
	for attempt := 0; ; attempt++ {
		var err error
		out, err = e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
			close(taken)
			return idem.Result{Status: 201, Body: []byte("retry")}, nil
		})
		if err == nil {
			break
		}
		if !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("retry = %v, want idem.ErrInFlight until the lease ends", err)
		}
		if attempt > 200 {
			t.Fatal("the lease never ended")
		}
		time.Sleep(lease / 4)
	}
	if out.Replayed || string(out.Result.Body) != "retry" {
		t.Fatalf("takeover outcome = %+v, want the retry's fresh result", out)
	}
	if err := <-slowErr; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("slow Do = %v, want idem.ErrLeaseLost", err)
	}
	out, err := e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
		t.Error("ran after completion")
		return idem.Result{}, nil
	})
	if err != nil || !out.Replayed || string(out.Result.Body) != "retry" {
		t.Errorf("Do after the takeover = %+v, %v; want a replay of the retry's result", out, err)
	}
}

// When the heartbeat finds the lease gone (here the store's clock jumps
// past it and a retry takes over), it ends the handler's context with
// ErrLeaseLost and Do reports the lost lease.
func TestDoHeartbeatStopsHandlerOnLostLease(t *testing.T) {
	var skew atomic.Int64
	store := idemmem.NewStore(&idemmem.Config{NowFunc: func() time.Time {
		return time.Now().Add(time.Duration(skew.Load()))
	}})
	e := newEngine(t, store, &idem.Config{Lease: time.Minute, Heartbeat: 20 * time.Millisecond})
	op := idem.Operation{Tenant: "t", Key: "k"}

	started := make(chan struct{})
	var cause error
	slowErr := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			close(started)
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
				return idem.Result{}, ctx.Err()
			case <-time.After(10 * time.Second):
				// Completing makes Do succeed, which fails the test.
				return idem.Result{Status: 201}, nil
			}
		})
		slowErr <- err
	}()
	select {
	case <-started:
	case err := <-slowErr:
		t.Fatalf("the slow Do ended before its handler ran: %v", err)
	}
	skew.Store(int64(2 * time.Minute))
	out, err := e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
		return idem.Result{Status: 202}, nil
	})
	if err != nil || out.Replayed {
		t.Fatalf("takeover = %+v, %v; want a fresh run", out, err)
	}
	if err := <-slowErr; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do whose lease was taken = %v, want idem.ErrLeaseLost", err)
	}
	if !errors.Is(cause, idem.ErrLeaseLost) {
		t.Errorf("the handler's context ended with %v, want cause idem.ErrLeaseLost", cause)
	}
	// The taker's record is intact: the loser did not release it.
	rec, err := store.Get(context.Background(), op.Tenant, op.Key)
	if err != nil || rec.State != idem.StateComplete || rec.Result.Status != 202 {
		t.Errorf("record = %+v, %v; want the taker's complete record", rec, err)
	}
}

func TestValidateKey(t *testing.T) {
	var visible strings.Builder
	for c := byte(0x21); c <= 0x7e; c++ {
		visible.WriteByte(c)
	}
	for _, tc := range []struct {
		name string
		key  string
		ok   bool
	}{
		{"uuid", "4f8e1f9a-2a7b-4c1e-9d3f-0a1b2c3d4e5f", true},
		{"one character", "a", true},
		{"every visible ASCII character", visible.String(), true},
		{"255 characters", strings.Repeat("k", 255), true},
		{"empty", "", false},
		{"256 characters", strings.Repeat("k", 256), false},
		{"space", "a b", false},
		{"tab", "a\tb", false},
		{"newline", "a\nb", false},
		{"NUL", "a\x00", false},
		{"DEL", "a\x7f", false},
		{"non-ASCII", "café", false},
		{"invalid UTF-8", "a\xff", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := idem.ValidateKey(tc.key)
			switch {
			case tc.ok && err != nil:
				t.Errorf("ValidateKey(%q) = %v, want nil", tc.key, err)
			case !tc.ok && !errors.Is(err, idem.ErrInvalidKey):
				t.Errorf("ValidateKey(%q) = %v, want an error wrapping idem.ErrInvalidKey", tc.key, err)
			case !tc.ok && strings.Contains(err.Error(), "\n"):
				t.Errorf("ValidateKey(%q) error spans lines: %q", tc.key, err)
			}
		})
	}
}

// An invalid key is refused before the store is touched.
func TestDoInvalidKey(t *testing.T) {
	store := idemmem.NewStore(nil)
	e := newEngine(t, store, nil)
	for _, key := range []string{"", "a b", strings.Repeat("k", 256)} {
		_, err := e.Do(context.Background(), idem.Operation{Key: key}, func(context.Context) (idem.Result, error) {
			t.Errorf("fn ran for the invalid key %q", key)
			return idem.Result{}, nil
		})
		if !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("Do(%q) = %v, want idem.ErrInvalidKey", key, err)
		}
	}
	if n := store.Len(); n != 0 {
		t.Errorf("invalid keys left %d records", n)
	}
}

func TestNewEngine(t *testing.T) {
	if _, err := idem.NewEngine(nil, nil); err == nil {
		t.Error("NewEngine(nil, nil) = nil error, want one")
	}
	if _, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Lease: 10 * time.Second, Heartbeat: 30 * time.Second}); err == nil {
		t.Error("NewEngine accepted a heartbeat slower than the lease")
	}
	c := newEngine(t, idemmem.NewStore(nil), nil).Config()
	if c.Lease != idem.DefaultLease || c.Retention != idem.DefaultRetention ||
		c.Heartbeat != idem.DefaultLease/3 ||
		c.CleanupTimeout <= 0 || c.Logger == nil {
		t.Errorf("default config = %+v", c)
	}
}

// trackingStore counts the units of work opened and not yet ended, fails
// every Complete with failComplete, and every Begin after the first with
// failLaterBegin (a database gone between the handler and the completion).
type trackingStore struct {
	*idemmem.Store
	failComplete   error
	failLaterBegin error
	begun          atomic.Int32
	open           atomic.Int32
}

// Info claims a transactional store, so that Do takes the paths that
// roll back and begin again.
func (s *trackingStore) Info() idem.StoreInfo {
	return idem.StoreInfo{Name: "tracking", Transactional: true}
}

func (s *trackingStore) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	if s.begun.Add(1) > 1 && s.failLaterBegin != nil {
		return nil, s.failLaterBegin // as the SQL stores do: no Tx at all
	}
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	s.open.Add(1)
	return &trackingTx{UnitOfWork: tx, s: s}, nil
}

type trackingTx struct {
	idem.UnitOfWork
	s    *trackingStore
	done atomic.Bool
}

func (t *trackingTx) end() {
	if t.done.CompareAndSwap(false, true) {
		t.s.open.Add(-1)
	}
}

func (t *trackingTx) Complete(ctx context.Context, p idem.CompleteParams) error {
	if t.s.failComplete != nil {
		return t.s.failComplete
	}
	err := t.UnitOfWork.Complete(ctx, p)
	if err == nil {
		t.end()
	}
	return err
}

func (t *trackingTx) Rollback(ctx context.Context) error {
	t.end()
	return t.UnitOfWork.Rollback(ctx)
}

// Every unit of work Do opens is ended, whatever path Do takes: a
// connection-holding SQL transaction left open would leak.
func TestDoEndsEveryTx(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fail      error
		failBegin error
		rollback  bool
		fnErr     error
	}{
		{name: "complete"},
		{name: "rollback writes", rollback: true},
		{name: "handler error", fnErr: errors.New("boom")},
		{name: "complete fails", fail: errors.New("connection reset")},
		{name: "complete fails after rollback writes", fail: errors.New("connection reset"), rollback: true},
		// The unit of work that stores a 5xx cannot begin: a store error
		// (503 over HTTP) and the key released, not a panic on a nil Tx.
		{name: "begin fails after rollback writes", failBegin: errors.New("connection refused"), rollback: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &trackingStore{Store: idemmem.NewStore(nil), failComplete: tc.fail, failLaterBegin: tc.failBegin}
			e := newEngine(t, store, nil)
			var err error
			func() {
				defer func() {
					if v := recover(); v != nil {
						t.Fatalf("Do panicked: %v", v)
					}
				}()
				_, err = e.Do(context.Background(), idem.Operation{Key: "k"}, func(ctx context.Context) (idem.Result, error) {
					if tc.rollback {
						idem.RollbackWrites(ctx)
					}
					return idem.Result{Status: 500}, tc.fnErr
				})
			}()
			if (tc.fail != nil || tc.failBegin != nil) && !errors.Is(err, idem.ErrStore) {
				t.Errorf("Do = %v, want a store error", err)
			}
			if tc.failBegin != nil {
				if _, err := store.Get(context.Background(), "", "k"); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("record after the failed second Begin: %v, want it released", err)
				}
			}
			if n := store.open.Load(); n != 0 {
				t.Errorf("%d units of work left open", n)
			}
		})
	}
}

// A retention shorter than the lease must not let a retry take over a key
// whose lease still runs: the key would run twice at once.
func TestDoRetentionShorterThanLease(t *testing.T) {
	const retention = 100 * time.Millisecond
	store := idemmem.NewStore(nil)
	e := newEngine(t, store, &idem.Config{Lease: time.Minute, Retention: retention})
	op := idem.Operation{Key: "k"}

	started := make(chan time.Time, 1)
	finish := make(chan struct{})
	slowErr := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
			started <- time.Now()
			<-finish
			return idem.Result{Status: 201}, nil
		})
		slowErr <- err
	}()
	var at time.Time
	select {
	case at = <-started:
	case err := <-slowErr:
		t.Fatalf("the slow Do ended before its handler ran: %v", err)
	}
	time.Sleep(time.Until(at.Add(3 * retention)))
	_, err := e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
		t.Error("a retry ran while the first execution held a live lease")
		return idem.Result{Status: 202}, nil
	})
	close(finish)
	if !errors.Is(err, idem.ErrInFlight) {
		t.Errorf("retry under a live lease = %v, want idem.ErrInFlight", err)
	}
	if err := <-slowErr; err != nil {
		t.Errorf("first Do = %v, want its completion", err)
	}
}
