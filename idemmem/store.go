// Package idemmem is an in-memory idem.Store, for tests, single-process
// services and benchmarks.
//
// It has no transactions: Tx.Complete writes the result by itself, so a
// business write made elsewhere is not committed together with it. It
// keeps recovery points (idem.Step) as an idem.StepStore. Records live in
// the process and are gone when it exits, recovery points with them. Use idemsql or idempg
// when the result must commit with a business write. It is an
// idem.Watcher: duplicates that wait for an execution in flight
// (idem.Operation.WaitInFlight) are woken by its completion, its release,
// a takeover or the end of its lease.
package idemmem

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// Config configures a Store.
type Config struct {
	// NowFunc is the store's clock. Defaults to time.Now. Tests set it to
	// move time forward without sleeping.
	NowFunc func() time.Time
}

// Store is an in-memory idem.Store: a map under one mutex. The zero value
// is not usable; call NewStore.
type Store struct {
	now func() time.Time

	mu      sync.Mutex
	records map[recordKey]*entry
}

// recordKey names a record: the pair itself, so that distinct pairs never
// meet, whatever bytes they hold.
type recordKey struct{ tenant, key string }

// entry is one stored record. rec shares nothing with the callers: what
// goes in and what comes out is copied. The result's header and body are
// kept apart from rec, in data: one buffer without pointers, which the
// garbage collector never scans. Kept as a copied map, the header was
// three more objects per record for it to mark, and
// BenchmarkFirstExecution (idemhttp) took about 40 % more CPU, most of it
// in the collector's marking.
type entry struct {
	rec idem.Record // its Result without Header and Body
	// data is the header encoded by appendHeader, headerLen bytes, then
	// the body. It is never written after Complete.
	data                       []byte
	headerLen                  int
	hasHeader                  bool     // the header was not nil (an empty one stays empty)
	headerFields, headerValues int      // what the header holds, for readHeader
	watch                      *watch   // the Watch subscriptions, nil when there are none
	fp                         [32]byte // rec.Fingerprint, when it fits
}

// own returns a copy of fingerprint, in e itself when it fits (a SHA-256
// fingerprint, as the front ends compute): one allocation less a claim.
func (e *entry) own(fingerprint []byte) []byte {
	switch {
	case len(fingerprint) == 0:
		return nil
	case len(fingerprint) <= len(e.fp):
		return e.fp[:copy(e.fp[:], fingerprint):len(fingerprint)]
	}
	return bytes.Clone(fingerprint)
}

func (e *entry) inFlight() bool { return e.rec.State == idem.StateInFlight }

var (
	_ idem.Store     = (*Store)(nil)
	_ idem.StepStore = (*Store)(nil)
)

// Info implements idem.Store: "memory", without transactions.
func (s *Store) Info() idem.StoreInfo { return idem.StoreInfo{Name: "memory"} }

// NewStore returns an empty store. A nil config means the defaults.
func NewStore(config *Config) *Store {
	s := &Store{now: time.Now, records: make(map[recordKey]*entry)}
	if config != nil && config.NowFunc != nil {
		s.now = config.NowFunc
	}
	return s
}

// remove deletes e, the record of k, and tells its subscribers. The caller
// holds s.mu.
func (s *Store) remove(k recordKey, e *entry) {
	s.changed(e)
	delete(s.records, k)
}

// Claim implements idem.Store.
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idem.ClaimResult{}, err
	}
	k := recordKey{p.Tenant, p.Key}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	old := s.records[k]
	takeover := false
	if old != nil && now.Before(old.rec.ExpiresAt) {
		takeover = old.inFlight() && !now.Before(old.rec.LockedUntil) && old.rec.SameFingerprint(p.Fingerprint)
		if !takeover {
			return idem.ClaimResult{Record: old.record()}, nil
		}
	}
	e := &entry{rec: idem.Record{
		Tenant:      p.Tenant,
		Key:         p.Key,
		State:       idem.StateInFlight,
		LeaseToken:  p.Token,
		LockedUntil: now.Add(p.Lease),
		CreatedAt:   now,
		ExpiresAt:   now.Add(p.Retention),
	}}
	e.rec.Fingerprint = e.own(p.Fingerprint)
	res := idem.ClaimResult{Won: true, Takeover: takeover}
	if takeover {
		// The steps go on with the operation: the new execution gets
		// them, and so does any that takes over from it.
		e.rec.Steps = old.rec.Steps
		res.Steps = cloneSteps(old.rec.Steps)
	}
	if old != nil {
		s.changed(old)
	}
	s.records[k] = e
	return res, nil
}

// Begin implements idem.Store. The returned Tx only completes.
func (s *Store) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	return tx{s}, ctx.Err()
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, p idem.ExtendParams) error {
	return s.held(p.Tenant, p.Key, p.Token, func(e *entry, now time.Time) {
		e.rec.LockedUntil = now.Add(p.Lease)
		if e.rec.ExpiresAt.Before(e.rec.LockedUntil) {
			e.rec.ExpiresAt = e.rec.LockedUntil
		}
	})
}

// Release implements idem.Store. A record that holds steps is kept, its
// lease ended, so that the next claim takes it over with them.
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	err := s.held(p.Tenant, p.Key, p.Token, func(e *entry, now time.Time) {
		if len(e.rec.Steps) > 0 {
			if now.Before(e.rec.LockedUntil) {
				e.rec.LockedUntil = now
			}
			s.changed(e)
			return
		}
		s.remove(recordKey{p.Tenant, p.Key}, e)
	})
	if err == idem.ErrLeaseLost {
		return nil
	}
	return err
}

// SaveStep implements idem.StepStore. The step is kept in memory, which
// is as durable as this store gets.
func (s *Store) SaveStep(ctx context.Context, p idem.SaveStepParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.held(p.Tenant, p.Key, p.Token, func(e *entry, now time.Time) {
		for _, st := range e.rec.Steps {
			if st.Name == p.Name {
				return // the first value stays
			}
		}
		e.rec.Steps = append(e.rec.Steps, idem.RecordedStep{Name: p.Name, Value: bytes.Clone(p.Value)})
	})
}

// held runs fn under the lock when (tenant, key) is in flight under
// token, and returns idem.ErrLeaseLost otherwise.
func (s *Store) held(tenant, key string, token int64, fn func(e *entry, now time.Time)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.records[recordKey{tenant, key}]
	if e == nil || !e.inFlight() || e.rec.LeaseToken != token {
		return idem.ErrLeaseLost
	}
	fn(e, s.now())
	return nil
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.records[recordKey{tenant, key}]
	if e == nil {
		return nil, idem.ErrNotFound
	}
	return e.record(), nil
}

// Purge implements idem.Store.
func (s *Store) Purge(ctx context.Context, p idem.PurgeParams) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	deleted := 0
	for k, e := range s.records {
		if deleted >= limit {
			break
		}
		if now.Before(e.rec.ExpiresAt) || (e.inFlight() && now.Before(e.rec.LockedUntil)) {
			continue
		}
		s.remove(k, e)
		deleted++
	}
	return deleted, nil
}

// Len returns the number of records held, expired ones included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

type tx struct{ s *Store }

func (t tx) Context(ctx context.Context) context.Context { return ctx }

func (t tx) Rollback(ctx context.Context) error { return nil }

func (t tx) Complete(ctx context.Context, p idem.CompleteParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Copied before taking the lock: the caller reuses its buffers. The
	// header is encoded on the stack first, then copied with the body:
	// one allocation of the exact size.
	res := p.Result
	var scratch [512]byte
	header := appendHeader(scratch[:0], res.Header)
	var data []byte
	if n := len(header) + len(res.Body); n > 0 {
		data = make([]byte, n)
		copy(data[copy(data, header):], res.Body)
	}
	fields, values := len(res.Header), 0
	for _, v := range res.Header {
		values += len(v)
	}
	hasHeader, headerLen := res.Header != nil, len(header)
	res.Header, res.Body = nil, nil
	return t.s.held(p.Tenant, p.Key, p.Token, func(e *entry, now time.Time) {
		t.s.changed(e)
		e.rec.State = idem.StateComplete
		e.rec.CompletedAt = now
		e.rec.Result = res
		e.data, e.headerLen, e.hasHeader = data, headerLen, hasHeader
		e.headerFields, e.headerValues = fields, values
	})
}

// record returns e as an idem.Record that shares nothing mutable with the
// store: callers may keep and change it.
func (e *entry) record() *idem.Record {
	rec := e.rec
	// The fingerprint and the body share one copy, each capped so that an
	// append to one cannot run into the other.
	fp, body := rec.Fingerprint, e.data[e.headerLen:]
	rec.Fingerprint, rec.Result.Body = nil, nil
	if n := len(fp) + len(body); n > 0 {
		buf := append(append(make([]byte, 0, n), fp...), body...)
		if len(fp) > 0 {
			rec.Fingerprint = buf[:len(fp):len(fp)]
		}
		if len(body) > 0 {
			rec.Result.Body = buf[len(fp):n:n]
		}
	}
	if e.hasHeader {
		rec.Result.Header = readHeader(e.data[:e.headerLen], e.headerFields, e.headerValues)
	}
	rec.Steps = cloneSteps(rec.Steps)
	return &rec
}

// appendHeader appends h to b: for each field its name, the number of its
// values, then the values, each string prefixed by its length, every
// number a uvarint.
func appendHeader(b []byte, h map[string][]string) []byte {
	for name, values := range h {
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = appendString(b, v)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// readHeader decodes what appendHeader wrote of a header of fields fields
// and values values, into a new map. Its strings share one copy of b, and
// its values one backing array.
func readHeader(b []byte, fields, values int) map[string][]string {
	s := string(b)
	off := 0
	number := func() int {
		n, size := binary.Uvarint(b[off:])
		off += size
		return int(n)
	}
	str := func() string {
		n := number()
		off += n
		return s[off-n : off]
	}
	h := make(map[string][]string, fields)
	all := make([]string, 0, values)
	for range fields {
		name := str()
		start := len(all)
		for range number() {
			all = append(all, str())
		}
		h[name] = all[start:len(all):len(all)]
	}
	return h
}

// cloneSteps copies steps, values included.
func cloneSteps(steps []idem.RecordedStep) []idem.RecordedStep {
	if len(steps) == 0 {
		return nil
	}
	out := make([]idem.RecordedStep, len(steps))
	for i, st := range steps {
		out[i] = idem.RecordedStep{Name: st.Name, Value: bytes.Clone(st.Value)}
	}
	return out
}
