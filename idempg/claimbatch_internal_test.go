package idempg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestClaimBatches holds the batcher's first statement on a row lock, lets
// 60 claims queue behind it at the same instant (40 keys, 20 of them sent
// twice), and then checks what a batch must do: the 40 keys go out
// together as one statement and each is won exactly once, the second
// claim of a key waits for the next statement and loses to the first. A
// claim whose caller gives up while its statement runs is won for nobody,
// and must not leave its key in flight.
func TestClaimBatches(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresSchema(t)
	// The claims' connections, whose waits on row locks the test watches.
	cfg, err := pgxpool.ParseConfig(url + "&pool_max_conns=2")
	if err != nil {
		t.Fatal(err)
	}
	var pidsMu sync.Mutex
	var pids []uint32
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		pidsMu.Lock()
		pids = append(pids, c.PgConn().PID())
		pidsMu.Unlock()
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	// Cleanups, not defers: they run after the holding transactions'
	// rollbacks (registered later, run earlier), so that a failed test
	// does not wait forever for a claim blocked on their rows.
	t.Cleanup(pool.Close)
	other, err := pgxpool.New(ctx, url+"&pool_max_conns=3")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	store := testenv.Must(NewStore(pool, nil))
	b := store.batcher

	// Uncommitted rows: a batch that claims one of these keys waits on its
	// lock until the row's transaction ends.
	hold := func(key string) interface{ Commit(context.Context) error } {
		tx, err := other.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(ctx) })
		if _, err := tx.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, state, lease_token, locked_until, expires_at)
			VALUES ('t', $1, 'in_flight', 42, now() + interval '1 hour', now() + interval '1 day')`, key); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	blocker1, blocker2 := hold("blocker1"), hold("blocker2")
	// A completed key, which a burst of retries replays.
	if _, err := other.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token, locked_until,
		status_code, response_body, completed_at, expires_at)
		VALUES ('t', 'done', 'fp', 'complete', 7, now(), 201, 'ok', now(), now() + interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	waiting := func(statements int64) func() bool {
		return func() bool {
			if b.statements.Load() != statements {
				return false
			}
			pidsMu.Lock()
			ours := slices.Clone(pids)
			pidsMu.Unlock()
			var n int
			err := other.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = ANY($1)`, ours).Scan(&n)
			return err == nil && n > 0
		}
	}
	params := func(key string, token int64) idem.ClaimParams {
		return idem.ClaimParams{Tenant: "t", Key: key, Fingerprint: []byte("fp"), Token: token, Lease: time.Minute, Retention: time.Hour}
	}
	type answer struct {
		res idem.ClaimResult
		err error
	}
	claim := func(ctx context.Context, key string, token int64) chan answer {
		c := make(chan answer, 1)
		go func() {
			res, err := store.Claim(ctx, params(key, token))
			c <- answer{res, err}
		}()
		return c
	}

	// Statement 1: blocker1 alone, waiting.
	first := claim(ctx, "blocker1", 1)
	waitFor(t, "the first statement to wait on blocker1's lock", waiting(1))

	// Queued behind it: the abandoned claim, blocker2, and 60 claims
	// released together.
	abandonCtx, abandon := context.WithCancel(ctx)
	abandoned := claim(abandonCtx, "abandoned", 99)
	second := claim(ctx, "blocker2", 2)
	// Ten retries of "done" with its fingerprint: one goes in statement 2,
	// nine follow it and get its answer. One with another fingerprint
	// cannot follow, and goes in statement 3.
	var replays []chan answer
	for i := range 10 {
		replays = append(replays, claim(ctx, "done", int64(200+i)))
	}
	otherFP := make(chan answer, 1)
	go func() {
		p := params("done", 299)
		p.Fingerprint = []byte("another")
		res, err := store.Claim(ctx, p)
		otherFP <- answer{res, err}
	}()
	const keys, twice = 40, 20
	answers := make([]answer, keys+twice)
	all := make(chan struct{})
	go func() {
		atonce.Run(len(answers), func(i int) {
			res, err := store.Claim(ctx, params(fmt.Sprintf("k%02d", i%keys), int64(100+i)))
			answers[i] = answer{res, err}
		})
		close(all)
	}()
	waitFor(t, "73 claims to queue", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == len(answers)+2+len(replays)+1
	})

	// Statement 2: the abandoned key, blocker2 and the 40 keys, in key
	// order; it writes "abandoned", then waits on blocker2's lock.
	if err := blocker1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second statement to wait on blocker2's lock", waiting(2))
	abandon()
	if a := <-abandoned; !errors.Is(a.err, context.Canceled) {
		t.Fatalf("abandoned claim: %+v, %v; want context.Canceled", a.res, a.err)
	}
	if err := blocker2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	<-all
	for name, c := range map[string]chan answer{"blocker1": first, "blocker2": second} {
		a := <-c
		if a.err != nil || a.res.Won || a.res.Record == nil || a.res.Record.LeaseToken != 42 {
			t.Fatalf("claim of %s: %+v, %v; want lost to token 42", name, a.res, a.err)
		}
	}

	winners := make(map[string]int64)
	for i, a := range answers {
		if a.err != nil {
			t.Fatalf("claim %d: %v", i, a.err)
		}
		if a.res.Won {
			key := fmt.Sprintf("k%02d", i%keys)
			if _, dup := winners[key]; dup {
				t.Fatalf("key %s won twice", key)
			}
			winners[key] = int64(100 + i)
		}
	}
	if len(winners) != keys {
		t.Fatalf("%d keys won, want %d", len(winners), keys)
	}
	for i, a := range answers {
		if a.res.Won {
			continue
		}
		key := fmt.Sprintf("k%02d", i%keys)
		if r := a.res.Record; r == nil || r.State != idem.StateInFlight || r.LeaseToken != winners[key] {
			t.Fatalf("claim %d of %s lost to %+v, want the in-flight record of token %d", i, key, r, winners[key])
		}
	}
	for i, c := range append(replays, otherFP) {
		a := <-c
		if r := a.res.Record; a.err != nil || a.res.Won || r == nil || r.State != idem.StateComplete || string(r.Result.Body) != "ok" {
			t.Fatalf("retry %d of the completed key: %+v (record %+v), %v; want its record", i, a.res, r, a.err)
		}
	}
	// Statement 3: the 20 second claims, which followed the first claims
	// of their keys in statement 2 and, those having won, queued again.
	if n := b.statements.Load(); n != 3 {
		t.Fatalf("%d claim statements, want 3 (blocker1; 43 claims and 9 followers; 20 second claims and another fingerprint)", n)
	}
	waitFor(t, "the abandoned claim to be released", func() bool {
		_, err := store.Get(ctx, "t", "abandoned")
		return errors.Is(err, idem.ErrNotFound)
	})
}

// waitFor polls cond until it holds. It bounds the wait generously, to
// fail rather than hang, and asserts nothing about how long it took.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
