package idemredis

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/redis/go-redis/v9"
)

// The tests in this file fill a Redis of their own (maxmemory-policy
// noeviction, the policy New asks for, and a maxmemory below what the
// server already uses) and check what each script does on a full server.

// fullServer is a private redis-server with noeviction, and an admin
// client that fills and empties it.
type fullServer struct {
	*redisServer
	admin *redis.Client
}

func startFullServer(t *testing.T) *fullServer {
	t.Helper()
	srv := startRedis(t, "--maxmemory-policy", "noeviction")
	admin := redis.NewClient(&redis.Options{Addr: srv.addr})
	t.Cleanup(func() { _ = admin.Close() })
	return &fullServer{redisServer: srv, admin: admin}
}

// fill sets maxmemory below what the server uses, and checks that a
// plain write is now refused with OOM.
func (f *fullServer) fill(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := f.admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.admin.Set(ctx, "probe", "x", 0).Err(); !redis.IsOOMError(err) {
		t.Fatalf("SET on the filled server: %v, want OOM", err)
	}
}

// empty lifts the limit.
func (f *fullServer) empty(t *testing.T) {
	t.Helper()
	if err := f.admin.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
}

// now reads the server's clock.
func (f *fullServer) now(t *testing.T) time.Time {
	t.Helper()
	now, err := f.admin.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// store returns a store on the server whose completions are sent once:
// the tests look at what a refusal does.
func (f *fullServer) store(t *testing.T) *Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: f.addr, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	s, err := NewStore(c, &Config{CompleteTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// isRefusedClaim reports whether err is the engine's answer to a claim
// the server refused: a store error, marked as not applied, out of
// memory.
func isRefusedClaim(err error) bool {
	var se *idem.StoreError
	return errors.As(err, &se) && se.Op == "claim" && errors.Is(err, idem.ErrNotApplied) && redis.IsOOMError(err)
}

// TestFullRedisRunsNothingNew: on a full server a new key runs nothing,
// however often it is sent, and however many duplicates arrive at once:
// every claim is refused (503) before it writes. The claims that write
// nothing are still answered: a completed key replays, a key in flight
// answers in flight, another fingerprint is refused. The work under way
// finishes: its lease is extended, its answer stored, then replayed. A
// release still frees its key. Once memory is freed, a new key runs.
func TestFullRedisRunsNothingNew(t *testing.T) {
	ctx := context.Background()
	f := startFullServer(t)
	s := f.store(t)
	e, err := idem.NewEngine(s, &idem.Config{Lease: time.Minute, Heartbeat: -1, Logger: new(logBuffer).logger()})
	if err != nil {
		t.Fatal(err)
	}
	var executions sync.Map // key -> *atomic.Int32
	handler := func(key string, body string) func(context.Context) (idem.Result, error) {
		return func(context.Context) (idem.Result, error) {
			n, _ := executions.LoadOrStore(key, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			return idem.Result{Status: 201, Body: []byte(body)}, nil
		}
	}
	ran := func(key string) int32 {
		n, ok := executions.Load(key)
		if !ok {
			return 0
		}
		return n.(*atomic.Int32).Load()
	}
	op := func(key string) idem.Operation {
		return idem.Operation{Tenant: "t", Key: key, Fingerprint: []byte("fp")}
	}

	if _, err := e.Do(ctx, op("done"), handler("done", "stored before")); err != nil {
		t.Fatal(err)
	}
	// A handler under way when the server fills up.
	started, proceed := make(chan struct{}), make(chan struct{})
	running := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, op("running"), func(ctx context.Context) (idem.Result, error) {
			close(started)
			<-proceed
			return handler("running", "finished while full")(ctx)
		})
		running <- err
	}()
	<-started
	// A claim held without the engine, to extend and release.
	if r, err := s.Claim(ctx, claimParams("t", "held", "fp", 7)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	before, err := s.Get(ctx, "t", "held")
	if err != nil {
		t.Fatal(err)
	}

	f.fill(t)

	// One key, three calls: nothing runs, nothing is stored.
	for call := range 3 {
		_, err := e.Do(ctx, op("new"), handler("new", "must not run"))
		if !isRefusedClaim(err) {
			t.Fatalf("call %d of a new key on a full server: %v, want a refused claim", call+1, err)
		}
	}
	// Duplicates at one instant.
	errs := make([]error, 20)
	atonce.Run(len(errs), func(i int) {
		_, errs[i] = e.Do(ctx, op("burst"), handler("burst", "must not run"))
	})
	for i, err := range errs {
		if !isRefusedClaim(err) {
			t.Fatalf("duplicate %d on a full server: %v, want a refused claim", i, err)
		}
	}
	if n, m := ran("new"), ran("burst"); n != 0 || m != 0 {
		t.Fatalf("on a full server the new keys ran %d and %d times, want 0", n, m)
	}
	for _, key := range []string{"new", "burst"} {
		if _, err := s.Get(ctx, "t", key); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("record of %s after refused claims: %v, want none", key, err)
		}
	}

	// Claims that write nothing are answered.
	if out, err := e.Do(ctx, op("done"), handler("done", "ran again")); err != nil || !out.Replayed || string(out.Result.Body) != "stored before" {
		t.Fatalf("completed key on a full server: %+v %v, want its replay", out, err)
	}
	if _, err := e.Do(ctx, op("running"), handler("running", "ran twice")); !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("key in flight on a full server: %v, want ErrInFlight", err)
	}
	other := op("done")
	other.Fingerprint = []byte("other")
	if _, err := e.Do(ctx, other, handler("done", "ran again")); !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("another fingerprint on a full server: %v, want ErrFingerprintMismatch", err)
	}

	// The work under way goes on: an extension, a completion.
	if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "held", Token: 7, Lease: 2 * time.Minute}); err != nil {
		t.Fatalf("extend on a full server: %v", err)
	}
	after, err := s.Get(ctx, "t", "held")
	if err != nil {
		t.Fatal(err)
	}
	if !after.LockedUntil.After(before.LockedUntil) {
		t.Fatalf("extend on a full server left the lease at %v (was %v)", after.LockedUntil, before.LockedUntil)
	}
	close(proceed)
	if err := <-running; err != nil {
		t.Fatalf("completion of the handler under way on a full server: %v", err)
	}
	if out, err := e.Do(ctx, op("running"), handler("running", "ran twice")); err != nil || !out.Replayed || string(out.Result.Body) != "finished while full" {
		t.Fatalf("retry of the key completed on a full server: %+v %v, want its replay", out, err)
	}
	if n := ran("running"); n != 1 {
		t.Fatalf("the handler under way ran %d times, want 1", n)
	}
	// A release frees memory, and its key.
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "held", Token: 7}); err != nil {
		t.Fatalf("release on a full server: %v", err)
	}
	if _, err := s.Get(ctx, "t", "held"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("released key on a full server: %v, want gone", err)
	}

	f.empty(t)
	if out, err := e.Do(ctx, op("new"), handler("new", "ran once")); err != nil || out.Replayed {
		t.Fatalf("new key once memory is freed: %+v %v", out, err)
	}
	if n := ran("new"); n != 1 {
		t.Fatalf("the new key ran %d times, want 1", n)
	}
}

// TestFullRedisBeforeRedis7: a server before Redis 7 knows no script
// flags, and refuses a script's first write that may grow memory. The
// store sends the scripts without flags there (Redis 7 runs such scripts
// the same way, which this test uses): a new key still runs nothing and a
// release still frees its key, but the extension and the completion are
// refused too.
func TestFullRedisBeforeRedis7(t *testing.T) {
	ctx := context.Background()
	f := startFullServer(t)
	s := f.store(t)
	s.plain.Store(true)
	e, err := idem.NewEngine(s, &idem.Config{Lease: time.Minute, Heartbeat: -1, Logger: new(logBuffer).logger()})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := s.Claim(ctx, claimParams("t", "held", "fp", 7)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	f.fill(t)

	ran := 0
	for call := range 3 {
		_, err := e.Do(ctx, idem.Operation{Tenant: "t", Key: "new", Fingerprint: []byte("fp")}, func(context.Context) (idem.Result, error) {
			ran++
			return idem.Result{Status: 201}, nil
		})
		if !isRefusedClaim(err) {
			t.Fatalf("call %d of a new key on a full server: %v, want a refused claim", call+1, err)
		}
	}
	if ran != 0 {
		t.Fatalf("a new key ran %d times on a full server", ran)
	}
	if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "held", Token: 7, Lease: time.Minute}); !redis.IsOOMError(err) {
		t.Fatalf("extend on a full server: %v, want OOM", err)
	}
	unit, _ := s.Begin(ctx)
	if err := unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "held", Token: 7, Result: idem.Result{Status: 201}}); !redis.IsOOMError(err) {
		t.Fatalf("complete on a full server: %v, want OOM", err)
	}
	if rec, err := s.Get(ctx, "t", "held"); err != nil || rec.State != idem.StateInFlight || rec.LeaseToken != 7 {
		t.Fatalf("record after a refused extension and completion: %+v %v, want in flight under 7", rec, err)
	}
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "held", Token: 7}); err != nil {
		t.Fatalf("release on a full server: %v", err)
	}
	if _, err := s.Get(ctx, "t", "held"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("released key on a full server: %v, want gone", err)
	}
}

// TestRefusedCompletionKeepsKey: the handler ran, then the server refused
// its completion: full before Redis 7, or turned into a read-only replica
// (as after a failover). Its effects stand, so the engine must not free
// the key: the execution fails with a store error, and every retry gets
// ErrInFlight until the lease ends on the server's clock, even once the
// server takes writes again. Then a retry takes the key over and runs the
// handler a second time: the window docs/STORES.md describes.
func TestRefusedCompletionKeepsKey(t *testing.T) {
	for _, c := range []struct {
		name           string
		plain          bool
		refuse, accept func(f *fullServer, t *testing.T)
	}{
		{"full before Redis 7", true, (*fullServer).fill, (*fullServer).empty},
		{"read-only replica", false, func(f *fullServer, t *testing.T) {
			// A master of its own that never answers: the server keeps its
			// data and refuses writes.
			if err := f.admin.Do(context.Background(), "REPLICAOF", "127.0.0.1", freePortPair(t)).Err(); err != nil {
				t.Fatal(err)
			}
		}, func(f *fullServer, t *testing.T) {
			if err := f.admin.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			f := startFullServer(t)
			s := f.store(t)
			s.plain.Store(c.plain)
			// Long enough that the first retry, sent at once, meets the lease
			// however slow the machine.
			const lease = 5 * time.Second
			e, err := idem.NewEngine(s, &idem.Config{Lease: lease, Heartbeat: -1, Logger: new(logBuffer).logger()})
			if err != nil {
				t.Fatal(err)
			}
			op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp")}
			var executions atomic.Int32
			handler := func(ctx context.Context) (idem.Result, error) {
				if executions.Add(1) == 1 {
					c.refuse(f, t)
				}
				return idem.Result{Status: 201}, nil
			}
			_, err = e.Do(ctx, op, handler)
			var se *idem.StoreError
			if !errors.As(err, &se) || se.Op != "complete" {
				t.Fatalf("execution whose completion was refused: %v, want a complete *idem.StoreError", err)
			}
			rec, err := s.Get(ctx, "t", "k")
			if err != nil || rec.State != idem.StateInFlight {
				t.Fatalf("record after the refused completion: %+v %v, want in flight", rec, err)
			}
			// Retries while the server still refuses writes are answered
			// without running.
			if _, err := e.Do(ctx, op, handler); !errors.Is(err, idem.ErrInFlight) {
				t.Fatalf("retry while the server refuses writes: %v, want ErrInFlight", err)
			}
			c.accept(f, t)

			inFlight := 0
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no retry took the key over in 30s (%d got ErrInFlight)", inFlight)
				}
				out, err := e.Do(ctx, op, handler)
				if errors.Is(err, idem.ErrInFlight) {
					inFlight++
					continue
				}
				if err != nil {
					t.Fatalf("retry: %v", err)
				}
				if out.Replayed {
					t.Fatalf("retry replayed %+v: nothing was stored", out)
				}
				if now := f.now(t); now.Before(rec.LockedUntil) {
					t.Fatalf("a retry ran the handler again at %v, before the lease ended at %v", now, rec.LockedUntil)
				}
				break
			}
			if inFlight == 0 {
				t.Fatal("no retry met the key in flight once the server took writes again")
			}
			if n := executions.Load(); n != 2 {
				t.Fatalf("%d executions, want 2: the first, and the takeover once its lease ended", n)
			}
		})
	}
}
