package idemstoretest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// refStore is a small transactional store, obviously correct when bugs is
// zero, kept beside the suite for two uses: it proves the Transactional
// cases pass on a correct store, and each bugs field plants one defect a
// real store could have, so that the mutants test proves the suite catches
// it.
type refStore struct {
	bugs bugs
	// selfExpiring makes records vanish once past retention and lease,
	// as Redis TTLs do, and Purge a no-op: the Capabilities.SelfExpiring
	// way of being correct.
	selfExpiring bool

	mu      sync.Mutex
	records map[string]*idem.Record
	rows    map[string]int // committed business rows by id
}

// bugs are the defects refStore can plant, one per field.
type bugs struct {
	racyClaim              bool // reads, then writes with the lock released between
	racyTakeover           bool // the same, only when it replaces a record
	completeTwice          bool // Complete overwrites a complete record
	extendNoop             bool // Extend answers but moves nothing
	aliasBody              bool // the stored body is the caller's slice
	purgeStaleSnapshot     bool // purge picks, unlocks, then deletes what it picked
	noFence                bool // Complete ignores the lease token
	takeoverAnyFingerprint bool // an expired lease goes to any request
	ignoreRetention        bool // expired records still count
	purgeLiveLeases        bool // purge looks at retention only
	purgeNoLimit           bool // purge deletes every expired record at once
	joinedID               bool // (tenant, key) stored as tenant+":"+key
	foldCase               bool // keys compared without case, as a _ci collation does
	truncateBody           bool // bodies cut at 64 KiB, as a too small column would
	extendKeepsRetention   bool // Extend moves the lease only
	ignoreCtx              bool // a cancelled context goes unnoticed
	releaseAny             bool // Release deletes whatever the token or state
	keepWritesOnLostLease  bool // a refused Complete still commits the business writes

	// Recovery points.
	stepsNoFence       bool // SaveStep ignores the token and the state
	stepsLastValue     bool // a name saved again takes the new value
	stepAliasValue     bool // the stored value is the caller's slice
	racySaveStep       bool // SaveStep reads the steps, unlocks, then writes them back
	stepsInUnit        bool // SaveStep joins the unit of work in ctx and rolls back with it
	stepsIgnoreTenant  bool // SaveStep finds the record by key and token alone
	releaseDropsSteps  bool // Release deletes a record that holds steps
	releaseKeepsLease  bool // Release leaves a record that holds steps under its lease
	takeoverDropsSteps bool // a takeover starts without the steps
	takeoverFlagAlways bool // every won claim says Takeover
	expiredKeepsSteps  bool // a claim past retention inherits the old steps
	purgeSkipsStepped  bool // Purge never deletes a record that holds steps
}

var (
	_ idem.Store     = (*refStore)(nil)
	_ idem.StepStore = (*refStore)(nil)
)

func newRefStore(b bugs) *refStore {
	return &refStore{bugs: b, records: make(map[string]*idem.Record), rows: make(map[string]int)}
}

func (s *refStore) id(tenant, key string) string {
	id := fmt.Sprintf("%q %q", tenant, key)
	if s.bugs.joinedID {
		id = tenant + ":" + key
	}
	if s.bugs.foldCase {
		id = strings.ToLower(id)
	}
	return id
}

func (s *refStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if err := s.ctxErr(ctx); err != nil {
		return idem.ClaimResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.id(p.Tenant, p.Key)
	now := time.Now()
	s.expire(id, now)
	rec := s.records[id]
	if rec != nil && (s.bugs.ignoreRetention || now.Before(rec.ExpiresAt)) {
		takeover := rec.State == idem.StateInFlight && !now.Before(rec.LockedUntil) &&
			(s.bugs.takeoverAnyFingerprint || rec.SameFingerprint(p.Fingerprint))
		if !takeover {
			return idem.ClaimResult{Record: copyRecord(rec)}, nil
		}
	}
	if s.bugs.racyClaim || s.bugs.racyTakeover && rec != nil {
		s.mu.Unlock()
		runtime.Gosched()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
	}
	takeover := rec != nil && now.Before(rec.ExpiresAt)
	var steps []idem.RecordedStep
	if rec != nil && (takeover && !s.bugs.takeoverDropsSteps || s.bugs.expiredKeepsSteps) {
		steps = rec.Steps
	}
	s.records[id] = &idem.Record{
		Steps:       steps,
		Tenant:      p.Tenant,
		Key:         p.Key,
		Fingerprint: append([]byte(nil), p.Fingerprint...),
		State:       idem.StateInFlight,
		LeaseToken:  p.Token,
		LockedUntil: now.Add(p.Lease),
		CreatedAt:   now,
		ExpiresAt:   now.Add(p.Retention),
	}
	res := idem.ClaimResult{Won: true, Takeover: takeover || s.bugs.takeoverFlagAlways}
	if takeover {
		res.Steps = copySteps(steps)
	}
	return res, nil
}

func (s *refStore) SaveStep(ctx context.Context, p idem.SaveStepParams) error {
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	value := p.Value
	if !s.bugs.stepAliasValue {
		value = append([]byte(nil), value...)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[s.id(p.Tenant, p.Key)]
	if s.bugs.stepsIgnoreTenant {
		for _, r := range s.records {
			if r.Key == p.Key && r.LeaseToken == p.Token {
				rec = r
			}
		}
	}
	if rec == nil || !s.bugs.stepsNoFence && (rec.State != idem.StateInFlight || rec.LeaseToken != p.Token) {
		return idem.ErrLeaseLost
	}
	if tx, ok := ctx.Value(refTxKey{}).(*refTx); ok && s.bugs.stepsInUnit {
		tx.pendingSteps = append(tx.pendingSteps, pendingStep{rec, idem.RecordedStep{Name: p.Name, Value: value}})
		return nil
	}
	steps := rec.Steps
	if s.bugs.racySaveStep {
		s.mu.Unlock()
		runtime.Gosched()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
	}
	rec.Steps = addStep(steps, idem.RecordedStep{Name: p.Name, Value: value}, s.bugs.stepsLastValue)
	return nil
}

// addStep returns steps with step, which keeps the first value of its
// name unless last.
func addStep(steps []idem.RecordedStep, step idem.RecordedStep, last bool) []idem.RecordedStep {
	for i, s := range steps {
		if s.Name == step.Name {
			if last {
				steps[i] = step
			}
			return steps
		}
	}
	// A new array each time: a racy writer's stale copy must not share it.
	return append(steps[:len(steps):len(steps)], step)
}

// Info implements idem.Store.
func (s *refStore) Info() idem.StoreInfo {
	return idem.StoreInfo{Name: "reference", Transactional: !s.selfExpiring}
}

func (s *refStore) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	if err := s.ctxErr(ctx); err != nil {
		return nil, err
	}
	return &refTx{s: s}, nil
}

func (s *refStore) Extend(ctx context.Context, p idem.ExtendParams) error {
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[s.id(p.Tenant, p.Key)]
	if rec == nil || rec.State != idem.StateInFlight || rec.LeaseToken != p.Token {
		return idem.ErrLeaseLost
	}
	if s.bugs.extendNoop {
		return nil
	}
	rec.LockedUntil = time.Now().Add(p.Lease)
	if !s.bugs.extendKeepsRetention && rec.ExpiresAt.Before(rec.LockedUntil) {
		rec.ExpiresAt = rec.LockedUntil
	}
	return nil
}

func (s *refStore) Release(ctx context.Context, p idem.ReleaseParams) error {
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.id(p.Tenant, p.Key)
	rec := s.records[id]
	if rec != nil && (s.bugs.releaseAny || rec.State == idem.StateInFlight && rec.LeaseToken == p.Token) {
		if len(rec.Steps) > 0 && !s.bugs.releaseDropsSteps {
			if !s.bugs.releaseKeepsLease {
				rec.LockedUntil = time.Now()
			}
			return nil
		}
		delete(s.records, id)
	}
	return nil
}

func (s *refStore) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	if err := s.ctxErr(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.id(tenant, key)
	s.expire(id, time.Now())
	rec := s.records[id]
	if rec == nil {
		return nil, idem.ErrNotFound
	}
	return copyRecord(rec), nil
}

func (s *refStore) Purge(ctx context.Context, p idem.PurgeParams) (int, error) {
	if err := s.ctxErr(ctx); err != nil {
		return 0, err
	}
	if s.selfExpiring {
		return 0, nil
	}
	limit := p.Limit
	if limit <= 0 || s.bugs.purgeNoLimit {
		limit = 1 << 30
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var picked []string
	for id, rec := range s.records {
		if len(picked) == limit {
			break
		}
		if now.Before(rec.ExpiresAt) {
			continue
		}
		if !s.bugs.purgeLiveLeases && rec.State == idem.StateInFlight && now.Before(rec.LockedUntil) {
			continue
		}
		if s.bugs.purgeSkipsStepped && len(rec.Steps) > 0 {
			continue
		}
		picked = append(picked, id)
	}
	if s.bugs.purgeStaleSnapshot {
		s.mu.Unlock()
		runtime.Gosched()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
	}
	for _, id := range picked {
		delete(s.records, id)
	}
	return len(picked), nil
}

// expire deletes the record id of a selfExpiring store once its retention
// and its lease have passed; the caller holds the lock.
func (s *refStore) expire(id string, now time.Time) {
	rec := s.records[id]
	if !s.selfExpiring || rec == nil || now.Before(rec.ExpiresAt) || now.Before(rec.LockedUntil) {
		return
	}
	delete(s.records, id)
}

func (s *refStore) ctxErr(ctx context.Context) error {
	if s.bugs.ignoreCtx {
		return nil
	}
	return ctx.Err()
}

// businessWrite is Fixture.BusinessWrite: the row waits in the unit of
// work carried by ctx until it completes.
func (s *refStore) businessWrite(ctx context.Context, id string) error {
	tx, ok := ctx.Value(refTxKey{}).(*refTx)
	if !ok {
		return errors.New("refstore: no unit of work in the context")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if tx.done {
		return errors.New("refstore: the unit of work is over")
	}
	tx.pending = append(tx.pending, id)
	return nil
}

// businessCount is Fixture.BusinessCount.
func (s *refStore) businessCount(ctx context.Context, id string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rows[id], nil
}

type refTxKey struct{}

// refTx holds business writes until Complete commits them together with
// the result, under the store's lock, so nobody sees one without the
// other.
type refTx struct {
	s            *refStore
	pending      []string
	pendingSteps []pendingStep // bugs.stepsInUnit
	done         bool
}

// pendingStep is a step waiting in a unit of work (bugs.stepsInUnit).
type pendingStep struct {
	rec  *idem.Record
	step idem.RecordedStep
}

func (t *refTx) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, refTxKey{}, t)
}

func (t *refTx) Complete(ctx context.Context, p idem.CompleteParams) error {
	s := t.s
	if err := s.ctxErr(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.done {
		return errors.New("refstore: the unit of work is over")
	}
	t.done = true
	rec := s.records[s.id(p.Tenant, p.Key)]
	if rec == nil || (!s.bugs.completeTwice && rec.State != idem.StateInFlight) || (!s.bugs.noFence && rec.LeaseToken != p.Token) {
		if s.bugs.keepWritesOnLostLease {
			t.commit()
		}
		return idem.ErrLeaseLost
	}
	res := p.Result
	if !s.bugs.aliasBody {
		res.Body = append([]byte(nil), res.Body...)
	}
	if s.bugs.truncateBody && len(res.Body) > 64<<10 {
		res.Body = res.Body[:64<<10]
	}
	res.Header = copyHeader(res.Header)
	rec.State = idem.StateComplete
	rec.Result = res
	rec.CompletedAt = time.Now()
	t.commit()
	return nil
}

// commit applies the pending writes; the caller holds the store's lock.
func (t *refTx) commit() {
	for _, id := range t.pending {
		t.s.rows[id]++
	}
	t.pending = nil
	for _, p := range t.pendingSteps {
		p.rec.Steps = addStep(p.rec.Steps, p.step, false)
	}
	t.pendingSteps = nil
}

func (t *refTx) Rollback(ctx context.Context) error {
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	t.done = true
	t.pending = nil
	t.pendingSteps = nil
	return nil
}

func copyRecord(rec *idem.Record) *idem.Record {
	c := *rec
	c.Fingerprint = append([]byte(nil), rec.Fingerprint...)
	c.Result.Body = append([]byte(nil), rec.Result.Body...)
	c.Result.Header = copyHeader(rec.Result.Header)
	c.Steps = copySteps(rec.Steps)
	return &c
}

func copySteps(steps []idem.RecordedStep) []idem.RecordedStep {
	var c []idem.RecordedStep
	for _, s := range steps {
		c = append(c, idem.RecordedStep{Name: s.Name, Value: append([]byte(nil), s.Value...)})
	}
	return c
}

func copyHeader(h map[string][]string) map[string][]string {
	if h == nil {
		return nil
	}
	c := make(map[string][]string, len(h))
	for k, v := range h {
		c[k] = append([]string(nil), v...)
	}
	return c
}
