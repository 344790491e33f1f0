package idemredis

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestScriptFlush: after SCRIPT FLUSH (as after a restart or a failover to
// a fresh server) the first EVALSHA of each script answers NOSCRIPT and
// go-redis falls back to EVAL, which loads it again; every operation works
// across the flush.
//
// SCRIPT FLUSH empties the cache of the whole server, for other tests
// too; they recover the same way, which is what this test shows.
func TestScriptFlush(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	scripts := []*script{claimScript, extendScript, releaseScript, completeScript}
	hashes := make([]string, len(scripts))
	for i, sc := range scripts {
		hashes[i] = sc.flagged.sha
	}
	for round := range 2 {
		if err := s.client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		// Nothing runs between the flush and the check on this
		// connection, but other tests may reload scripts concurrently:
		// only claim what this test can see, that the first script it
		// runs is absent.
		if exists, err := s.client.ScriptExists(ctx, claimScript.flagged.sha).Result(); err != nil || exists[0] {
			t.Logf("claim script reloaded by another test between flush and check (%v %v)", exists, err)
		}
		key := "k" + strconv.Itoa(round)
		if r, err := s.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: key, Token: 1, Lease: time.Minute, Retention: time.Hour}); err != nil || !r.Won {
			t.Fatalf("claim after SCRIPT FLUSH: %+v %v", r, err)
		}
		if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: key, Token: 1, Lease: time.Minute}); err != nil {
			t.Fatalf("extend after SCRIPT FLUSH: %v", err)
		}
		tx, _ := s.Begin(ctx)
		if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: key, Token: 1, Result: idem.Result{Status: 200}}); err != nil {
			t.Fatalf("complete after SCRIPT FLUSH: %v", err)
		}
		if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: key, Token: 1}); err != nil {
			t.Fatalf("release after SCRIPT FLUSH: %v", err)
		}
		exists, err := s.client.ScriptExists(ctx, hashes...).Result()
		if err != nil {
			t.Fatal(err)
		}
		for i, ok := range exists {
			if !ok {
				t.Fatalf("script %d not in the cache after its EVAL fallback", i)
			}
		}
	}
}

// TestScriptsSurviveResend: go-redis resends a command whose reply was
// lost (a read timeout, a broken connection), so a script may run twice
// with the same arguments. The second run must report what the first one
// did; a second call, by contrast, is refused.
func TestScriptsSurviveResend(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	p := idem.ClaimParams{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), Token: 7, Lease: time.Minute, Retention: time.Hour}
	for i := range 2 {
		if r, err := s.Claim(ctx, p); err != nil || !r.Won {
			t.Fatalf("claim run %d: %+v %v", i+1, r, err)
		}
	}
	other := p
	other.Token = 8
	if r, err := s.Claim(ctx, other); err != nil || r.Won {
		t.Fatalf("claim by another token: %+v %v", r, err)
	}

	// The exact command Tx.Complete sends, sent twice.
	key := []string{s.key("t", "k")}
	args := []any{"7", "response", 201, "", "body", "", "completion-1"}
	for i := range 2 {
		if ok, err := s.eval(ctx, completeScript, false, key, args...).Int(); err != nil || ok != 1 {
			t.Fatalf("complete run %d: %d %v", i+1, ok, err)
		}
	}
	// A second Complete call under the same token has another id.
	tx, _ := s.Begin(ctx)
	if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 7, Result: idem.Result{Status: 500}}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("second Complete call: %v, want ErrLeaseLost", err)
	}
	rec, err := s.Get(ctx, "t", "k")
	if err != nil || rec.State != idem.StateComplete || rec.Result.Status != 201 || string(rec.Result.Body) != "body" {
		t.Fatalf("record after the resend and the second call: %+v %v", rec, err)
	}
	// A completed record is not re-claimed by its own token either: the
	// claim reports the record, so the engine replays it.
	if r, err := s.Claim(ctx, p); err != nil || r.Won || r.Record.State != idem.StateComplete {
		t.Fatalf("claim of own complete record: %+v %v", r, err)
	}
}

// TestServerWithoutScriptFlags: a server before Redis 7 reads a script's
// "#!lua flags=…" line as Lua, and refuses to compile it; the script did
// not run. The store then sends the scripts without flags from then on.
// This Redis knows the flags, so the test gives it a first line that no
// Redis compiles, which it refuses with the error an older server gives.
func TestServerWithoutScriptFlags(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	body := "return redis.call('INCR', KEYS[1])"
	sc := &script{flagged: newSource("#x\n" + body), plain: newSource(body)}
	key := s.key("t", "counter")
	err := s.eval(ctx, &script{flagged: sc.flagged, plain: sc.flagged}, false, []string{key}).Err()
	if !shebangUnknown(err) {
		t.Fatalf("a script starting with '#': %v, want the compile error shebangUnknown recognizes", err)
	}
	if s.plain.Load() {
		t.Fatal("a script without a plain form switched the store to plain scripts")
	}
	n, err := s.eval(ctx, sc, false, []string{key}).Int()
	if err != nil || n != 1 {
		t.Fatalf("script after the fallback: %d %v, want 1 (run once)", n, err)
	}
	if !s.plain.Load() {
		t.Fatal("the store still sends flagged scripts")
	}
	// Flags this server does not know are another error: no fallback.
	other := newStore(t)
	err = other.eval(ctx, newScript("no-such-flag", body), false, []string{key}).Err()
	if err == nil || shebangUnknown(err) || other.plain.Load() {
		t.Fatalf("unknown flag: %v (plain=%v), want an error that is not taken for an old server", err, other.plain.Load())
	}
}

// TestCompleteOutlivesItsCaller: the handler has run, so its answer is
// stored even when the caller's context has already ended.
func TestCompleteOutlivesItsCaller(t *testing.T) {
	s := newStore(t)
	s.completeTimeout = DefaultCompleteTimeout
	if r, err := s.Claim(context.Background(), claimParams("t", "k", "fp", 7)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	unit, _ := s.Begin(context.Background())
	if err := unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 7, Result: idem.Result{Status: 201}}); err != nil {
		t.Fatalf("Complete whose caller is gone: %v", err)
	}
	if rec, err := s.Get(context.Background(), "t", "k"); err != nil || rec.State != idem.StateComplete {
		t.Fatalf("record: %+v %v, want complete", rec, err)
	}
}
