package idemsql_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
)

// TestSQLiteNoBusy runs many executions at once on several keys, from two
// handles on one file as two processes would: with WAL, the busy timeout
// and BEGIN IMMEDIATE, every one waits its turn and none sees SQLITE_BUSY.
func TestSQLiteNoBusy(t *testing.T) {
	env := newTestDB(t, idemsql.SQLite)
	ctx := context.Background()
	engines := make([]*idem.Engine, 2)
	for i, st := range []idem.Store{env.store, env.peer} {
		e, err := idem.NewEngine(st, &idem.Config{Heartbeat: -1})
		if err != nil {
			t.Fatal(err)
		}
		engines[i] = e
	}
	tenant := newName("tenant")
	const keys, perKey = 8, 12
	var runs atomic.Int32
	errs := make([]error, keys*perKey)
	atOnce(keys*perKey, func(i int) {
		key := fmt.Sprintf("order-%d", i%keys)
		op := idem.Operation{Tenant: tenant, Key: key}
		_, errs[i] = engines[i%2].Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			runs.Add(1)
			return idem.Result{Status: 201}, env.businessWrite(ctx, tenant+key)
		})
	})
	for i, err := range errs {
		if err != nil && !errors.Is(err, idem.ErrInFlight) {
			t.Errorf("Do %d: %v", i, err)
		}
	}
	if n := runs.Load(); n != keys {
		t.Fatalf("%d runs for %d keys", n, keys)
	}
	for k := range keys {
		mustCount(t, env, fmt.Sprintf("%sorder-%d", tenant, k), 1)
	}
}

// logRecords is a slog.Handler that keeps the messages of the records it
// is given.
type logRecords struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecords) WithGroup(string) slog.Handler            { return l }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	l.mu.Lock()
	l.msgs = append(l.msgs, b.String())
	l.mu.Unlock()
	return nil
}

func (l *logRecords) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.msgs)
}

// watchedStore reports the engine's calls of Extend and Claim.
type watchedStore struct {
	*idemsql.Store
	extends chan extendCall // one per Extend, once it returned
	inClaim atomic.Int32    // claims started
}

type extendCall struct {
	started time.Time
	err     error
}

func watch(st *idemsql.Store) *watchedStore {
	return &watchedStore{Store: st, extends: make(chan extendCall, 1000)}
}

func (w *watchedStore) Extend(ctx context.Context, p idem.ExtendParams) error {
	started := time.Now()
	err := w.Store.Extend(ctx, p)
	w.extends <- extendCall{started, err}
	return err
}

func (w *watchedStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	w.inClaim.Add(1)
	return w.Store.Claim(ctx, p)
}

// holdPastLease waits, in a handler whose transaction holds the write lock
// since locked, until an extension started since then has returned and
// the lease has run out on the database's clock: the heartbeat beat while
// the lock was held, and wrote nothing.
func holdPastLease(t *testing.T, env *testDB, st *watchedStore, op idem.Operation, locked time.Time) {
	t.Helper()
	held := lockedUntil(t, env, op.Tenant, op.Key)
	beat := false
	for !beat || !leaseEnded(t, env, op.Tenant, op.Key) {
		call := <-st.extends
		if call.err != nil {
			t.Errorf("Extend while the handler holds the lock: %v", call.err)
		}
		beat = beat || call.started.After(locked)
	}
	if now := lockedUntil(t, env, op.Tenant, op.Key); !now.Equal(held) {
		t.Fatalf("the lease moved from %v to %v while the handler held the lock", held, now)
	}
}

func lockedUntil(t *testing.T, env *testDB, tenant, key string) time.Time {
	t.Helper()
	var micros int64
	if err := env.peerDB.QueryRow(`SELECT locked_until FROM idem_keys WHERE tenant_id = ? AND idem_key = ?`, tenant, key).Scan(&micros); err != nil {
		t.Fatal(err)
	}
	return time.UnixMicro(micros)
}

// leaseEnded reports whether the lease on (tenant, key) has ended on the
// database's clock. It reads beside a running writer (WAL).
func leaseEnded(t *testing.T, env *testDB, tenant, key string) bool {
	t.Helper()
	var ended bool
	err := env.peerDB.QueryRow(`SELECT locked_until < CAST(round(unixepoch('subsec') * 1000000) AS INTEGER)
FROM idem_keys WHERE tenant_id = ? AND idem_key = ?`, tenant, key).Scan(&ended)
	if err != nil {
		t.Fatal(err)
	}
	return ended
}

// TestSQLiteHeartbeatHoldingTheLock: a handler whose transaction holds the
// write lock for longer than its lease completes without a heartbeat
// failure: the extensions skip the write they would wait for (no other
// writer can take the key over meanwhile), instead of failing on their
// deadline every beat.
func TestSQLiteHeartbeatHoldingTheLock(t *testing.T) {
	env := newTestDB(t, idemsql.SQLite)
	ctx := context.Background()
	logs := &logRecords{}
	st := watch(env.store)
	engine := newEngine(t, st, &idem.Config{Lease: 300 * time.Millisecond, Logger: slog.New(logs)})
	op := idem.Operation{Tenant: newName("tenant"), Key: "slow", Fingerprint: []byte("fp")}
	business := newName("order")
	out, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if err := env.businessWrite(ctx, business); err != nil {
			return idem.Result{}, err
		}
		holdPastLease(t, env, st, op, time.Now())
		return idem.Result{Status: 201}, nil
	})
	if err != nil || out.Result.Status != 201 {
		t.Fatalf("Do = %+v, %v", out, err)
	}
	mustCount(t, env, business, 1)
	for _, m := range logs.all() {
		t.Errorf("logged: %s", m)
	}
}

// TestSQLiteRollbackExtendsLease: when the transaction that held the lock
// past the lease is rolled back (Tx.Rollback) and the handler goes on,
// the lease is extended in the same step: a retry from another process,
// whose claim waits for the lock meanwhile, finds the key in flight and
// does not take it over.
func TestSQLiteRollbackExtendsLease(t *testing.T) {
	env := newTestDB(t, idemsql.SQLite)
	ctx := context.Background()
	st, peer := watch(env.store), watch(env.peer)
	engine := newEngine(t, st, &idem.Config{Lease: 300 * time.Millisecond})
	op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1", Fingerprint: []byte("fp")}
	out, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if err := env.businessWrite(ctx, newName("order")); err != nil {
			return idem.Result{}, err
		}
		holdPastLease(t, env, st, op, time.Now())
		type claimed struct {
			res idem.ClaimResult
			err error
		}
		retry := make(chan claimed, 1)
		go func() {
			res, err := peer.Claim(ctx, claimParams(op.Tenant, op.Key, "fp"))
			retry <- claimed{res, err}
		}()
		for peer.inClaim.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		if err := idemsql.TxFromContext(ctx).Rollback(); err != nil {
			return idem.Result{}, err
		}
		r := <-retry
		x, _ := idem.ExecutionFromContext(ctx)
		if r.err != nil || r.res.Won || r.res.Record.LeaseToken != x.LeaseToken {
			t.Errorf("a retry's claim at the rollback: %+v, %v; want it lost to the running execution", r.res, r.err)
		}
		return idem.Result{Status: 402}, nil
	})
	if err != nil || out.Result.Status != 402 {
		t.Fatalf("Do = %+v, %v; want the 402 stored", out, err)
	}
}

// TestSQLiteDuplicates pins down what a duplicate gets on SQLite. While the
// first execution has made no statement, its transaction holds nothing,
// and duplicates meet the key in flight (409), as on every database. Once
// its transaction holds the write lock, a duplicate's claim, a write,
// waits for the commit and finds the answer to replay. Duplicates come
// from this process and from another one on the same file.
func TestSQLiteDuplicates(t *testing.T) {
	const n = 20
	for _, inTx := range []bool{false, true} {
		t.Run(map[bool]string{false: "before the first statement", true: "inside the transaction"}[inTx], func(t *testing.T) {
			env := newTestDB(t, idemsql.SQLite)
			ctx := context.Background()
			here, there := watch(env.store), watch(env.peer)
			engines := []*idem.Engine{newEngine(t, here, nil), newEngine(t, there, nil)}
			op := idem.Operation{Tenant: newName("tenant"), Key: "order-1", Fingerprint: []byte("fp")}
			business := newName("order")
			entered, proceed := make(chan struct{}), make(chan struct{})
			first := make(chan error, 1)
			go func() {
				out, err := engines[0].Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
					if inTx {
						if err := env.businessWrite(ctx, business); err != nil {
							return idem.Result{}, err
						}
					}
					close(entered)
					<-proceed
					if !inTx {
						if err := env.businessWrite(ctx, business); err != nil {
							return idem.Result{}, err
						}
					}
					return idem.Result{Status: 201, Body: []byte("made")}, nil
				})
				if err == nil && (out.Replayed || out.Result.Status != 201) {
					err = errors.New("not the fresh 201")
				}
				first <- err
			}()
			<-entered
			claimsBefore := here.inClaim.Load() + there.inClaim.Load()
			outs := make([]idem.Outcome, n)
			errs := make([]error, n)
			dups := make(chan struct{})
			go func() {
				defer close(dups)
				atOnce(n, func(i int) {
					outs[i], errs[i] = engines[i%2].Do(ctx, op, func(context.Context) (idem.Result, error) {
						return idem.Result{}, errors.New("a duplicate ran")
					})
				})
			}()
			if inTx {
				// Let the first execution commit once every duplicate is in
				// its claim, waiting for the lock.
				for here.inClaim.Load()+there.inClaim.Load() < claimsBefore+n {
					time.Sleep(time.Millisecond)
				}
			} else {
				<-dups
			}
			close(proceed)
			if err := <-first; err != nil {
				t.Fatalf("first execution: %v", err)
			}
			<-dups
			for i := range n {
				switch {
				case !inTx && !errors.Is(errs[i], idem.ErrInFlight):
					t.Errorf("duplicate %d (process %d): %+v, %v; want idem.ErrInFlight", i, i%2, outs[i], errs[i])
				case inTx && (errs[i] != nil || !outs[i].Replayed || string(outs[i].Result.Body) != "made"):
					t.Errorf("duplicate %d (process %d): %+v, %v; want the replay", i, i%2, outs[i], errs[i])
				}
			}
			mustCount(t, env, business, 1)
		})
	}
}

// TestSQLiteManyKeysAtOnce: 40 requests for 40 keys at one barrier, from
// two processes on one file, with handlers that take 300 ms before their
// write, or hold the lock for 20 ms: every one completes, none meets a
// locked database.
func TestSQLiteManyKeysAtOnce(t *testing.T) {
	const n = 40
	for _, holding := range []bool{false, true} {
		t.Run(map[bool]string{false: "work before the write", true: "work holding the lock"}[holding], func(t *testing.T) {
			env := newTestDB(t, idemsql.SQLite)
			ctx := context.Background()
			engines := []*idem.Engine{newEngine(t, env.store, &idem.Config{}), newEngine(t, env.peer, &idem.Config{})}
			tenant := newName("tenant")
			errs := make([]error, n)
			atOnce(n, func(i int) {
				key := fmt.Sprintf("order-%d", i)
				var out idem.Outcome
				out, errs[i] = engines[i%2].Do(ctx, idem.Operation{Tenant: tenant, Key: key}, func(ctx context.Context) (idem.Result, error) {
					if !holding {
						time.Sleep(300 * time.Millisecond) // another service
					}
					if err := env.businessWrite(ctx, tenant+key); err != nil {
						return idem.Result{}, err
					}
					if holding {
						time.Sleep(20 * time.Millisecond)
					}
					return idem.Result{Status: 201}, nil
				})
				if errs[i] == nil && out.Result.Status != 201 {
					errs[i] = fmt.Errorf("answered %d", out.Result.Status)
				}
			})
			for i, err := range errs {
				if err != nil {
					t.Errorf("key %d: %v", i, err)
				}
			}
			for i := range n {
				mustCount(t, env, fmt.Sprintf("%sorder-%d", tenant, i), 1)
			}
		})
	}
}

// TestSQLiteInterruptEndsTransaction: a statement whose context ends while
// it writes is interrupted, and SQLite then rolls back the whole
// transaction. The handler's later statements must not commit on their
// own, nor its answer be stored.
func TestSQLiteInterruptEndsTransaction(t *testing.T) {
	env := newTestDB(t, idemsql.SQLite)
	ctx := context.Background()
	engine := newEngine(t, env.store, nil)
	op := idem.Operation{Tenant: newName("tenant"), Key: "order-1"}
	before, after := newName("before"), newName("after")
	var bulkErr, afterErr error
	_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if err := env.businessWrite(ctx, before); err != nil {
			return idem.Result{}, err
		}
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		// Far longer than the deadline: a hundred million rows.
		_, bulkErr = idemsql.TxFromContext(ctx).ExecContext(short, `INSERT INTO business (id)
WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n LIMIT 100000000) SELECT 'bulk' FROM n`)
		afterErr = env.businessWrite(ctx, after)
		return idem.Result{Status: 201}, nil
	})
	if !errors.Is(bulkErr, idemsql.ErrTxEnded) || !errors.Is(afterErr, idemsql.ErrTxEnded) {
		t.Errorf("the interrupted statement: %v; the next one: %v; want both ErrTxEnded", bulkErr, afterErr)
	}
	if !errors.Is(err, idemsql.ErrTxEnded) {
		t.Errorf("Do = %v, want an error wrapping idemsql.ErrTxEnded", err)
	}
	for _, id := range []string{before, after, "bulk"} {
		mustCount(t, env, id, 0)
	}
	if _, err := env.store.Get(ctx, op.Tenant, op.Key); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get = %v, want ErrNotFound (released)", err)
	}
}
