// Package idemmem is an in-memory idem.Store, for tests, single-process
// services and benchmarks.
//
// It has no transactions: Tx.Complete writes the result by itself, so a
// business write made elsewhere is not committed together with it. Records
// live in the process and are gone when it exits. Use idemsql or idempg
// when the result must commit with a business write.
package idemmem

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

const shardCount = 64

// Config configures a Store.
type Config struct {
	// NowFunc is the store's clock. Defaults to time.Now. Tests set it to
	// move time forward without sleeping.
	NowFunc func() time.Time
}

// Store is an in-memory idem.Store. The zero value is not usable; call New.
type Store struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [shardCount]shard
}

type shard struct {
	mu      sync.Mutex
	records map[recordID]*idem.Record
}

type recordID struct{ tenant, key string }

// entry is a record with room for its fingerprint.
type entry struct {
	rec idem.Record
	fp  [32]byte
}

// own returns a copy of fingerprint, in the entry when it fits.
func (e *entry) own(fingerprint []byte) []byte {
	if len(fingerprint) == 0 {
		return nil
	}
	if len(fingerprint) <= len(e.fp) {
		return e.fp[:copy(e.fp[:], fingerprint):len(fingerprint)]
	}
	return append([]byte(nil), fingerprint...)
}

var _ idem.Store = (*Store)(nil)

// New returns an empty store. A nil config means the defaults.
func New(config *Config) *Store {
	s := &Store{now: time.Now, seed: maphash.MakeSeed()}
	if config != nil && config.NowFunc != nil {
		s.now = config.NowFunc
	}
	for i := range s.shards {
		s.shards[i].records = make(map[recordID]*idem.Record)
	}
	return s
}

func (s *Store) shard(tenant, key string) *shard {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(tenant)
	h.WriteByte(0)
	h.WriteString(key)
	return &s.shards[h.Sum64()%shardCount]
}

// Claim implements idem.Store.
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idem.ClaimResult{}, err
	}
	sh := s.shard(p.Tenant, p.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	id := recordID{p.Tenant, p.Key}
	rec := sh.records[id]
	if rec != nil && now.Before(rec.ExpiresAt) {
		takeover := rec.State == idem.StateInFlight && !now.Before(rec.LockedUntil) && rec.SameFingerprint(p.Fingerprint)
		if !takeover {
			return idem.ClaimResult{Record: copyRecord(rec)}, nil
		}
	}
	// The record and a fingerprint of the usual size (SHA-256) share one
	// allocation.
	e := &entry{}
	e.rec = idem.Record{
		Tenant:      p.Tenant,
		Key:         p.Key,
		Fingerprint: e.own(p.Fingerprint),
		State:       idem.StateInFlight,
		LeaseToken:  p.Token,
		LockedUntil: now.Add(p.Lease),
		CreatedAt:   now,
		ExpiresAt:   now.Add(p.Retention),
	}
	sh.records[id] = &e.rec
	return idem.ClaimResult{Won: true}, nil
}

// Begin implements idem.Store. The returned Tx only completes.
func (s *Store) Begin(ctx context.Context) (idem.Tx, error) {
	return tx{s}, ctx.Err()
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, p idem.ExtendParams) error {
	return s.held(p.Tenant, p.Key, p.Token, func(sh *shard, rec *idem.Record, now time.Time) error {
		rec.LockedUntil = now.Add(p.Lease)
		if rec.ExpiresAt.Before(rec.LockedUntil) {
			rec.ExpiresAt = rec.LockedUntil
		}
		return nil
	})
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	err := s.held(p.Tenant, p.Key, p.Token, func(sh *shard, rec *idem.Record, now time.Time) error {
		delete(sh.records, recordID{p.Tenant, p.Key})
		return nil
	})
	if err == idem.ErrLeaseLost {
		return nil
	}
	return err
}

// held runs fn under the shard lock when (tenant, key) is in flight under
// token, and returns idem.ErrLeaseLost otherwise.
func (s *Store) held(tenant, key string, token int64, fn func(*shard, *idem.Record, time.Time) error) error {
	sh := s.shard(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec := sh.records[recordID{tenant, key}]
	if rec == nil || rec.State != idem.StateInFlight || rec.LeaseToken != token {
		return idem.ErrLeaseLost
	}
	return fn(sh, rec, s.now())
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	sh := s.shard(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec := sh.records[recordID{tenant, key}]
	if rec == nil {
		return nil, idem.ErrNotFound
	}
	return copyRecord(rec), nil
}

// Purge implements idem.Store. It locks one shard at a time, so claims on
// the other shards go on while it runs.
func (s *Store) Purge(ctx context.Context, p idem.PurgeParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 1000
	}
	deleted := 0
	for i := range s.shards {
		if deleted >= limit {
			break
		}
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for id, rec := range sh.records {
			if deleted >= limit {
				break
			}
			if now.Before(rec.ExpiresAt) || (rec.State == idem.StateInFlight && now.Before(rec.LockedUntil)) {
				continue
			}
			delete(sh.records, id)
			deleted++
		}
		sh.mu.Unlock()
	}
	return deleted, nil
}

// Len returns the number of records held, expired ones included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.Lock()
		n += len(s.shards[i].records)
		s.shards[i].mu.Unlock()
	}
	return n
}

type tx struct{ s *Store }

func (t tx) Context(ctx context.Context) context.Context { return ctx }

func (t tx) Rollback(ctx context.Context) error { return nil }

func (t tx) Complete(ctx context.Context, p idem.CompleteParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	res := p.Result
	res.Body = append([]byte(nil), res.Body...)
	res.Header = copyHeader(res.Header)
	return t.s.held(p.Tenant, p.Key, p.Token, func(sh *shard, rec *idem.Record, now time.Time) error {
		rec.State = idem.StateComplete
		rec.Result = res
		rec.CompletedAt = now
		return nil
	})
}

// copyRecord returns a copy that shares nothing mutable with the stored
// record: callers may keep and change it.
func copyRecord(rec *idem.Record) *idem.Record {
	c := *rec
	c.Fingerprint = append([]byte(nil), rec.Fingerprint...)
	c.Result.Body = append([]byte(nil), rec.Result.Body...)
	c.Result.Header = copyHeader(rec.Result.Header)
	return &c
}

// copyHeader copies h with all its values in one backing array: two
// allocations whatever the number of fields.
func copyHeader(h map[string][]string) map[string][]string {
	if h == nil {
		return nil
	}
	n := 0
	for _, v := range h {
		n += len(v)
	}
	values := make([]string, 0, n)
	c := make(map[string][]string, len(h))
	for k, v := range h {
		start := len(values)
		values = append(values, v...)
		c[k] = values[start:len(values):len(values)]
	}
	return c
}
