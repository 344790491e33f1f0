package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Store is an idem.Store on PostgreSQL through a pgx connection pool. It
// holds no state of its own besides the pool, so any number of Stores, in
// any number of processes, may share one database. The zero value is not
// usable; call NewStore.
type Store struct {
	pool *pgxpool.Pool
	// claimQuery is claimSQL; the benchmarks swap in variants of it to
	// measure what each part of the statement buys.
	claimQuery string
	// batcher runs claims in batches; nil when Config.ClaimBatchSize is 1.
	batcher *claimBatcher
	// listen is the LISTEN connection of Watch and its subscribers.
	listen *listener
	// single is Config.SingleTransaction.
	single bool
}

// DefaultClaimBatchSize is Config.ClaimBatchSize when it is left zero.
const DefaultClaimBatchSize = 64

// Config tunes a Store. A nil *Config, like the zero value, means every
// default.
type Config struct {
	// ClaimBatchSize is how many claims may share one statement. Claims
	// that arrive while a claim statement of this Store is running wait
	// for it to return and then go together, as one statement, one round
	// trip and one commit, instead of one each: under concurrent load
	// this divides the claim's cost in PostgreSQL and in Go by the batch
	// size, and a lone claim still goes out at once. Each claim keeps the
	// guarantees of the single statement (see "Claims in batches" in the
	// package documentation). Zero means DefaultClaimBatchSize; 1 turns
	// batching off: every claim is its own statement, run concurrently on
	// the pool.
	ClaimBatchSize int

	// ClaimConcurrency is how many claim statements of this Store may run
	// at once when claims are batched; claims queue only when that many
	// are running. Zero means DefaultClaimConcurrency, 1: the largest
	// batches and the least work per claim for the database, which is
	// what a busy database needs. The price is waiting: under concurrent
	// load a claim waits for the statement in flight, half a round trip
	// on average. Where the database is far (a round trip of milliseconds)
	// and has CPU to spare, a higher value, or ClaimBatchSize 1, answers
	// sooner; docs/BENCHMARKS.md measures both cases.
	ClaimConcurrency int

	// SingleTransaction claims each key inside the handler's own
	// transaction instead of committing an in-flight record first: the
	// claim takes a lock named after the key, the completed record is
	// inserted once, with the handler's writes, and the lock is released
	// after the COMMIT. A fresh request then costs one write and one
	// commit, as the bare handler does plus one row; a duplicate waits for
	// the first execution (up to the operation's WaitInFlight, idemhttp's
	// Config.WaitInFlight) and gets its answer, or ErrInFlight (409) after
	// that. There is no lease to extend and nothing to take over: when the
	// holder dies, PostgreSQL rolls its transaction back and frees the
	// lock. What it gives up: an execution in flight is invisible to other
	// connections (Get, idem inspect and the console see records only
	// once complete), recovery points (idem.Step) are refused, and every
	// execution holds a pool connection from its claim to its end. See
	// "Single-transaction mode" in the package documentation. Defaults to
	// false. The claim batching settings above do not apply to it.
	SingleTransaction bool
}

// DefaultClaimConcurrency is Config.ClaimConcurrency when it is left zero.
const DefaultClaimConcurrency = 1

var (
	_ idem.Store     = (*Store)(nil)
	_ idem.StepStore = (*Store)(nil)
)

// Info implements idem.Store: "postgresql", transactional.
func (s *Store) Info() idem.StoreInfo {
	return idem.StoreInfo{Name: "postgresql", Transactional: true, SingleTransaction: s.single}
}

// NewStore returns a store over pool; config may be nil for the defaults.
// The tables and the idem_complete function must exist: run Migrate (or
// the files of idemmigrate) first. The store finds them through the
// connections' search_path, so one database may hold several idem
// schemas.
func NewStore(pool *pgxpool.Pool, config *Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("idempg: NewStore needs a pool")
	}
	cfg := Config{}
	if config != nil {
		cfg = *config
	}
	if cfg.ClaimBatchSize < 0 || cfg.ClaimConcurrency < 0 {
		return nil, fmt.Errorf("idempg: Config.ClaimBatchSize (%d) and Config.ClaimConcurrency (%d) must not be negative", cfg.ClaimBatchSize, cfg.ClaimConcurrency)
	}
	s := &Store{pool: pool, claimQuery: claimSQL, single: cfg.SingleTransaction}
	s.listen = &listener{store: s}
	size := DefaultClaimBatchSize
	if cfg.ClaimBatchSize > 0 {
		size = cfg.ClaimBatchSize
	}
	if size > 1 {
		running := DefaultClaimConcurrency
		if cfg.ClaimConcurrency > 0 {
			running = cfg.ClaimConcurrency
		}
		s.batcher = &claimBatcher{store: s, maxSize: size, maxRunning: running}
	}
	return s, nil
}

// micros passes a duration to SQL as whole microseconds, PostgreSQL's
// timestamp resolution, so the server adds it to its own now(): the store
// never sends a timestamp read from an application server's clock.
func micros(d time.Duration) int64 { return d.Microseconds() }

// Get implements idem.Store. It reads the record whatever its state or
// retention, its recovery points included, and returns idem.ErrNotFound
// when there is none.
func (s *Store) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	row := s.pool.QueryRow(ctx, `SELECT `+recordColumns+`, steps FROM idem_keys WHERE tenant_id = $1 AND idem_key = $2`, tenant, key)
	var r scannedRecord
	var steps []byte
	if err := row.Scan(append(r.dest(), &steps)...); err != nil {
		return nil, interpretError(err)
	}
	rec, err := r.record(tenant, key)
	if err != nil {
		return nil, err
	}
	if rec.Steps, err = decodeSteps(steps); err != nil {
		return nil, err
	}
	return rec, nil
}
