package idempg_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
	"github.com/idem-go/idem/idempg"
)

// stepClaim is a claim of key in tenant "t" with fingerprint "fp".
func stepClaim(key string, token int64) idem.ClaimParams {
	return idem.ClaimParams{Tenant: "t", Key: key, Fingerprint: []byte("fp"), Token: token, Lease: time.Hour, Retention: 24 * time.Hour}
}

func mustClaim(t *testing.T, s *idempg.Store, p idem.ClaimParams) idem.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), p)
	if err != nil {
		t.Fatalf("claim %s/%d: %v", p.Key, p.Token, err)
	}
	return res
}

func saveStep(t *testing.T, s *idempg.Store, key string, token int64, name, value string) {
	t.Helper()
	if err := s.SaveStep(context.Background(), idem.SaveStepParams{Tenant: "t", Key: key, Token: token, Name: name, Value: []byte(value)}); err != nil {
		t.Fatalf("save step %s of %s/%d: %v", name, key, token, err)
	}
}

// endLease moves the lease of (t, key) into the past, on the server's
// clock, as if its holder had died and the lease had run out.
func (e *env) endLease(t *testing.T, key string) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), `UPDATE idem_keys SET locked_until = now() - interval '1 second'
		WHERE tenant_id = 't' AND idem_key = $1`, key); err != nil {
		t.Fatal(err)
	}
}

func stepsText(steps []idem.RecordedStep) string {
	var s string
	for _, st := range steps {
		s += fmt.Sprintf("%s=%s;", st.Name, st.Value)
	}
	return s
}

// SaveStep writes only under the holder's token, in flight: not under
// another token, not on a completed record, not on a missing one.
func TestSaveStepFenced(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	mustClaim(t, e.store, stepClaim("k", 1))
	save := func(key string, token int64) error {
		return e.other.SaveStep(ctx, idem.SaveStepParams{Tenant: "t", Key: key, Token: token, Name: "charge", Value: []byte(`"ch_1"`)})
	}
	if err := save("k", 2); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("save under another token: %v, want ErrLeaseLost", err)
	}
	if err := save("missing", 1); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("save on no record: %v, want ErrLeaseLost", err)
	}
	if err := save("k", 1); err != nil {
		t.Fatalf("save under the holder's token: %v", err)
	}
	saveStep(t, e.store, "k", 1, "email", `"sent"`)
	// A name saved twice keeps its first value.
	saveStep(t, e.store, "k", 1, "charge", `"ch_2"`)
	rec, err := e.store.Get(ctx, "t", "k")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := stepsText(rec.Steps), `charge="ch_1";email="sent";`; got != want {
		t.Fatalf("steps %s, want %s", got, want)
	}
	complete(t, e.store, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1, Result: idem.Result{Status: 201}})
	if err := save("k", 1); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("save on a completed record: %v, want ErrLeaseLost", err)
	}
	if _, err := e.store.Get(ctx, "t", "k"); err != nil {
		t.Fatal(err)
	}
	if err := e.store.SaveStep(ctx, idem.SaveStepParams{Tenant: "t", Key: "", Token: 1, Name: "x"}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("save with an empty key: %v, want ErrInvalidKey", err)
	}
}

// Every claim path reports a takeover, and the steps it kept: one
// statement per claim, and batches (where a lone claim still goes out as
// claimSQL; the batch statement itself is tested in
// TestBatchStatementReportsTakeovers).
func TestClaimReportsTakeoverAndSteps(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newEnvWith(t, 2, mode.config)
			if res := mustClaim(t, e.store, stepClaim("k", 1)); !res.Won || res.Takeover || res.Steps != nil {
				t.Fatalf("fresh claim: %+v, want won, no takeover, no steps", res)
			}
			saveStep(t, e.store, "k", 1, "charge", `{"id":"ch_1"}`)
			saveStep(t, e.store, "k", 1, "email", `true`)
			if res := mustClaim(t, e.other, stepClaim("k", 2)); res.Won || res.Takeover || res.Steps != nil {
				t.Fatalf("claim while the lease runs: %+v, want lost, no steps", res)
			}
			e.endLease(t, "k")
			res := mustClaim(t, e.other, stepClaim("k", 3))
			if !res.Won || !res.Takeover || stepsText(res.Steps) != `charge={"id":"ch_1"};email=true;` {
				t.Fatalf("takeover: %+v, want won, takeover, both steps", res)
			}
			// The new holder records more; the old one is fenced off.
			saveStep(t, e.other, "k", 3, "receipt", `1`)
			if err := e.store.SaveStep(context.Background(), idem.SaveStepParams{Tenant: "t", Key: "k", Token: 1, Name: "late"}); !errors.Is(err, idem.ErrLeaseLost) {
				t.Fatalf("save by the previous holder: %v, want ErrLeaseLost", err)
			}
			e.endLease(t, "k")
			if res := mustClaim(t, e.store, stepClaim("k", 4)); !res.Won || !res.Takeover || len(res.Steps) != 3 || res.Steps[2].Name != "receipt" {
				t.Fatalf("second takeover: %+v, want the three steps", res)
			}

			// A takeover of a record without steps is still a takeover.
			mustClaim(t, e.store, stepClaim("bare", 1))
			e.endLease(t, "bare")
			if res := mustClaim(t, e.other, stepClaim("bare", 2)); !res.Won || !res.Takeover || res.Steps != nil {
				t.Fatalf("takeover without steps: %+v, want won, takeover, no steps", res)
			}
		})
	}
}

// A record past retention counts as absent: claiming it is no takeover,
// and its steps, from another operation that happened to use the key, are
// gone.
func TestClaimPastRetentionForgetsSteps(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newEnvWith(t, 2, mode.config)
			ctx := context.Background()
			mustClaim(t, e.store, stepClaim("k", 1))
			saveStep(t, e.store, "k", 1, "charge", `"ch_1"`)
			if _, err := e.pool.Exec(ctx, `UPDATE idem_keys SET locked_until = now() - interval '2 seconds',
				expires_at = now() - interval '1 second' WHERE idem_key = 'k'`); err != nil {
				t.Fatal(err)
			}
			if res := mustClaim(t, e.other, stepClaim("k", 2)); !res.Won || res.Takeover || res.Steps != nil {
				t.Fatalf("claim past retention: %+v, want won afresh, no steps", res)
			}
			rec, err := e.store.Get(ctx, "t", "k")
			if err != nil || rec.Steps != nil || rec.LeaseToken != 2 {
				t.Fatalf("record after the claim: %+v, %v; want token 2 and no steps", rec, err)
			}
		})
	}
}

// Release deletes a record without steps, and keeps one with steps, in
// flight under the same token, its lease ended: the next claim with the
// same fingerprint takes it over at once, with the steps; one with
// another fingerprint does not.
func TestReleaseKeepsRecordWithSteps(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	mustClaim(t, e.store, stepClaim("bare", 1))
	if err := e.store.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "bare", Token: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Get(ctx, "t", "bare"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("record without steps after release: %v, want ErrNotFound", err)
	}

	mustClaim(t, e.store, stepClaim("k", 1))
	saveStep(t, e.store, "k", 1, "charge", `"ch_1"`)
	if err := e.store.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "k", Token: 9}); err != nil {
		t.Fatal(err)
	}
	if rec, err := e.store.Get(ctx, "t", "k"); err != nil || rec.LockedUntil.Before(rec.CreatedAt.Add(time.Minute)) {
		t.Fatalf("a release under another token ended the lease: %+v, %v", rec, err)
	}
	if err := e.store.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "k", Token: 1}); err != nil {
		t.Fatal(err)
	}
	var ended bool
	if err := e.pool.QueryRow(ctx, `SELECT locked_until <= now() FROM idem_keys WHERE idem_key = 'k'`).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	rec, err := e.store.Get(ctx, "t", "k")
	if err != nil || !ended || rec.State != idem.StateInFlight || rec.LeaseToken != 1 || stepsText(rec.Steps) != `charge="ch_1";` {
		t.Fatalf("record with steps after release: %+v, %v (lease ended %v); want kept in flight under token 1, its lease ended, with its step", rec, err, ended)
	}
	other := stepClaim("k", 2)
	other.Fingerprint = []byte("another request")
	if res := mustClaim(t, e.other, other); res.Won {
		t.Fatalf("claim with another fingerprint: %+v, want lost", res)
	}
	if res := mustClaim(t, e.other, stepClaim("k", 3)); !res.Won || !res.Takeover || stepsText(res.Steps) != `charge="ch_1";` {
		t.Fatalf("claim after the release: %+v, want a takeover with the step", res)
	}
}

// A step that a claim's snapshot cannot see (saved by the holder and
// committed while the takeover waited for the row) still reaches the
// takeover: ins returns the steps of the row version it replaced, not
// those of the snapshot.
func TestTakeoverSeesStepCommittedAfterItsSnapshot(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newEnvWith(t, 1, mode.config) // one connection, whose pid we know
			ctx := context.Background()
			watch := newPool(t, e.url, 1)
			mustClaim(t, e.store, stepClaim("k", 1))
			saveStep(t, e.store, "k", 1, "charge", `"ch_1"`)
			e.endLease(t, "k")
			var claimPID int32
			if err := e.pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&claimPID); err != nil {
				t.Fatal(err)
			}
			// The holder's second step, as SaveStep writes it, held
			// uncommitted while the takeover starts.
			holder, err := e.peer.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(ctx)
			if _, err := holder.Exec(ctx, `UPDATE idem_keys SET steps = steps || $1::bytea WHERE idem_key = 'k' AND lease_token = 1`,
				idemcodec.AppendStep(nil, "email", []byte("true"))); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				res idem.ClaimResult
				err error
			}
			done := make(chan answer, 1)
			go func() {
				res, err := e.store.Claim(ctx, stepClaim("k", 2))
				done <- answer{res, err}
			}()
			waitFor(t, "the takeover to wait for the holder's row lock", func() bool {
				var waiting bool
				err := watch.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`,
					claimPID).Scan(&waiting)
				return err == nil && waiting
			})
			if err := holder.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			a := <-done
			if a.err != nil || !a.res.Won || !a.res.Takeover || stepsText(a.res.Steps) != `charge="ch_1";email=true;` {
				t.Fatalf("takeover: %+v, %v; want won with both steps", a.res, a.err)
			}
		})
	}
}

// Duplicates released at one instant on a key whose record holds steps
// and whose lease has ended: exactly one takes it over, with the steps;
// every other one loses to the winner's record.
func TestTakeoverOneWinnerAtOnce(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newEnvWith(t, 5, mode.config)
			ctx := context.Background()
			for round := range 5 {
				key := fmt.Sprint("k", round)
				mustClaim(t, e.store, stepClaim(key, 1))
				saveStep(t, e.store, key, 1, "charge", `"ch_1"`)
				if err := e.store.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: key, Token: 1}); err != nil {
					t.Fatal(err)
				}
				const n = 40
				results := make([]idem.ClaimResult, n)
				errs := make([]error, n)
				atOnce(n, func(i int) {
					store := e.store
					if i%2 == 1 {
						store = e.other
					}
					results[i], errs[i] = store.Claim(ctx, stepClaim(key, int64(100+i)))
				})
				var winners []int64
				for i, res := range results {
					if errs[i] != nil {
						t.Fatalf("claim %d: %v", i, errs[i])
					}
					if res.Won {
						winners = append(winners, int64(100+i))
						if !res.Takeover || stepsText(res.Steps) != `charge="ch_1";` {
							t.Fatalf("winner %d: %+v, want a takeover with the step", i, res)
						}
					}
				}
				if len(winners) != 1 {
					t.Fatalf("round %d: winners %v, want exactly one", round, winners)
				}
				for i, res := range results {
					if !res.Won && (res.Record == nil || res.Record.LeaseToken != winners[0] || res.Takeover || res.Steps != nil) {
						t.Fatalf("loser %d: %+v, want the winner's record", i, res)
					}
				}
			}
		})
	}
}

// The engine's side: a handler records a step through idem.Step, writes a
// business row, then fails. Its transaction rolls back, the row with it,
// but the step stays recorded: the retry takes the key over and gets the
// step's result without running the step again.
func TestStepSurvivesHandlerRollback(t *testing.T) {
	e := newEnv(t, 3)
	ctx := context.Background()
	eng := mustEngine(t, e.store)
	op := idem.Operation{Tenant: "t", Key: "pay-1", Fingerprint: []byte("fp")}
	var charges atomic.Int32
	var seen []idem.Execution
	handler := func(fail bool) func(ctx context.Context) (idem.Result, error) {
		return func(ctx context.Context) (idem.Result, error) {
			x, _ := idem.ExecutionFromContext(ctx)
			seen = append(seen, x)
			id, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
				return fmt.Sprint("ch_", charges.Add(1)), nil
			})
			if err != nil {
				return idem.Result{}, err
			}
			if err := insertOrder(ctx, "pay-1"); err != nil {
				return idem.Result{}, err
			}
			if fail {
				return idem.Result{}, errors.New("the ledger refused")
			}
			return idem.Result{Status: 201, Body: []byte(id)}, nil
		}
	}
	if _, err := eng.Do(ctx, op, handler(true)); err == nil {
		t.Fatal("the failing handler's error was lost")
	}
	if n := e.countOrders(t, "pay-1"); n != 0 {
		t.Fatalf("%d orders after the failed attempt, want 0 (rolled back)", n)
	}
	rec, err := e.store.Get(ctx, "t", "pay-1")
	if err != nil || rec.State != idem.StateInFlight || stepsText(rec.Steps) != `charge="ch_1";` {
		t.Fatalf("record after the failed attempt: %+v, %v; want in flight with the charge", rec, err)
	}
	out, err := eng.Do(ctx, op, handler(false))
	if err != nil || out.Replayed || string(out.Result.Body) != "ch_1" {
		t.Fatalf("retry: %+v, %v; want a fresh run answering ch_1", out, err)
	}
	if n := charges.Load(); n != 1 {
		t.Fatalf("the charge ran %d times, want 1", n)
	}
	if n := e.countOrders(t, "pay-1"); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	if len(seen) != 2 || seen[0].Takeover || !seen[1].Takeover || seen[1].RecoveryPoint != "charge" {
		t.Fatalf("executions %+v, want a first run then a takeover at the charge", seen)
	}
	if out, err := eng.Do(ctx, op, handler(false)); err != nil || !out.Replayed || string(out.Result.Body) != "ch_1" {
		t.Fatalf("replay: %+v, %v", out, err)
	}
}

// The engine's side of concurrent duplicates: retries of an operation
// whose first execution recorded a step and failed, sent at one instant
// through two engines, run the handler once, and the step never again.
func TestStepTakeoverOnceAtOnce(t *testing.T) {
	e := newEnv(t, 5)
	ctx := context.Background()
	engines := [2]*idem.Engine{mustEngine(t, e.store), mustEngine(t, e.other)}
	op := idem.Operation{Tenant: "t", Key: "pay-2", Fingerprint: []byte("fp")}
	var charges, runs atomic.Int32
	handler := func(fail bool) func(ctx context.Context) (idem.Result, error) {
		return func(ctx context.Context) (idem.Result, error) {
			runs.Add(1)
			id, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
				return fmt.Sprint("ch_", charges.Add(1)), nil
			})
			if err != nil || fail {
				return idem.Result{}, cmp.Or(err, errors.New("the ledger refused"))
			}
			return idem.Result{Status: 201, Body: []byte(id)}, insertOrder(ctx, "pay-2")
		}
	}
	if _, err := engines[0].Do(ctx, op, handler(true)); err == nil {
		t.Fatal("the failing handler's error was lost")
	}
	const n = 30
	outs := make([]idem.Outcome, n)
	errs := make([]error, n)
	atOnce(n, func(i int) { outs[i], errs[i] = engines[i%2].Do(ctx, op, handler(false)) })
	var fresh, replayed, inFlight int
	for i := range n {
		switch {
		case errors.Is(errs[i], idem.ErrInFlight):
			inFlight++
		case errs[i] != nil:
			t.Fatalf("retry %d: %v", i, errs[i])
		case string(outs[i].Result.Body) != "ch_1":
			t.Fatalf("retry %d answered %q, want ch_1", i, outs[i].Result.Body)
		case outs[i].Replayed:
			replayed++
		default:
			fresh++
		}
	}
	if fresh != 1 || runs.Load() != 2 || charges.Load() != 1 || e.countOrders(t, "pay-2") != 1 {
		t.Fatalf("fresh %d, replayed %d, in flight %d; handler ran %d times, the charge %d, %d orders; want one takeover, one charge, one order",
			fresh, replayed, inFlight, runs.Load(), charges.Load(), e.countOrders(t, "pay-2"))
	}
}
