package idemstoretest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// stepRaceGoroutines is how many steps the holder saves at once.
const stepRaceGoroutines = 24

// steps: recovery points (idem.StepStore). A step's record is fenced like
// a completion, keeps its first value, outlives the release and the
// rollback of the execution that saved it, and comes back, in order, to
// the execution that takes the key over, so that a card charged once is
// never charged again.
func (s *suite) steps(t *testing.T) {
	fx := s.newFixture(t)
	if _, ok := fx.Store.(idem.StepStore); !ok {
		if s.caps.NoSteps {
			t.Skip("skipping: the store keeps no recovery points (Capabilities.NoSteps)")
		}
		t.Fatalf("the store (%T) does not implement idem.StepStore: implement it, or set Capabilities.NoSteps to run without recovery points", fx.Store)
	}

	s.parallel(t, "SaveStepFenced", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)

		err := h.saveStep(st, "order-1", newToken(), "charge", []byte("wrong token"))
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("SaveStep with a wrong token = %v, want idem.ErrLeaseLost", err)
		}
		err = h.saveStep(st, "never-claimed", p.Token, "charge", []byte("absent"))
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("SaveStep of a key never claimed = %v, want idem.ErrLeaseLost", err)
		}
		h.mustBeAbsent(st, "never-claimed")
		h.mustHaveSteps(st, "order-1", nil)

		for _, other := range h.stores() {
			h.mustSaveStep(other, "order-1", p.Token, "charge-"+h.storeName(other), []byte("ch_1"))
		}
		want := h.namedSteps("charge-", "ch_1")
		rec := h.mustBeInFlight(st, "order-1", p.Token)
		checkSteps(h.t, "Get after SaveStep by the holder", rec.Steps, want)

		res := idem.Result{Status: 201, Body: []byte("charged")}
		h.mustComplete(st, "order-1", p.Token, res)
		err = h.saveStep(st, "order-1", p.Token, "refund", []byte("after completion"))
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("SaveStep of a complete record = %v, want idem.ErrLeaseLost", err)
		}
		rec = h.mustBeComplete(st, "order-1", res)
		for _, s := range rec.Steps {
			if s.Name == "refund" {
				h.t.Errorf("a complete record took a step: %q", s.Name)
			}
		}
	})

	s.parallel(t, "SaveStepAfterTakeover", func(h *harness) {
		st, taker := h.fx.Store, h.peerOrStore()
		old := h.params("order-1", fingerprint("a"))
		old.Lease = shortLease
		h.mustWin(st, old)
		claimed := time.Now()
		h.mustSaveStep(st, "order-1", old.Token, "reserve", []byte("r_1"))
		sleepPast(h.t, claimed, shortLease)

		takeover := h.params("order-1", old.Fingerprint)
		res := h.claim(taker, takeover)
		if !res.Won || !res.Takeover {
			h.t.Fatalf("claim after the lease ended: won=%v takeover=%v record=%s; want a takeover", res.Won, res.Takeover, describe(res.Record))
		}
		// The execution taken over learns here that its step must not
		// count: the taker did not see it when it claimed.
		err := h.saveStep(st, "order-1", old.Token, "charge", []byte("late"))
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("SaveStep by the execution taken over = %v, want idem.ErrLeaseLost", err)
		}
		rec := h.mustBeInFlight(st, "order-1", takeover.Token)
		checkSteps(h.t, "steps after a refused SaveStep", rec.Steps, []idem.RecordedStep{{Name: "reserve", Value: []byte("r_1")}})
	})

	s.parallel(t, "FirstValueKept", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		value := []byte("ch_first")
		h.mustSaveStep(st, "order-1", p.Token, "charge", value)
		// The caller may reuse its buffer once SaveStep returned.
		copy(value, "XXXXXXXX")
		for _, other := range h.stores() {
			if err := h.saveStep(other, "order-1", p.Token, "charge", []byte("ch_second")); err != nil {
				h.t.Errorf("SaveStep of a name already recorded = %v, want nil (the first value is kept)", err)
			}
		}
		h.mustSaveStep(st, "order-1", p.Token, "email", []byte("sent"))
		want := []idem.RecordedStep{{Name: "charge", Value: []byte("ch_first")}, {Name: "email", Value: []byte("sent")}}
		h.mustHaveSteps(st, "order-1", want)

		// What Get returned is the caller's to change.
		rec := h.get(st, "order-1")
		if len(rec.Steps) > 0 && len(rec.Steps[0].Value) > 0 {
			rec.Steps[0].Value[0] = 'Z'
		}
		h.mustHaveSteps(st, "order-1", want)
	})

	s.parallel(t, "Values", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		binary := make([]byte, 0, 512)
		for i := range 256 {
			binary = append(binary, byte(i))
		}
		for i := 255; i >= 0; i-- {
			binary = append(binary, byte(i))
		}
		large := make([]byte, 100<<10)
		r := rand.NewChaCha8([32]byte{2})
		_, _ = r.Read(large)
		want := []idem.RecordedStep{
			{Name: "empty", Value: nil},
			{Name: "binary", Value: binary},
			{Name: "large", Value: large},
			{Name: "quotes ' \" \\ % _ é", Value: []byte(`{"id":"ch_1"}`)},
			{Name: "nul\x00name", Value: []byte{0}},
		}
		for _, s := range want {
			h.mustSaveStep(st, "order-1", p.Token, s.Name, s.Value)
		}
		for _, other := range h.stores() {
			rec, err := other.Get(h.ctx, h.tenant, "order-1")
			if err != nil {
				h.t.Fatalf("Get: %v", err)
			}
			checkSteps(h.t, "steps read back", rec.Steps, want)
		}
	})

	s.parallel(t, "SurviveRelease", func(h *harness) {
		st, taker := h.fx.Store, h.peerOrStore()
		first := h.params("order-1", fingerprint("a"))
		h.mustWin(st, first)
		h.mustSaveStep(st, "order-1", first.Token, "reserve", []byte("r_1"))
		h.mustSaveStep(st, "order-1", first.Token, "charge", []byte("ch_1"))
		h.mustSaveStep(st, "order-1", first.Token, "email", []byte("sent"))
		h.release(st, "order-1", first.Token)
		want := []idem.RecordedStep{
			{Name: "reserve", Value: []byte("r_1")},
			{Name: "charge", Value: []byte("ch_1")},
			{Name: "email", Value: []byte("sent")},
		}
		// Still in flight, so that the effects the steps stand for are
		// not forgotten.
		rec := h.get(st, "order-1")
		if rec.State != idem.StateInFlight {
			h.t.Fatalf("after Release, a record with steps is %s, want kept in flight", describe(rec))
		}
		checkSteps(h.t, "steps after Release", rec.Steps, want)

		// Another request may not take the key over...
		lost := h.mustLose(taker, h.params("order-1", fingerprint("b")))
		if lost.State != idem.StateInFlight || !lost.SameFingerprint(first.Fingerprint) {
			h.t.Errorf("claim with another fingerprint returned %s, want the released record with fingerprint %x", describe(lost), first.Fingerprint)
		}
		// ...the same one does at once, since the lease ended with the
		// release, and gets the steps in order.
		second := h.params("order-1", first.Fingerprint)
		res := h.claim(taker, second)
		if !res.Won || !res.Takeover {
			h.t.Fatalf("claim after Release: won=%v takeover=%v record=%s; want a takeover at once", res.Won, res.Takeover, describe(res.Record))
		}
		checkSteps(h.t, "ClaimResult.Steps of the takeover", res.Steps, want)

		// The taker adds one, is released in turn: the next one gets all.
		h.mustSaveStep(taker, "order-1", second.Token, "receipt", []byte("rc_1"))
		h.release(taker, "order-1", second.Token)
		want = append(want, idem.RecordedStep{Name: "receipt", Value: []byte("rc_1")})
		third := h.params("order-1", first.Fingerprint)
		res = h.claim(st, third)
		if !res.Won || !res.Takeover {
			h.t.Fatalf("claim after the second Release: won=%v takeover=%v; want a takeover", res.Won, res.Takeover)
		}
		checkSteps(h.t, "ClaimResult.Steps of the second takeover", res.Steps, want)
		result := idem.Result{Status: 201, Body: []byte("done")}
		h.mustComplete(st, "order-1", third.Token, result)
		h.mustBeComplete(st, "order-1", result)
	})

	s.parallel(t, "ReleaseWithoutStepsDeletes", func(h *harness) {
		st := h.fx.Store
		plain := h.params("plain", fingerprint("a"))
		h.mustWin(st, plain)
		stepped := h.params("stepped", fingerprint("a"))
		h.mustWin(st, stepped)
		h.mustSaveStep(st, "stepped", stepped.Token, "charge", []byte("ch_1"))

		h.release(st, "plain", plain.Token)
		h.mustBeAbsent(st, "plain")
		// A fresh claim, even of another request: nothing was recorded.
		res := h.claim(h.peerOrStore(), h.params("plain", fingerprint("b")))
		if !res.Won || res.Takeover || len(res.Steps) != 0 {
			h.t.Errorf("claim after a release without steps: won=%v takeover=%v steps=%d; want a fresh win", res.Won, res.Takeover, len(res.Steps))
		}
		h.mustHaveSteps(st, "stepped", []idem.RecordedStep{{Name: "charge", Value: []byte("ch_1")}})
	})

	s.parallel(t, "Takeover", func(h *harness) {
		st, taker := h.fx.Store, h.peerOrStore()
		fresh := h.params("fresh", fingerprint("a"))
		res := h.claim(st, fresh)
		if !res.Won || res.Takeover || len(res.Steps) != 0 {
			h.t.Errorf("claim of an absent key: won=%v takeover=%v steps=%d; want won, no takeover, no steps", res.Won, res.Takeover, len(res.Steps))
		}

		// Two executions die, one before it recorded a step, one after.
		bare := h.params("bare", fingerprint("a"))
		bare.Lease = shortLease
		h.mustWin(st, bare)
		stepped := h.params("stepped", fingerprint("a"))
		stepped.Lease = shortLease
		h.mustWin(st, stepped)
		claimed := time.Now()
		h.mustSaveStep(st, "stepped", stepped.Token, "charge", []byte("ch_1"))
		// A live lease is not taken over (Lease/NoTakeoverWhileValid):
		// only the flag is checked here.
		live := h.params("live", fingerprint("a"))
		h.mustWin(st, live)
		if res := h.claim(taker, h.params("live", fingerprint("a"))); res.Won || res.Takeover {
			h.t.Errorf("claim under a live lease: won=%v takeover=%v; want lost", res.Won, res.Takeover)
		}
		sleepPast(h.t, claimed, shortLease)

		res = h.claim(taker, h.params("bare", fingerprint("a")))
		if !res.Won || !res.Takeover || len(res.Steps) != 0 {
			h.t.Errorf("claim after a dead execution without steps: won=%v takeover=%v steps=%d; want a takeover without steps", res.Won, res.Takeover, len(res.Steps))
		}
		res = h.claim(taker, h.params("stepped", fingerprint("a")))
		if !res.Won || !res.Takeover {
			h.t.Fatalf("claim after a dead execution with steps: won=%v takeover=%v; want a takeover", res.Won, res.Takeover)
		}
		checkSteps(h.t, "steps of the dead execution", res.Steps, []idem.RecordedStep{{Name: "charge", Value: []byte("ch_1")}})

		// A completed key replays: a lost claim, no takeover.
		done := h.params("done", fingerprint("a"))
		h.mustWin(st, done)
		h.mustComplete(st, "done", done.Token, idem.Result{Status: 201})
		res = h.claim(taker, h.params("done", fingerprint("a")))
		if res.Won || res.Takeover {
			h.t.Errorf("claim of a complete key: won=%v takeover=%v; want lost, no takeover", res.Won, res.Takeover)
		}
	})

	// Past its retention a record counts as absent: its steps belong to
	// an operation that is over, and must not reach a new one that reuses
	// the key (with another request, even).
	s.parallel(t, "ExpiredForgetsSteps", func(h *harness) {
		st := h.fx.Store
		for i := range 2 {
			key := "order-" + strconv.Itoa(i)
			old := h.params(key, fingerprint("a"))
			old.Lease, old.Retention = shortLease, shortLease
			h.mustWin(st, old)
			h.mustSaveStep(st, key, old.Token, "charge", []byte("ch_old"))
			h.release(st, key, old.Token)
		}
		sleepPast(h.t, time.Now(), shortLease)
		for i, fp := range []string{"a", "b"} {
			key := "order-" + strconv.Itoa(i)
			p := h.params(key, fingerprint(fp))
			res := h.claim(h.peerOrStore(), p)
			if !res.Won || res.Takeover || len(res.Steps) != 0 {
				h.t.Errorf("claim of %s past its retention (fingerprint %s): won=%v takeover=%v steps=%d; want a fresh win without steps", key, fp, res.Won, res.Takeover, len(res.Steps))
			}
			h.mustHaveSteps(st, key, nil)
		}
	})

	s.parallel(t, "Tenants", func(h *harness) {
		st := h.fx.Store
		a, b := h, h.withTenant(newName("tenant"))
		pa := a.params("order-1", fingerprint("a"))
		a.mustWin(st, pa)
		a.mustSaveStep(st, "order-1", pa.Token, "charge", []byte("secret of a"))

		pb := b.params("order-1", fingerprint("a"))
		res := b.claim(h.peerOrStore(), pb)
		if !res.Won || res.Takeover || len(res.Steps) != 0 {
			h.t.Fatalf("tenant B's claim of the same key: won=%v takeover=%v steps=%d; want a fresh win", res.Won, res.Takeover, len(res.Steps))
		}
		b.mustHaveSteps(st, "order-1", nil)
		// A's token means nothing under B.
		if err := b.saveStep(st, "order-1", pa.Token, "charge", []byte("forged")); !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("SaveStep under tenant B with A's token = %v, want idem.ErrLeaseLost", err)
		}
		b.mustSaveStep(st, "order-1", pb.Token, "charge", []byte("b's own"))
		a.release(st, "order-1", pa.Token)
		b.release(st, "order-1", pb.Token)

		resA := a.claim(st, a.params("order-1", pa.Fingerprint))
		resB := b.claim(st, b.params("order-1", pb.Fingerprint))
		if !resA.Won || !resB.Won {
			h.t.Fatalf("takeovers after release: A won=%v, B won=%v", resA.Won, resB.Won)
		}
		checkSteps(h.t, "tenant A's steps", resA.Steps, []idem.RecordedStep{{Name: "charge", Value: []byte("secret of a")}})
		checkSteps(h.t, "tenant B's steps", resB.Steps, []idem.RecordedStep{{Name: "charge", Value: []byte("b's own")}})
	})

	// The steps of one execution may run concurrently (idem.Step under
	// different names): every one is kept. The same name saved at once
	// keeps one value.
	s.parallel(t, "ConcurrentSaves", func(h *harness) {
		stores := h.stores()
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(h.fx.Store, p)
		const same = 8
		errs := make([]error, stepRaceGoroutines+same)
		atOnce(len(errs), func(i int) {
			st := stores[i%len(stores)]
			name, value := "step-"+strconv.Itoa(i), []byte("value-"+strconv.Itoa(i))
			if i >= stepRaceGoroutines {
				name = "same"
			}
			errs[i] = st.(idem.StepStore).SaveStep(h.ctx, idem.SaveStepParams{Tenant: h.tenant, Key: "order-1", Token: p.Token, Name: name, Value: value})
		})
		for i, err := range errs {
			if err != nil {
				h.t.Errorf("SaveStep %d: %v", i, err)
			}
		}
		rec := h.mustBeInFlight(h.fx.Store, "order-1", p.Token)
		got := make(map[string][]byte)
		for _, s := range rec.Steps {
			if _, dup := got[s.Name]; dup {
				h.t.Errorf("step %q recorded twice", s.Name)
			}
			got[s.Name] = s.Value
		}
		for i := range stepRaceGoroutines {
			name := "step-" + strconv.Itoa(i)
			if v, ok := got[name]; !ok || string(v) != "value-"+strconv.Itoa(i) {
				h.t.Errorf("step %s = %q (recorded: %v), want %q", name, v, ok, "value-"+strconv.Itoa(i))
			}
		}
		v, ok := got["same"]
		n, err := strconv.Atoi(string(bytes.TrimPrefix(v, []byte("value-"))))
		if !ok || err != nil || n < stepRaceGoroutines || n >= len(errs) {
			h.t.Errorf("step saved %d times at once = %q (recorded: %v), want one of the values saved", same, v, ok)
		}
		if len(rec.Steps) != stepRaceGoroutines+1 {
			h.t.Errorf("%d steps recorded, want %d", len(rec.Steps), stepRaceGoroutines+1)
		}
	})

	// SaveStep commits on its own: the context it gets may carry the
	// handler's unit of work (the engine passes the handler's), which
	// rolls back when the handler fails, and the step must not go with it.
	s.parallel(t, "OutsideUnitOfWork", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		tx := h.begin(st)
		defer tx.Rollback(h.ctx) //nolint:errcheck // the case rolls it back
		business := newName("order")
		// A database that runs one writer at a time cannot save the step
		// beside a transaction that has written: the step comes first.
		if h.caps.Transactional && !h.caps.SingleWriter {
			h.businessWrite(tx, business)
		}
		if err := st.(idem.StepStore).SaveStep(tx.Context(h.ctx), idem.SaveStepParams{
			Tenant: h.tenant, Key: "order-1", Token: p.Token, Name: "charge", Value: []byte("ch_1"),
		}); err != nil {
			h.t.Fatalf("SaveStep with the unit of work's context: %v", err)
		}
		if h.caps.Transactional && h.caps.SingleWriter {
			h.businessWrite(tx, business)
		}
		if err := tx.Rollback(h.ctx); err != nil {
			h.t.Fatalf("Rollback: %v", err)
		}
		if h.caps.Transactional {
			h.mustCount(business, 0, "the rolled back business write")
		}
		want := []idem.RecordedStep{{Name: "charge", Value: []byte("ch_1")}}
		h.mustHaveSteps(st, "order-1", want)
		h.release(st, "order-1", p.Token)
		res := h.claim(h.peerOrStore(), h.params("order-1", p.Fingerprint))
		if !res.Won || !res.Takeover {
			h.t.Fatalf("claim after the rollback and release: won=%v takeover=%v; want a takeover", res.Won, res.Takeover)
		}
		checkSteps(h.t, "steps after the unit of work rolled back", res.Steps, want)
	})

	// Through the engine: a handler charges a card in a step, then fails;
	// its writes roll back and its key is released, but the retry gets
	// the charge back instead of charging again.
	s.parallel(t, "EngineStepOnce", func(h *harness) {
		if h.caps.SingleTransaction {
			h.stepRefused()
			return
		}
		engines := h.engines(nil)
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /payments")}
		var charges atomic.Int32
		charge := func(context.Context) (string, error) {
			return fmt.Sprintf("ch_%d", charges.Add(1)), nil
		}
		firstWrite, retryWrite := newName("payment"), newName("payment")
		boom := errors.New("the receipt could not be written")
		// A database that runs one writer at a time cannot save the step
		// beside a transaction that has written: there the step comes
		// first.
		writeFirst := !h.caps.SingleWriter
		_, err := engines[0].Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
			if writeFirst {
				h.writeFrom(ctx, firstWrite)
			}
			if _, err := idem.Step(ctx, "charge", charge); err != nil {
				return idem.Result{}, err
			}
			if !writeFirst {
				h.writeFrom(ctx, firstWrite)
			}
			return idem.Result{}, boom
		})
		if !errors.Is(err, boom) {
			h.t.Fatalf("first Do = %v, want the handler's error", err)
		}
		if h.caps.Transactional {
			h.mustCount(firstWrite, 0, "the failed execution's business write rolls back")
		}
		h.mustHaveSteps(h.fx.Store, op.Key, []idem.RecordedStep{{Name: "charge", Value: []byte(`"ch_1"`)}})

		var exec idem.Execution
		want := idem.Result{Status: 201, Body: []byte("paid")}
		out, err := engines[len(engines)-1].Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
			exec, _ = idem.ExecutionFromContext(ctx)
			id, err := idem.Step(ctx, "charge", charge)
			if err != nil {
				return idem.Result{}, err
			}
			h.writeFrom(ctx, retryWrite)
			if id != "ch_1" {
				h.t.Errorf("the retry's step returned %q, want the recorded ch_1", id)
			}
			return want, nil
		})
		if err != nil || out.Replayed {
			h.t.Fatalf("retry = %+v, %v; want a fresh outcome", out, err)
		}
		if n := charges.Load(); n != 1 {
			h.t.Errorf("the card was charged %d times, want 1", n)
		}
		if !exec.Takeover || exec.RecoveryPoint != "charge" {
			h.t.Errorf("the retry ran with Takeover=%v RecoveryPoint=%q, want true and \"charge\"", exec.Takeover, exec.RecoveryPoint)
		}
		if h.caps.Transactional {
			h.mustCount(retryWrite, 1, "the retry's business write commits")
		}
		h.mustBeComplete(h.fx.Store, op.Key, want)
	})

	s.stepsThroughEngine(t)

	// A purge deletes a record with steps once its retention has passed,
	// as any other, and keeps it before.
	s.serial(t, "Purge", func(h *harness) {
		st := h.fx.Store
		expired := h.params("expired", fingerprint("a"))
		expired.Lease, expired.Retention = shortLease, shortLease
		h.mustWin(st, expired)
		h.mustSaveStep(st, "expired", expired.Token, "charge", []byte("ch_1"))
		h.release(st, "expired", expired.Token)
		live := h.params("live", fingerprint("a"))
		live.Lease = shortLease
		h.mustWin(st, live)
		h.mustSaveStep(st, "live", live.Token, "charge", []byte("ch_2"))
		h.release(st, "live", live.Token)
		sleepPast(h.t, time.Now(), shortLease)

		for call := 0; ; call++ {
			n, err := st.Purge(h.ctx, idem.PurgeParams{Limit: 100})
			if err != nil {
				h.t.Fatalf("Purge: %v", err)
			}
			if n < 100 {
				break
			}
			if call > 10000 {
				h.t.Fatal("Purge keeps returning full batches")
			}
		}
		h.mustBeAbsent(st, "expired")
		h.mustHaveSteps(st, "live", []idem.RecordedStep{{Name: "charge", Value: []byte("ch_2")}})
	})
}

// storeName tells Store from Peer in step names.
func (h *harness) storeName(st idem.Store) string {
	if st == h.fx.Store {
		return "store"
	}
	return "peer"
}

// namedSteps returns the steps prefix+"store" (and prefix+"peer" when
// there is a Peer, and it is not Store itself) with value.
func (h *harness) namedSteps(prefix, value string) []idem.RecordedStep {
	out := []idem.RecordedStep{{Name: prefix + "store", Value: []byte(value)}}
	if h.fx.Peer != nil && h.fx.Peer != h.fx.Store {
		out = append(out, idem.RecordedStep{Name: prefix + "peer", Value: []byte(value)})
	}
	return out
}

// saveStep saves a step of key under token through st.
func (h *harness) saveStep(st idem.Store, key string, token int64, name string, value []byte) error {
	h.t.Helper()
	ss, ok := st.(idem.StepStore)
	if !ok {
		h.t.Fatalf("%T does not implement idem.StepStore", st)
	}
	return ss.SaveStep(h.ctx, idem.SaveStepParams{Tenant: h.tenant, Key: key, Token: token, Name: name, Value: value})
}

func (h *harness) mustSaveStep(st idem.Store, key string, token int64, name string, value []byte) {
	h.t.Helper()
	if err := h.saveStep(st, key, token, name, value); err != nil {
		h.t.Fatalf("SaveStep(%q, %q, %q): %v", h.tenant, key, name, err)
	}
}

// release releases key under token, failing the case on an error.
func (h *harness) release(st idem.Store, key string, token int64) {
	h.t.Helper()
	if err := st.Release(h.ctx, idem.ReleaseParams{Tenant: h.tenant, Key: key, Token: token}); err != nil {
		h.t.Fatalf("Release(%q, %q): %v", h.tenant, key, err)
	}
}

// mustHaveSteps fails the case unless Get of key returns want as its
// steps.
func (h *harness) mustHaveSteps(st idem.Store, key string, want []idem.RecordedStep) {
	h.t.Helper()
	checkSteps(h.t, "steps of "+key, h.get(st, key).Steps, want)
}

// checkSteps reports steps that are not want, in order. A nil value
// equals an empty one.
func checkSteps(t *testing.T, what string, got, want []idem.RecordedStep) {
	t.Helper()
	same := len(got) == len(want)
	for i := 0; same && i < len(got); i++ {
		same = got[i].Name == want[i].Name && bytes.Equal(got[i].Value, want[i].Value)
	}
	if !same {
		t.Errorf("%s = %s, want %s", what, showSteps(got), showSteps(want))
	}
}

func showSteps(steps []idem.RecordedStep) string {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, s := range steps {
		if i > 0 {
			b.WriteString(", ")
		}
		v := s.Value
		if len(v) > 40 {
			fmt.Fprintf(&b, "%q: %d bytes %q…", s.Name, len(v), v[:40])
			continue
		}
		fmt.Fprintf(&b, "%q: %q", s.Name, v)
	}
	b.WriteByte(']')
	return b.String()
}
