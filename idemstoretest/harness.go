package idemstoretest

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
)

// harness is one case: its fixture, its context and its tenant, with the
// steps every case repeats. Its methods fail the case on any unexpected
// store error: a store error is never something to step over.
type harness struct {
	t      *testing.T
	ctx    context.Context
	fx     *Fixture
	caps   Capabilities
	tenant string
}

// withTenant returns the same case working under another tenant.
func (h *harness) withTenant(tenant string) *harness {
	c := *h
	c.tenant = tenant
	return &c
}

// requireTransactional skips the case for stores whose Tx does not carry
// business writes.
func (h *harness) requireTransactional() {
	h.t.Helper()
	if !h.caps.Transactional {
		h.t.Skip("skipping: the store is not Transactional (business writes do not commit with Tx.Complete)")
	}
}

// requireConcurrentWriters skips the case for databases that run one
// write transaction at a time: it writes beside an open unit of work.
func (h *harness) requireConcurrentWriters() {
	h.t.Helper()
	if h.caps.SingleWriter {
		h.t.Skip("skipping: the store is SingleWriter (another write waits while a unit of work is open)")
	}
}

// requirePeer returns Fixture.Peer, or skips a case that needs a second
// process.
func (h *harness) requirePeer() idem.Store {
	h.t.Helper()
	if h.fx.Peer == nil {
		h.t.Skip("skipping: the fixture has no Peer (a second Store over the same database)")
	}
	return h.fx.Peer
}

// peerOrStore returns the Peer when there is one: a takeover is most
// telling from another process, and still meaningful from the same one.
func (h *harness) peerOrStore() idem.Store {
	if h.fx.Peer != nil {
		return h.fx.Peer
	}
	return h.fx.Store
}

// stores returns the handles on the database: Store, and Peer if any.
func (h *harness) stores() []idem.Store {
	if h.fx.Peer != nil {
		return []idem.Store{h.fx.Store, h.fx.Peer}
	}
	return []idem.Store{h.fx.Store}
}

// params returns the claim of key by a new execution: a fresh token, a
// lease and a retention that do not end during the case.
func (h *harness) params(key string, fingerprint []byte) idem.ClaimParams {
	return idem.ClaimParams{
		Tenant:      h.tenant,
		Key:         key,
		Fingerprint: fingerprint,
		Token:       newToken(),
		Lease:       longLease,
		Retention:   longRetention,
	}
}

func (h *harness) claim(st idem.Store, p idem.ClaimParams) idem.ClaimResult {
	h.t.Helper()
	res, err := st.Claim(h.ctx, p)
	if err != nil {
		h.t.Fatalf("Claim(%q, %q): %v", p.Tenant, p.Key, err)
	}
	return res
}

// mustWin claims and fails the case unless the claim is won.
func (h *harness) mustWin(st idem.Store, p idem.ClaimParams) {
	h.t.Helper()
	res := h.claim(st, p)
	if !res.Won {
		h.t.Fatalf("Claim(%q, %q) lost, want won; record: %s", p.Tenant, p.Key, describe(res.Record))
	}
	if res.Record != nil {
		h.t.Errorf("Claim(%q, %q) won and returned a record, want nil", p.Tenant, p.Key)
	}
}

// mustLose claims and fails the case unless the claim is lost with a
// record, which it returns.
func (h *harness) mustLose(st idem.Store, p idem.ClaimParams) *idem.Record {
	h.t.Helper()
	res := h.claim(st, p)
	if res.Won {
		h.t.Fatalf("Claim(%q, %q) won, want lost", p.Tenant, p.Key)
	}
	if res.Record == nil {
		h.t.Fatalf("Claim(%q, %q) lost without returning the record", p.Tenant, p.Key)
	}
	if res.Record.Tenant != p.Tenant || res.Record.Key != p.Key {
		h.t.Errorf("lost claim of (%q, %q) returned the record of (%q, %q)", p.Tenant, p.Key, res.Record.Tenant, res.Record.Key)
	}
	return res.Record
}

// complete completes key under token with res in a unit of work of its
// own, and returns Complete's error.
func (h *harness) complete(st idem.Store, key string, token int64, res idem.Result) error {
	h.t.Helper()
	tx := h.begin(st)
	defer tx.Rollback(h.ctx) //nolint:errcheck // harmless after Complete
	return tx.Complete(h.ctx, idem.CompleteParams{Tenant: h.tenant, Key: key, Token: token, Result: res})
}

func (h *harness) mustComplete(st idem.Store, key string, token int64, res idem.Result) {
	h.t.Helper()
	if err := h.complete(st, key, token, res); err != nil {
		h.t.Fatalf("Complete(%q, %q): %v", h.tenant, key, err)
	}
}

func (h *harness) begin(st idem.Store) idem.UnitOfWork {
	h.t.Helper()
	tx, err := st.Begin(h.ctx)
	if err != nil {
		h.t.Fatalf("Begin: %v", err)
	}
	return tx
}

// get reads the record of key, failing the case when there is none.
func (h *harness) get(st idem.Store, key string) *idem.Record {
	h.t.Helper()
	rec, err := st.Get(h.ctx, h.tenant, key)
	if err != nil {
		h.t.Fatalf("Get(%q, %q): %v", h.tenant, key, err)
	}
	if rec == nil {
		h.t.Fatalf("Get(%q, %q) returned neither a record nor an error", h.tenant, key)
	}
	if rec.Tenant != h.tenant || rec.Key != key {
		h.t.Errorf("Get(%q, %q) returned the record of (%q, %q)", h.tenant, key, rec.Tenant, rec.Key)
	}
	return rec
}

// mustBeAbsent fails the case unless key has no record.
func (h *harness) mustBeAbsent(st idem.Store, key string) {
	h.t.Helper()
	rec, err := st.Get(h.ctx, h.tenant, key)
	if !errors.Is(err, idem.ErrNotFound) {
		h.t.Fatalf("Get(%q, %q) = %s, %v; want idem.ErrNotFound", h.tenant, key, describe(rec), err)
	}
}

// getExpired reads the record of key past its retention: a SelfExpiring
// store may have deleted it already, and then it returns nil. Any other
// store still has it, since only a purge deletes.
func (h *harness) getExpired(st idem.Store, key string) *idem.Record {
	h.t.Helper()
	if h.caps.SelfExpiring {
		rec, err := st.Get(h.ctx, h.tenant, key)
		if errors.Is(err, idem.ErrNotFound) {
			return nil
		}
		if err != nil {
			h.t.Fatalf("Get(%q, %q): %v", h.tenant, key, err)
		}
		return rec
	}
	return h.get(st, key)
}

// mustBeInFlight fails the case unless key is in flight under token, and
// returns its record.
func (h *harness) mustBeInFlight(st idem.Store, key string, token int64) *idem.Record {
	h.t.Helper()
	rec := h.get(st, key)
	if rec.State != idem.StateInFlight || rec.LeaseToken != token {
		h.t.Fatalf("record of %q is %s, want in flight under token %d", key, describe(rec), token)
	}
	return rec
}

// mustBeComplete fails the case unless key is complete with want, and
// returns its record.
func (h *harness) mustBeComplete(st idem.Store, key string, want idem.Result) *idem.Record {
	h.t.Helper()
	rec := h.get(st, key)
	if rec.State != idem.StateComplete {
		h.t.Fatalf("record of %q is %s, want complete", key, describe(rec))
	}
	checkResult(h.t, "stored result of "+key, rec.Result, want)
	return rec
}

// businessWrite inserts the business row id through tx.
func (h *harness) businessWrite(tx idem.UnitOfWork, id string) {
	h.t.Helper()
	if err := h.fx.BusinessWrite(tx.Context(h.ctx), id); err != nil {
		h.t.Fatalf("BusinessWrite(%q): %v", id, err)
	}
}

// businessCount counts the committed business rows id.
func (h *harness) businessCount(id string) int {
	h.t.Helper()
	n, err := h.fx.BusinessCount(h.ctx, id)
	if err != nil {
		h.t.Fatalf("BusinessCount(%q): %v", id, err)
	}
	return n
}

// mustCount fails the case unless there are want committed rows id.
func (h *harness) mustCount(id string, want int, why string) {
	h.t.Helper()
	if got := h.businessCount(id); got != want {
		h.t.Errorf("%d committed business rows %q, want %d: %s", got, id, want, why)
	}
}
