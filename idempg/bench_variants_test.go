package idempg

import (
	"context"
	"fmt"
	"io/fs"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The benchmarks in this file measure what each design step of the store
// buys, by running the engine over variants that undo one step each:
//
//   - syncclaim: the claim commits synchronously (no set_config), so it
//     waits for its own WAL flush;
//   - lockreplay: the claim has no read guard, so a replay goes through
//     ON CONFLICT DO UPDATE, which locks the row (a transaction id and a
//     WAL record) even when its WHERE refuses the update;
//   - twotrip: the completion and the COMMIT are two round trips;
//   - eagerbegin: Begin takes a connection and sends BEGIN, in a round
//     trip of its own, before the handler runs;
//   - nowaiters: the schema without migration 0004 (the waiters column and
//     the idem_complete that notifies the waiters it marks), what a
//     completion cost before the wait mode, which must keep the fast path
//     as it was.
//
// Every variant, and the baselines, send one statement per claim
// (ClaimBatchSize 1), since the claim variants edit that statement; the
// Batched benchmarks put claims in batches back (idempg's default), to be
// compared with the baselines.
//
// Compare with BenchmarkVariantFreshBaseline and
// BenchmarkVariantReplayBaseline, run in the same process. One step was
// measured and dropped: preparing idem_complete once per connection
// (instead of an unnamed statement parsed on each completion) made no
// difference beyond the noise, so the completion stays unprepared.

// variantEngine returns an engine over a fresh schema whose store edit
// changed, wrapped by wrap when not nil.
func variantEngine(b *testing.B, edit func(s *Store), wrap func(s *Store) idem.Store) *idem.Engine {
	b.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresSchema(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		testenv.Unavailable(b, "PostgreSQL", err)
	}
	b.Cleanup(pool.Close)
	if err := Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, ref text NOT NULL, note text)`); err != nil {
		b.Fatal(err)
	}
	s := testenv.Must(NewStore(pool, &Config{ClaimBatchSize: 1}))
	var store idem.Store = s
	if edit != nil {
		edit(s)
	}
	if wrap != nil {
		store = wrap(s)
	}
	eng, err := idem.NewEngine(store, &idem.Config{Heartbeat: -1})
	if err != nil {
		b.Fatal(err)
	}
	return eng
}

func syncClaim(s *Store) {
	s.claimQuery = strings.Replace(claimSQL, "'off'", "'on'", 1)
	if s.claimQuery == claimSQL {
		panic("syncClaim: claimSQL changed; update the variant")
	}
}

func lockReplay(s *Store) {
	const guard = "WHERE NOT EXISTS (SELECT FROM cur WHERE NOT cur.claimable)"
	s.claimQuery = strings.Replace(claimSQL, guard, "", 1)
	if s.claimQuery == claimSQL {
		panic("lockReplay: claimSQL changed; update the variant")
	}
}

// batched sends claims in batches, as New does.
func batched(s *Store) {
	s.batcher = testenv.Must(NewStore(s.pool, nil)).batcher
	s.batcher.store = s
}

// noWaiters undoes migration 0004: idem_complete as 0002 made it, no
// waiters column.
func noWaiters(s *Store) {
	complete, err := fs.ReadFile(idemmigrate.Files(idemmigrate.Postgres), "0002_idem_complete.sql")
	if err == nil {
		_, err = s.pool.Exec(context.Background(), string(complete)+`; ALTER TABLE idem_keys DROP COLUMN waiters`)
	}
	if err != nil {
		panic(fmt.Sprintf("noWaiters: %v; update the variant", err))
	}
}

func twoTrip(s *Store) idem.Store { return twoTripStore{s} }

func eagerBegin(s *Store) idem.Store { return eagerBeginStore{s} }

// eagerBeginStore begins the transaction in Begin, with a round trip.
type eagerBeginStore struct{ *Store }

func (s eagerBeginStore) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.(*unit).begin(ctx); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// twoTripStore completes with an UPDATE round trip, then a COMMIT one.
type twoTripStore struct{ *Store }

func (s twoTripStore) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return twoTripUnit{tx.(*unit)}, nil
}

type twoTripUnit struct{ *unit }

func (u twoTripUnit) Complete(ctx context.Context, p idem.CompleteParams) error {
	if err := (&Store{}).CompleteTx(ctx, u.tx, p); err != nil {
		return err
	}
	if u.state.Swap(unitEnded) != unitOpen {
		return nil
	}
	defer u.conn.Release()
	return u.tx.Commit(ctx)
}

func benchEngine(b *testing.B, eng *idem.Engine, replay bool) {
	ctx := context.Background()
	var seq atomic.Int64
	op := func(i int64) error {
		key := fmt.Sprint("k", i)
		if replay {
			key = "replayed"
		}
		_, err := eng.Do(ctx, idem.Operation{Tenant: "bench", Key: key}, func(ctx context.Context) (idem.Result, error) {
			_, err := TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (ref) VALUES ($1)`, fmt.Sprint(i))
			return idem.Result{Status: 201, Body: []byte(`{"id":"ord_1"}`)}, err
		})
		return err
	}
	if replay {
		if err := op(0); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			if err := op(seq.Add(1)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel16", func(b *testing.B) {
		b.SetParallelism((16 + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := op(seq.Add(1)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkVariantFreshBaseline(b *testing.B) { benchEngine(b, variantEngine(b, nil, nil), false) }
func BenchmarkVariantFreshSyncClaim(b *testing.B) {
	benchEngine(b, variantEngine(b, syncClaim, nil), false)
}
func BenchmarkVariantFreshTwoTrip(b *testing.B) {
	benchEngine(b, variantEngine(b, nil, twoTrip), false)
}
func BenchmarkVariantFreshEagerBegin(b *testing.B) {
	benchEngine(b, variantEngine(b, nil, eagerBegin), false)
}
func BenchmarkVariantFreshNoWaiters(b *testing.B) {
	benchEngine(b, variantEngine(b, noWaiters, nil), false)
}
func BenchmarkVariantFreshBatched(b *testing.B) {
	benchEngine(b, variantEngine(b, batched, nil), false)
}
func BenchmarkVariantReplayBaseline(b *testing.B) { benchEngine(b, variantEngine(b, nil, nil), true) }
func BenchmarkVariantReplayBatched(b *testing.B) {
	benchEngine(b, variantEngine(b, batched, nil), true)
}
func BenchmarkVariantReplayLock(b *testing.B) {
	benchEngine(b, variantEngine(b, lockReplay, nil), true)
}
