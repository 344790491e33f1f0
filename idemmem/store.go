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
	"hash/maphash"
	"sync"
	"time"
	"unsafe"

	"github.com/idem-go/idem"
)

const shardCount = 64

// Config configures a Store.
type Config struct {
	// NowFunc is the store's clock. Defaults to time.Now. Tests set it to
	// move time forward without sleeping.
	NowFunc func() time.Time
}

// Store is an in-memory idem.Store. The zero value is not usable; call NewStore.
type Store struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [shardCount]shard
}

type shard struct {
	mu sync.Mutex
	// watches are the Watch subscriptions, by the record they watch.
	watches map[*entry]*watch
	// records is keyed by the 64-bit hash of (tenant, key) rather than by
	// the pair itself: smaller slots make the map cheaper to grow and to
	// scan, and the hash is computed once for the shard anyway. Records
	// whose pairs hash alike are chained through entry.next.
	records map[uint64]*entry
}

// entry is one stored record, laid out to cost one allocation and little
// garbage collection work: the fingerprint of the usual size (SHA-256)
// lives inside it, and the result's body and header share one buffer with
// no pointers in it.
type entry struct {
	tenant, key string
	next        *entry // another record whose (tenant, key) hashes alike

	fingerprint []byte // fp[:n], or a copy of its own when longer
	fp          [32]byte
	token       int64
	// The times are kept as offsets from the claim: a third of the room
	// of three more time.Time values, and no pointers to their location.
	// createdAt.Add gives back what the store's clock said, monotonic
	// reading included; should the wall clock step between the claim and
	// an extension, the wall time reported for the new end of the lease
	// follows the monotonic clock, which is what the comparisons use.
	createdAt   time.Time
	lockedUntil time.Duration
	expiresAt   time.Duration
	completedAt time.Duration // meaningful once complete

	// The result, once complete. data holds the header encoded by
	// appendHeader (when there is one), then the body; it is never
	// written after Complete, so what is read from it may share it.
	data      []byte
	status    int
	reference string
	mode      idem.StorageMode
	complete  bool
	hasHeader bool // the header was not nil (an empty one is kept as empty)
	// watched says shard.watches holds subscriptions to this record: a
	// flag in the entry's padding rather than a pointer, which would
	// make every entry a size class larger.
	watched bool

	// steps are the recovery points (idem.StepStore), in the encoding of
	// idem.MarshalSteps: a byte slice without pointers, appended to in
	// place, never shared with a caller.
	steps []byte
}

// own stores a copy of fingerprint, in the entry when it fits.
func (e *entry) own(fingerprint []byte) {
	switch {
	case len(fingerprint) == 0:
		e.fingerprint = nil
	case len(fingerprint) <= len(e.fp):
		e.fingerprint = e.fp[:copy(e.fp[:], fingerprint):len(fingerprint)]
	default:
		e.fingerprint = append([]byte(nil), fingerprint...)
	}
}

func (e *entry) inFlight() bool { return !e.complete }

// at returns the time offset d after the claim.
func (e *entry) at(d time.Duration) time.Time { return e.createdAt.Add(d) }

// since returns the offset of t from the claim.
func (e *entry) since(t time.Time) time.Duration { return t.Sub(e.createdAt) }

func (e *entry) sameFingerprint(fingerprint []byte) bool {
	return bytes.Equal(e.fingerprint, fingerprint)
}

var (
	_ idem.Store     = (*Store)(nil)
	_ idem.StepStore = (*Store)(nil)
)

// Info implements idem.Store: "memory", without transactions.
func (s *Store) Info() idem.StoreInfo { return idem.StoreInfo{Name: "memory"} }

// NewStore returns an empty store. A nil config means the defaults.
func NewStore(config *Config) *Store {
	s := &Store{now: time.Now, seed: maphash.MakeSeed()}
	if config != nil && config.NowFunc != nil {
		s.now = config.NowFunc
	}
	for i := range s.shards {
		s.shards[i].records = make(map[uint64]*entry)
	}
	return s
}

// locate returns the shard of (tenant, key) and the hash it is filed
// under there. Different pairs may hash alike (the separator does not
// make the input unambiguous, and 64 bits may collide): lookups compare
// the pair itself.
func (s *Store) locate(tenant, key string) (*shard, uint64) {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(tenant)
	h.WriteByte(0)
	h.WriteString(key)
	sum := h.Sum64()
	return &s.shards[sum%shardCount], sum
}

// find returns the entry of (tenant, key) filed under h, or nil.
func (sh *shard) find(h uint64, tenant, key string) *entry {
	return sh.records[h].find(tenant, key)
}

// find returns the entry of (tenant, key) in the chain that starts at e,
// or nil.
func (e *entry) find(tenant, key string) *entry {
	for ; e != nil; e = e.next {
		if e.tenant == tenant && e.key == key {
			return e
		}
	}
	return nil
}

// remove unfiles e, which is filed under h.
func (sh *shard) remove(h uint64, e *entry) {
	sh.changed(e)
	if head := unlink(sh.records[h], e); head != nil {
		sh.records[h] = head
	} else {
		delete(sh.records, h)
	}
}

// unlink removes e from the chain that starts at head and returns the
// chain's new head.
func unlink(head, e *entry) *entry {
	if head == e {
		next := e.next
		e.next = nil
		return next
	}
	for p := head; p != nil; p = p.next {
		if p.next == e {
			p.next = e.next
			e.next = nil
			break
		}
	}
	return head
}

// Claim implements idem.Store.
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idem.ClaimResult{}, err
	}
	sh, h := s.locate(p.Tenant, p.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	head := sh.records[h]
	old := head.find(p.Tenant, p.Key)
	takeover := false
	if old != nil && now.Before(old.at(old.expiresAt)) {
		takeover = old.inFlight() && !now.Before(old.at(old.lockedUntil)) && old.sameFingerprint(p.Fingerprint)
		if !takeover {
			return idem.ClaimResult{Record: old.record()}, nil
		}
	}
	e := &entry{
		tenant:      p.Tenant,
		key:         p.Key,
		token:       p.Token,
		createdAt:   now,
		lockedUntil: p.Lease,
		expiresAt:   p.Retention,
	}
	e.own(p.Fingerprint)
	res := idem.ClaimResult{Won: true, Takeover: takeover}
	if takeover && len(old.steps) > 0 {
		// The steps go on with the operation: the new execution gets
		// them, and so does any that takes over from it. The old entry
		// is dropped, so its buffer is handed over as it is.
		e.steps = old.steps
		steps, err := idem.UnmarshalSteps(e.steps)
		if err != nil {
			// Only SaveStep writes them, through AppendStep.
			panic("idemmem: recorded steps do not decode: " + err.Error())
		}
		res.Steps = steps
	}
	// Filed at the head of the chain, in place of the record taken over:
	// one map write, the map read above being enough.
	if old != nil {
		head = unlink(head, old)
		sh.changed(old)
	}
	e.next = head
	sh.records[h] = e
	return res, nil
}

// Begin implements idem.Store. The returned Tx only completes.
func (s *Store) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	return tx{s}, ctx.Err()
}

// Extend implements idem.Store.
func (s *Store) Extend(ctx context.Context, p idem.ExtendParams) error {
	return s.held(p.Tenant, p.Key, p.Token, func(sh *shard, h uint64, e *entry, now time.Time) {
		e.lockedUntil = e.since(now) + p.Lease
		if e.expiresAt < e.lockedUntil {
			e.expiresAt = e.lockedUntil
		}
	})
}

// Release implements idem.Store. A record that holds steps is kept, its
// lease ended, so that the next claim takes it over with them.
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	err := s.held(p.Tenant, p.Key, p.Token, func(sh *shard, h uint64, e *entry, now time.Time) {
		if len(e.steps) > 0 {
			e.lockedUntil = min(e.lockedUntil, e.since(now))
			sh.changed(e)
			return
		}
		sh.remove(h, e)
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
	return s.held(p.Tenant, p.Key, p.Token, func(sh *shard, h uint64, e *entry, now time.Time) {
		if hasStep(e.steps, p.Name) {
			return // the first value stays
		}
		e.steps = idem.AppendStep(e.steps, p.Name, p.Value)
	})
}

// hasStep reports whether the steps encoded in b include name.
func hasStep(b []byte, name string) bool {
	for len(b) > 0 {
		n, size := binary.Uvarint(b)
		b = b[size:]
		found := string(b[:n]) == name
		b = b[n:]
		n, size = binary.Uvarint(b)
		b = b[size+int(n):]
		if found {
			return true
		}
	}
	return false
}

// held runs fn under the shard lock when (tenant, key) is in flight under
// token, and returns idem.ErrLeaseLost otherwise.
func (s *Store) held(tenant, key string, token int64, fn func(sh *shard, h uint64, e *entry, now time.Time)) error {
	sh, h := s.locate(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.find(h, tenant, key)
	if e == nil || !e.inFlight() || e.token != token {
		return idem.ErrLeaseLost
	}
	fn(sh, h, e, s.now())
	return nil
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	sh, h := s.locate(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.find(h, tenant, key)
	if e == nil {
		return nil, idem.ErrNotFound
	}
	return e.record(), nil
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
	purge:
		for h, head := range sh.records {
			for e := head; e != nil; {
				if deleted >= limit {
					break purge
				}
				next := e.next
				if now.Before(e.at(e.expiresAt)) || (e.inFlight() && now.Before(e.at(e.lockedUntil))) {
					e = next
					continue
				}
				sh.remove(h, e)
				deleted++
				e = next
			}
		}
		sh.mu.Unlock()
	}
	return deleted, nil
}

// Len returns the number of records held, expired ones included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, head := range sh.records {
			for e := head; e != nil; e = e.next {
				n++
			}
		}
		sh.mu.Unlock()
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
	// Copied before taking the lock: the caller reuses its buffers.
	res := p.Result
	var data []byte
	if len(res.Body) > 0 || len(res.Header) > 0 {
		// The header is encoded first on the stack, in one pass over the
		// map, then copied with the body: one allocation of the exact
		// size.
		var scratch [512]byte
		header := appendHeader(scratch[:0], res.Header)
		data = make([]byte, len(header)+len(res.Body))
		copy(data[copy(data, header):], res.Body)
	}
	return t.s.held(p.Tenant, p.Key, p.Token, func(sh *shard, h uint64, e *entry, now time.Time) {
		sh.changed(e)
		e.complete = true
		e.completedAt = e.since(now)
		e.mode = res.Mode
		e.status = res.Status
		e.reference = res.Reference
		e.data = data
		e.hasHeader = res.Header != nil
	})
}

// record returns e as an idem.Record that shares nothing mutable with the
// store: callers may keep and change it.
func (e *entry) record() *idem.Record {
	rec := &idem.Record{
		Tenant:      e.tenant,
		Key:         e.key,
		State:       idem.StateInFlight,
		LeaseToken:  e.token,
		LockedUntil: e.at(e.lockedUntil),
		CreatedAt:   e.createdAt,
		ExpiresAt:   e.at(e.expiresAt),
	}
	if len(e.steps) > 0 {
		steps, err := idem.UnmarshalSteps(e.steps)
		if err != nil {
			panic("idemmem: recorded steps do not decode: " + err.Error())
		}
		rec.Steps = steps
	}
	header, body := e.split()
	// The fingerprint and the body share one copy, each capped so that an
	// append to one cannot run into the other.
	if n := len(e.fingerprint) + len(body); n > 0 {
		buf := make([]byte, 0, n)
		buf = append(buf, e.fingerprint...)
		buf = append(buf, body...)
		if len(e.fingerprint) > 0 {
			rec.Fingerprint = buf[:len(e.fingerprint):len(e.fingerprint)]
		}
		if len(body) > 0 {
			rec.Result.Body = buf[len(e.fingerprint):n:n]
		}
	}
	if !e.complete {
		return rec
	}
	rec.State = idem.StateComplete
	rec.CompletedAt = e.at(e.completedAt)
	rec.Result.Mode = e.mode
	rec.Result.Status = e.status
	rec.Result.Reference = e.reference
	if e.hasHeader {
		rec.Result.Header = readHeader(header)
	}
	return rec
}

// split returns the encoded header and the body held in e.data.
func (e *entry) split() (header, body []byte) {
	if !e.hasHeader {
		return nil, e.data
	}
	fields, b := uvarint(e.data)
	_, body = countValues(b, fields)
	return e.data[:len(e.data)-len(body)], body
}

// The header is stored as the count of its fields, then for each field
// its name and its values, each string prefixed by its length, every
// number a uvarint. A byte encoding rather than a copy of the map: one
// allocation (shared with the body) that holds no pointers, which the
// garbage collector never scans.

// appendHeader appends the encoding of h to b; nothing when h is nil.
func appendHeader(b []byte, h map[string][]string) []byte {
	if h == nil {
		return b
	}
	b = binary.AppendUvarint(b, uint64(len(h)))
	for k, v := range h {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(v)))
		for _, s := range v {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	return b
}

// readHeader decodes what appendHeader wrote, into a new map whose values
// share one backing array. The strings share the stored bytes, which are
// never written again: strings cannot change them either.
func readHeader(b []byte) map[string][]string {
	fields, b := uvarint(b)
	h := make(map[string][]string, fields)
	total, _ := countValues(b, fields)
	values := make([]string, 0, total)
	for range fields {
		var name string
		name, b = lenString(b)
		var n int
		n, b = uvarint(b)
		start := len(values)
		for range n {
			var v string
			v, b = lenString(b)
			values = append(values, v)
		}
		h[name] = values[start:len(values):len(values)]
	}
	return h
}

// countValues returns the number of values of the fields encoded at the
// start of b, and what follows them.
func countValues(b []byte, fields int) (int, []byte) {
	total := 0
	for range fields {
		n, rest := uvarint(b)
		b = rest[n:] // the name
		n, b = uvarint(b)
		total += n
		for range n {
			n, rest := uvarint(b)
			b = rest[n:]
		}
	}
	return total, b
}

func uvarint(b []byte) (int, []byte) {
	v, n := binary.Uvarint(b)
	return int(v), b[n:]
}

// lenString reads a length-prefixed string sharing b.
func lenString(b []byte) (string, []byte) {
	n, b := uvarint(b)
	if n == 0 {
		return "", b
	}
	return unsafe.String(&b[0], n), b[n:]
}
