package idempg

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// stepsEnv is a migrated schema with a store whose batcher the tests
// drive directly, and a second pool for the rows they set up.
func stepsEnv(t *testing.T) (*Store, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	url := testenv.PostgresSchema(t)
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns=1")
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	other, err := pgxpool.New(ctx, url+"&pool_max_conns=3")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return testenv.Must(NewStore(pool, nil)), other
}

func stepsOf(pairs ...string) []byte {
	var b []byte
	for i := 0; i < len(pairs); i += 2 {
		b = idemcodec.AppendStep(b, pairs[i], []byte(pairs[i+1]))
	}
	return b
}

func waiters(keys ...string) []*claimWaiter {
	var ws []*claimWaiter
	for i, k := range keys {
		ws = append(ws, &claimWaiter{ctx: context.Background(), fingerprint: []byte("fp"), done: make(chan claimOutcome, 1),
			p: idem.ClaimParams{Tenant: "t", Key: k, Fingerprint: []byte("fp"), Token: int64(100 + i), Lease: time.Hour, Retention: time.Hour}})
	}
	return ws
}

// The batch statement (claimBatchSQL, two claims or more) reports, claim
// by claim, what claimSQL reports: a takeover and the steps it kept, no
// takeover for a fresh key or a record past retention (whose steps are
// dropped), and the holding record for a lost claim.
func TestBatchStatementReportsTakeovers(t *testing.T) {
	store, other := stepsEnv(t)
	ctx := context.Background()
	rows := []struct {
		key, state string
		lease      string // locked_until - now()
		expires    string // expires_at - now()
		steps      []byte
	}{
		{"takeover", "in_flight", "-1 second", "1 hour", stepsOf("charge", `"ch_1"`, "email", "true")},
		{"bare", "in_flight", "-1 second", "1 hour", nil},
		{"live", "in_flight", "1 hour", "1 hour", stepsOf("charge", `"ch_2"`)},
		{"done", "complete", "-1 second", "1 hour", stepsOf("charge", `"ch_3"`)},
		{"old", "in_flight", "-2 seconds", "-1 second", stepsOf("charge", `"ch_4"`)},
	}
	for _, r := range rows {
		if _, err := other.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token, locked_until, expires_at, steps)
			VALUES ('t', $1, 'fp', $2, 7, now() + $3::interval, now() + $4::interval, $5)`, r.key, r.state, r.lease, r.expires, r.steps); err != nil {
			t.Fatal(err)
		}
	}
	batch := waiters("bare", "done", "fresh", "live", "old", "takeover")
	results, err := store.batcher.query(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"bare":     "won takeover []",
		"done":     "lost complete 7 []",
		"fresh":    "won []",
		"live":     "lost in_flight 7 []",
		"old":      "won []",
		"takeover": `won takeover [charge="ch_1" email=true]`,
	}
	for i, w := range batch {
		res, err := results[i].result(w.p)
		if err != nil {
			t.Fatalf("%s: %v", w.p.Key, err)
		}
		got := "lost"
		if res.Won {
			got = "won"
			if res.Takeover {
				got += " takeover"
			}
		} else {
			got += fmt.Sprintf(" %s %d", res.Record.State, res.Record.LeaseToken)
		}
		got += " ["
		for j, s := range res.Steps {
			if j > 0 {
				got += " "
			}
			got += s.Name + "=" + string(s.Value)
		}
		got += "]"
		if got != want[w.p.Key] {
			t.Errorf("%s: %s, want %s", w.p.Key, got, want[w.p.Key])
		}
	}
	var oldSteps []byte
	if err := other.QueryRow(ctx, `SELECT steps FROM idem_keys WHERE idem_key = 'old'`).Scan(&oldSteps); err != nil || oldSteps != nil {
		t.Fatalf("steps of the record claimed past retention: %q, %v; want NULL", oldSteps, err)
	}
}

// The batch statement, like claimSQL, returns the steps of the row version
// its takeover replaced: a step committed while the batch waited for the
// row lock, after its snapshot, is not lost.
func TestBatchTakeoverSeesStepCommittedAfterItsSnapshot(t *testing.T) {
	store, other := stepsEnv(t)
	ctx := context.Background()
	if _, err := other.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token, locked_until, expires_at, steps)
		VALUES ('t', 'k', 'fp', 'in_flight', 7, now() - interval '1 second', now() + interval '1 hour', $1)`, stepsOf("charge", `"ch_1"`)); err != nil {
		t.Fatal(err)
	}
	var claimPID int32
	if err := store.pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&claimPID); err != nil {
		t.Fatal(err)
	}
	holder, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, saveStepSQL, "t", "k", int64(7), stepsOf("email", "true")); err != nil {
		t.Fatal(err)
	}
	batch := waiters("a-fresh", "k")
	type answer struct {
		results []claimRow
		err     error
	}
	done := make(chan answer, 1)
	go func() {
		results, err := store.batcher.query(ctx, batch)
		done <- answer{results, err}
	}()
	waitFor(t, "the batch to wait for the holder's row lock", func() bool {
		var waiting bool
		err := other.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`,
			claimPID).Scan(&waiting)
		return err == nil && waiting
	})
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	res, err := a.results[1].result(batch[1].p)
	if err != nil || !res.Won || !res.Takeover || len(res.Steps) != 2 || res.Steps[1].Name != "email" {
		t.Fatalf("takeover: %+v, %v; want won with both steps", res, err)
	}
}

// Steps that do not decode fail the claim, rather than be dropped and
// their effects run again.
func TestClaimRefusesCorruptSteps(t *testing.T) {
	store, other := stepsEnv(t)
	ctx := context.Background()
	if _, err := other.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token, locked_until, expires_at, steps)
		VALUES ('t', 'k', 'fp', 'in_flight', 7, now() - interval '1 second', now() + interval '1 hour', '\x05ab'::bytea)`); err != nil {
		t.Fatal(err)
	}
	if res, err := store.Claim(ctx, waiters("k")[0].p); err == nil {
		t.Fatalf("claim over corrupt steps: %+v, want an error", res)
	}
	if _, err := store.Get(ctx, "t", "k"); err == nil {
		t.Fatal("get of corrupt steps: no error")
	}
}
