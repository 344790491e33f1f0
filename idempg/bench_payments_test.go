package idempg_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// paymentClients is how many clients pay at the same instant in
// BenchmarkPayments.
const paymentClients = 16

// cardNetwork is how long the payments handler waits for the card
// network before it writes.
const cardNetwork = 100 * time.Millisecond

// BenchmarkPayments measures what a handler that calls a slow service
// before its first query costs in pool connections: 16 clients pay at
// once, each handler waits 100ms for "the card network", then inserts its
// payment, on a pool of pgxpool's default size (4 connections on 2 CPUs,
// fewer than the clients). "keyed" runs each payment through the engine
// with a fresh key; "unkeyed" calls the handler directly, its insert going
// to the pool. A round is the 16 payments; round-ms is its wall time,
// p50-ms and max-ms the payments' latencies within it. Run it with
//
//	go test -run '^$' -bench Payments -benchtime 20x ./idempg/
//
// A unit of work that took its connection before the handler ran would
// hold 4 connections asleep and run the 16 payments in 4 waves (above
// 400ms a round); taken at the first query, every payment sleeps at once.
func BenchmarkPayments(b *testing.B) {
	url := testenv.PostgresSchema(b)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url) // the default size, as a new user's
	if err != nil {
		testenv.Unavailable(b, "PostgreSQL", err)
	}
	b.Cleanup(pool.Close)
	if err := idempg.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, ref text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	eng := mustEngine(b, testenv.Must(idempg.NewStore(pool, nil)))
	pay := func(ref string) func(ctx context.Context) (idem.Result, error) {
		return func(ctx context.Context) (idem.Result, error) {
			time.Sleep(cardNetwork) // the card network answers
			_, err := idempg.DB(ctx, pool).Exec(ctx, `INSERT INTO payments (ref) VALUES ($1)`, ref)
			return idem.Result{Status: 201}, err
		}
	}
	var seq atomic.Int64
	run := func(b *testing.B, one func(ref string) error) {
		var rounds, latencies []time.Duration
		for b.Loop() {
			lat := make([]time.Duration, paymentClients)
			errs := make([]error, paymentClients)
			start := time.Now()
			atonce.Run(paymentClients, func(i int) {
				t0 := time.Now()
				errs[i] = one(fmt.Sprint("pay-", seq.Add(1)))
				lat[i] = time.Since(t0)
			})
			rounds = append(rounds, time.Since(start))
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
			latencies = append(latencies, lat...)
		}
		slices.Sort(rounds)
		slices.Sort(latencies)
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		b.ReportMetric(ms(rounds[len(rounds)/2]), "round-ms")
		b.ReportMetric(ms(latencies[len(latencies)/2]), "p50-ms")
		b.ReportMetric(ms(latencies[len(latencies)-1]), "max-ms")
		b.ReportMetric(0, "ns/op")
	}
	b.Run("keyed", func(b *testing.B) {
		run(b, func(ref string) error {
			_, err := eng.Do(ctx, idem.Operation{Tenant: "shop", Key: ref}, pay(ref))
			return err
		})
	})
	b.Run("unkeyed", func(b *testing.B) {
		run(b, func(ref string) error {
			_, err := pay(ref)(ctx)
			return err
		})
	})
}
