package idemredis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/redis/go-redis/v9"
)

// saveStep saves a step of (t, key) under token.
func saveStep(s *Store, key string, token int64, name, value string) error {
	return s.SaveStep(context.Background(), idem.SaveStepParams{Tenant: "t", Key: key, Token: token, Name: name, Value: []byte(value)})
}

// stepNames lists the names and values of steps, for messages.
func stepNames(steps []idem.RecordedStep) string {
	var parts []string
	for _, s := range steps {
		parts = append(parts, fmt.Sprintf("%s=%q", s.Name, s.Value))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// serverNow reads the server's clock through the store's client.
func serverNow(t *testing.T, s *Store) time.Time {
	t.Helper()
	now, err := s.client.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// TestSaveStepFenced: a step is saved only under the token that holds the
// record in flight; a name saved twice keeps its first value and the
// stored field does not grow (the script finds the name, long names and
// binary values included); a completed, absent or taken-over record
// refuses it.
func TestSaveStepFenced(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if r, err := s.Claim(ctx, claimParams("t", "k", "fp", 7)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if err := saveStep(s, "k", 8, "charge", "x"); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("step under another token: %v, want ErrLeaseLost", err)
	}
	if err := saveStep(s, "absent", 7, "charge", "x"); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("step of an absent record: %v, want ErrLeaseLost", err)
	}
	if n, _ := s.client.Exists(ctx, s.key("t", "absent")).Result(); n != 0 {
		t.Fatal("a refused step created a record")
	}
	// A name of 200 bytes and a value of every byte: multi-byte lengths.
	long := strings.Repeat("n", 200)
	var binary []byte
	for b := range 256 {
		binary = append(binary, byte(b))
	}
	want := []idem.RecordedStep{
		{Name: "charge", Value: []byte(`{"id":"ch_1"}`)},
		{Name: long, Value: binary},
	}
	for _, st := range want {
		if err := s.SaveStep(ctx, idem.SaveStepParams{Tenant: "t", Key: "k", Token: 7, Name: st.Name, Value: st.Value}); err != nil {
			t.Fatalf("step %.10s: %v", st.Name, err)
		}
	}
	size := s.client.HStrLen(ctx, s.key("t", "k"), "steps").Val()
	if size != int64(len(idemcodec.MarshalSteps(want))) {
		t.Fatalf("steps field holds %d bytes, want %d", size, len(idemcodec.MarshalSteps(want)))
	}
	// Saved again, with other values: the first stay, nothing is added.
	for _, name := range []string{"charge", long} {
		if err := saveStep(s, "k", 7, name, "second value"); err != nil {
			t.Fatalf("second save of %.10s: %v", name, err)
		}
	}
	if got := s.client.HStrLen(ctx, s.key("t", "k"), "steps").Val(); got != size {
		t.Fatalf("a name saved again grew the steps field from %d to %d bytes", size, got)
	}
	if err := s.SaveStep(ctx, idem.SaveStepParams{Tenant: "t", Key: "k", Token: 7}); err == nil {
		t.Fatal("a step without a name was saved")
	}
	rec, err := s.Get(ctx, "t", "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Steps) != 2 || rec.Steps[0].Name != "charge" || !bytes.Equal(rec.Steps[0].Value, want[0].Value) ||
		rec.Steps[1].Name != long || !bytes.Equal(rec.Steps[1].Value, binary) {
		t.Fatalf("Get: steps %s, want charge and the long name with their first values", stepNames(rec.Steps))
	}

	// Completed: no more steps, and the recorded ones are still read.
	unit, _ := s.Begin(ctx)
	if err := unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 7, Result: idem.Result{Status: 201}}); err != nil {
		t.Fatal(err)
	}
	if err := saveStep(s, "k", 7, "late", "x"); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("step after completion: %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(ctx, "t", "k"); err != nil || len(rec.Steps) != 2 {
		t.Fatalf("completed record: %+v %v, want its 2 steps", rec, err)
	}

	// Taken over: the old token is refused, the new one records.
	p := claimParams("t", "over", "fp", 1)
	p.Lease = time.Millisecond
	if r, err := s.Claim(ctx, p); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if err := saveStep(s, "over", 1, "a", "first holder"); err != nil {
		t.Fatal(err)
	}
	var taken idem.ClaimResult
	eventuallyRedis(t, "a takeover once the lease ended", func() error {
		var err error
		if taken, err = s.Claim(ctx, claimParams("t", "over", "fp", 2)); err != nil || !taken.Won {
			return fmt.Errorf("claim: %+v %v", taken, err)
		}
		return nil
	})
	if !taken.Takeover || len(taken.Steps) != 1 || string(taken.Steps[0].Value) != "first holder" {
		t.Fatalf("takeover: %+v, want Takeover with step a", taken)
	}
	if err := saveStep(s, "over", 1, "b", "stale"); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("step of the holder taken over: %v, want ErrLeaseLost", err)
	}
	if err := saveStep(s, "over", 2, "b", "new holder"); err != nil {
		t.Fatalf("step of the new holder: %v", err)
	}
	if rec, err := s.Get(ctx, "t", "over"); err != nil || stepNames(rec.Steps) != `[a="first holder" b="new holder"]` {
		t.Fatalf("steps after takeover: %v %v", rec, err)
	}
}

// TestReleaseKeepsSteps: a record holding steps is not deleted by its
// release: it stays in flight under its token, its lease ended on the
// server's clock, its TTL still that of its retention. A second release
// changes nothing. Another fingerprint is refused; the same one takes it
// over with its steps, and its lease is the new holder's. A record
// without steps is deleted, and a record past its retention is claimed
// afresh, its steps forgotten.
func TestReleaseKeepsSteps(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if r, err := s.Claim(ctx, claimParams("t", "k", "fp", 7)); err != nil || !r.Won || r.Takeover {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if err := saveStep(s, "k", 7, "charge", "ch_1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "k", Token: 7}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "t", "k")
	if err != nil {
		t.Fatalf("record with steps after its release: %v, want kept", err)
	}
	if rec.State != idem.StateInFlight || rec.LeaseToken != 7 || stepNames(rec.Steps) != `[charge="ch_1"]` {
		t.Fatalf("released record: %+v, want in flight under 7 with its step", rec)
	}
	if now := serverNow(t, s); rec.LockedUntil.After(now) {
		t.Fatalf("released record's lease ends at %v, after the server's now %v", rec.LockedUntil, now)
	}
	if ttl := s.client.PTTL(ctx, s.key("t", "k")).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("released record's TTL %v, want within its retention (1h)", ttl)
	}
	// A resend, or a late second release: nothing moves.
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "k", Token: 7}); err != nil {
		t.Fatal(err)
	}
	if again, err := s.Get(ctx, "t", "k"); err != nil || !again.LockedUntil.Equal(rec.LockedUntil) {
		t.Fatalf("second release: %+v %v, want the lease end unchanged at %v", again, err, rec.LockedUntil)
	}

	if r, err := s.Claim(ctx, claimParams("t", "k", "other", 8)); err != nil || r.Won || r.Record.LeaseToken != 7 {
		t.Fatalf("claim with another fingerprint: %+v %v, want lost to the kept record", r, err)
	}
	r, err := s.Claim(ctx, claimParams("t", "k", "fp", 9))
	if err != nil || !r.Won || !r.Takeover || stepNames(r.Steps) != `[charge="ch_1"]` {
		t.Fatalf("claim after the release: %+v %v, want a takeover with the step", r, err)
	}
	rec, err = s.Get(ctx, "t", "k")
	if err != nil || rec.LeaseToken != 9 || !rec.LockedUntil.After(serverNow(t, s)) || len(rec.Steps) != 1 {
		t.Fatalf("record after the takeover: %+v %v, want held by 9 with its step", rec, err)
	}
	if r, err := s.Claim(ctx, claimParams("t", "k", "fp", 10)); err != nil || r.Won {
		t.Fatalf("claim while the takeover holds the key: %+v %v, want lost", r, err)
	}

	// Without steps: deleted.
	if r, err := s.Claim(ctx, claimParams("t", "plain", "fp", 1)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "plain", Token: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "t", "plain"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("released record without steps: %v, want deleted", err)
	}

	// Past its retention (its TTL not fired yet): absent, steps and all.
	if err := s.client.HSet(ctx, s.key("t", "k"), "expires_at", "1").Err(); err != nil {
		t.Fatal(err)
	}
	r, err = s.Claim(ctx, claimParams("t", "k", "fp", 11))
	if err != nil || !r.Won || r.Takeover || len(r.Steps) != 0 {
		t.Fatalf("claim of a record past retention: %+v %v, want won afresh without steps", r, err)
	}
	if rec, err := s.Get(ctx, "t", "k"); err != nil || len(rec.Steps) != 0 {
		t.Fatalf("record claimed afresh: %+v %v, want no steps", rec, err)
	}
}

// TestTakeoverSkipsRecordedSteps: through the engine and idem.Step. The
// first execution charges, then fails; its release keeps the record, and
// the retry takes it over: it knows it (Takeover, RecoveryPoint), gets the
// charge without charging again, sends its e-mail, and completes. The same
// after an execution whose process died after its step (its lease ends
// instead of being released). A third call replays.
func TestTakeoverSkipsRecordedSteps(t *testing.T) {
	for _, ending := range []string{"handler failed", "process died"} {
		t.Run(ending, func(t *testing.T) {
			ctx := context.Background()
			s := newStore(t)
			e, err := idem.NewEngine(s, &idem.Config{Lease: time.Minute, Heartbeat: -1, Logger: new(logBuffer).logger()})
			if err != nil {
				t.Fatal(err)
			}
			op := idem.Operation{Tenant: "t", Key: "order", Fingerprint: []byte("fp")}
			var charges, emails atomic.Int32
			charge := func(ctx context.Context) (string, error) {
				return "ch_" + strconv.Itoa(int(charges.Add(1))), nil
			}

			switch ending {
			case "handler failed":
				_, err = e.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
					if _, err := idem.Step(ctx, "charge", charge); err != nil {
						return idem.Result{}, err
					}
					return idem.Result{}, errors.New("the warehouse is down")
				})
				if err == nil || err.Error() != "the warehouse is down" {
					t.Fatalf("first execution: %v", err)
				}
			case "process died":
				// A claim and a step, then nothing: the lease runs out.
				p := claimParams("t", "order", "fp", 1)
				p.Lease = 10 * time.Millisecond
				if r, err := s.Claim(ctx, p); err != nil || !r.Won {
					t.Fatalf("claim: %+v %v", r, err)
				}
				if err := saveStep(s, "order", 1, "charge", `"ch_1"`); err != nil {
					t.Fatal(err)
				}
				charges.Add(1)
				eventuallyRedis(t, "the dead holder's lease to end", func() error {
					if rec, _ := s.Get(ctx, "t", "order"); rec == nil || rec.LockedUntil.After(serverNow(t, s)) {
						return errors.New("still held")
					}
					return nil
				})
			}

			var exec idem.Execution
			var got string
			out, err := e.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				exec, _ = idem.ExecutionFromContext(ctx)
				id, err := idem.Step(ctx, "charge", charge)
				if err != nil {
					return idem.Result{}, err
				}
				got = id
				if _, err := idem.Step(ctx, "email", func(context.Context) (bool, error) {
					emails.Add(1)
					return true, nil
				}); err != nil {
					return idem.Result{}, err
				}
				return idem.Result{Status: 201, Body: []byte(id)}, nil
			})
			if err != nil || out.Replayed || string(out.Result.Body) != "ch_1" {
				t.Fatalf("retry: %+v %v, want the answer built on charge ch_1", out, err)
			}
			if !exec.Takeover || exec.RecoveryPoint != "charge" || got != "ch_1" {
				t.Fatalf("retry saw %+v and charge %q, want a takeover at recovery point charge getting ch_1", exec, got)
			}
			if n, m := charges.Load(), emails.Load(); n != 1 || m != 1 {
				t.Fatalf("%d charges and %d e-mails, want 1 each", n, m)
			}
			if rec, err := s.Get(ctx, "t", "order"); err != nil || rec.State != idem.StateComplete || stepNames(rec.Steps) != `[charge="\"ch_1\"" email="true"]` {
				t.Fatalf("record: %+v %v, want complete with both steps", rec, err)
			}
			out, err = e.Do(ctx, op, func(context.Context) (idem.Result, error) {
				t.Error("a completed operation ran again")
				return idem.Result{}, nil
			})
			if err != nil || !out.Replayed || string(out.Result.Body) != "ch_1" {
				t.Fatalf("third call: %+v %v, want the replay", out, err)
			}
		})
	}
}

// TestTakeoverDuplicatesAtOnce: 50 duplicates, from two stores (two
// processes), released at one barrier on a released record with a step:
// exactly one takes it over and completes, none runs the step again, the
// others are told the key is in flight or get the replay.
func TestTakeoverDuplicatesAtOnce(t *testing.T) {
	ctx := context.Background()
	prefix := "dup-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	stores := []*Store{newStoreOn(t, newClient(t, -1), prefix), newStoreOn(t, newClient(t, -1), prefix)}
	if r, err := stores[0].Claim(ctx, claimParams("t", "k", "fp", 1)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if err := saveStep(stores[0], "k", 1, "charge", `"ch_1"`); err != nil {
		t.Fatal(err)
	}
	if err := stores[0].Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "k", Token: 1}); err != nil {
		t.Fatal(err)
	}
	engines := make([]*idem.Engine, len(stores))
	for i, s := range stores {
		e, err := idem.NewEngine(s, &idem.Config{Lease: time.Minute, Logger: new(logBuffer).logger()})
		if err != nil {
			t.Fatal(err)
		}
		engines[i] = e
	}
	var mu sync.Mutex
	var takeovers, fresh, inFlight, replays, charges int
	var errs []error
	atonce.Run(50, func(i int) {
		out, err := engines[i%2].Do(ctx, idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp")}, func(ctx context.Context) (idem.Result, error) {
			exec, _ := idem.ExecutionFromContext(ctx)
			mu.Lock()
			if exec.Takeover {
				takeovers++
			} else {
				fresh++
			}
			mu.Unlock()
			id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
				mu.Lock()
				charges++
				mu.Unlock()
				return "ch_again", nil
			})
			time.Sleep(20 * time.Millisecond) // the others meet it in flight
			return idem.Result{Status: 201, Body: []byte(id)}, err
		})
		mu.Lock()
		defer mu.Unlock()
		switch {
		case errors.Is(err, idem.ErrInFlight):
			inFlight++
		case err != nil:
			errs = append(errs, err)
		case out.Replayed:
			replays++
		}
	})
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	if takeovers != 1 || fresh != 0 || charges != 0 || 1+inFlight+replays != 50 {
		t.Fatalf("%d takeovers, %d fresh executions, %d charges, %d in flight, %d replays; want 1 takeover, no charge", takeovers, fresh, charges, inFlight, replays)
	}
	if rec, err := stores[1].Get(ctx, "t", "k"); err != nil || rec.State != idem.StateComplete || string(rec.Result.Body) != "ch_1" {
		t.Fatalf("record: %+v %v, want complete with the recorded charge", rec, err)
	}
}

// TestFullRedisRefusesSteps: a full server (noeviction) refuses a step
// before writing anything, whatever the version, since steps are as many
// and as large as handlers make them. Through the engine: the step ran,
// Step reports idem.ErrStepNotSaved, the handler fails, and the key is
// not freed: the release keeps the record with its earlier step (on Redis
// 7 it ends the lease; before, the release is refused too and the lease
// runs on). Once memory is freed, the retry takes over, skips the saved
// step and runs the refused one again (the window the downstream key
// closes).
func TestFullRedisRefusesSteps(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(map[bool]string{false: "Redis 7 scripts", true: "scripts without flags"}[plain], func(t *testing.T) {
			ctx := context.Background()
			f := startFullServer(t)
			s := f.store(t)
			s.plain.Store(plain)
			e, err := idem.NewEngine(s, &idem.Config{Lease: time.Minute, Heartbeat: -1, Logger: new(logBuffer).logger()})
			if err != nil {
				t.Fatal(err)
			}
			// A bare record: the refused step writes nothing into it.
			if r, err := s.Claim(ctx, claimParams("t", "bare", "fp", 5)); err != nil || !r.Won {
				t.Fatalf("claim: %+v %v", r, err)
			}

			op := idem.Operation{Tenant: "t", Key: "order", Fingerprint: []byte("fp")}
			var runs = map[string]int{}
			step := func(ctx context.Context, name string) error {
				_, err := idem.Step(ctx, name, func(context.Context) (string, error) {
					runs[name]++
					return name + "-done", nil
				})
				return err
			}
			var stepErr error
			_, err = e.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				if err := step(ctx, "charge"); err != nil {
					return idem.Result{}, err
				}
				f.fill(t)
				stepErr = step(ctx, "ship")
				return idem.Result{}, stepErr
			})
			if !errors.Is(stepErr, idem.ErrStepNotSaved) || !redis.IsOOMError(stepErr) {
				t.Fatalf("step on a full server: %v, want ErrStepNotSaved from an OOM refusal", stepErr)
			}
			if !errors.Is(err, idem.ErrStepNotSaved) {
				t.Fatalf("execution: %v, want the handler's ErrStepNotSaved", err)
			}
			if err := saveStep(s, "bare", 5, "x", "y"); !redis.IsOOMError(err) {
				t.Fatalf("step of a bare record on a full server: %v, want OOM", err)
			}
			if n := f.admin.HExists(ctx, s.key("t", "bare"), "steps").Val(); n {
				t.Fatal("a refused step wrote into the record")
			}
			rec, err := s.Get(ctx, "t", "order")
			if err != nil || rec.State != idem.StateInFlight || stepNames(rec.Steps) != `[charge="\"charge-done\""]` {
				t.Fatalf("record after the refused step: %+v %v, want in flight with the charge only", rec, err)
			}
			if !rec.LockedUntil.After(f.now(t)) {
				t.Fatal("lease ended after a refused step: want the key held until its lease ends (the engine does not release it)")
			}

			f.empty(t)
			// The lease runs until its end; end it as its expiry would
			// (a release of a record with steps ends its lease).
			if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "order", Token: rec.LeaseToken}); err != nil {
				t.Fatal(err)
			}
			out, err := e.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				if exec, _ := idem.ExecutionFromContext(ctx); !exec.Takeover || exec.RecoveryPoint != "charge" {
					t.Errorf("retry: %+v, want a takeover at charge", exec)
				}
				if err := step(ctx, "charge"); err != nil {
					return idem.Result{}, err
				}
				return idem.Result{Status: 201}, step(ctx, "ship")
			})
			if err != nil || out.Replayed {
				t.Fatalf("retry once memory is freed: %+v %v", out, err)
			}
			if runs["charge"] != 1 || runs["ship"] != 2 {
				t.Fatalf("runs %v, want charge once and ship twice (its first result was refused)", runs)
			}
		})
	}
}

// TestClaimRefusesCorruptSteps: recorded steps that do not decode fail
// the takeover and Get, rather than being run again.
func TestClaimRefusesCorruptSteps(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	p := claimParams("t", "k", "fp", 1)
	p.Lease = time.Millisecond
	if r, err := s.Claim(ctx, p); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if err := s.client.HSet(ctx, s.key("t", "k"), "steps", "\x05ab").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "t", "k"); err == nil || !strings.Contains(err.Error(), "stored steps") {
		t.Fatalf("Get of corrupt steps: %v, want an error", err)
	}
	eventuallyRedis(t, "the lease to end", func() error {
		r, err := s.Claim(ctx, claimParams("t", "k", "fp", 2))
		if err == nil {
			return fmt.Errorf("claim: %+v, want an error", r)
		}
		if !strings.Contains(err.Error(), "stored steps") {
			t.Fatalf("takeover of corrupt steps: %v, want their decoding error", err)
		}
		return nil
	})
}
