package idemstoretest

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
)

// Fixture is what a store gives the suite for one test case. newFixture is
// called once per case, so a store may hand out a fresh schema each time
// or share one database: every case works under tenants of its own.
type Fixture struct {
	// Store is the store under test.
	Store idem.Store
	// Peer is a second Store over the same database, as a second process
	// would hold (nil skips the cross-process cases with a logged reason).
	Peer idem.Store
	// BusinessWrite inserts one business row tagged id through the
	// transaction carried by ctx (the ctx given by Tx.Context).
	// Transactional stores only.
	BusinessWrite func(ctx context.Context, id string) error
	// BusinessCount counts committed business rows tagged id.
	BusinessCount func(ctx context.Context, id string) (int, error)
}

// Capabilities says what a store can do; the cases that need something
// the store lacks are skipped with a logged reason.
type Capabilities struct {
	// Transactional: business writes made through Tx.Context commit and
	// roll back with Tx.Complete.
	Transactional bool
	// SingleWriter: the database runs one write transaction at a time
	// (SQLite), and a unit of work holds the write lock from Begin. The
	// cases in which another execution writes while a unit of work is
	// open (a takeover under a running handler, two completions at once)
	// are skipped: there the other write waits for the lock instead.
	SingleWriter bool
	// SelfExpiring: the database deletes records past their retention by
	// itself (Redis key TTLs), so Purge has nothing to delete and Get of
	// an expired record may find nothing. The cases then check that
	// expired records are gone and live ones kept, instead of counting
	// what Purge deleted.
	SelfExpiring bool
	// NoSteps: the store keeps no recovery points (it does not implement
	// idem.StepStore), so idem.Step fails on it. Every store of this
	// module keeps them: without NoSteps, the suite fails a store that
	// does not implement idem.StepStore instead of skipping its Steps
	// area, so that none loses them unnoticed.
	NoSteps bool
	// SingleTransaction: the store claims inside the unit of work
	// (idem.StoreInfo.SingleTransaction, idem.UnitClaimer), so the engine
	// runs no heartbeat and refuses recovery points, and an execution in
	// flight is invisible until it commits. The engine cases that need a
	// visible in-flight record or a takeover under a running handler are
	// skipped; the Steps area checks that idem.Step is refused; the
	// direct Claim cases run as on any store.
	SingleTransaction bool
}

// Exercise runs the whole conformance suite against the stores that
// newFixture returns, each area of the contract as a subtest. It returns
// once every case has finished, so the caller may close what it opened
// right after it.
//
// Purge deletes the expired records of every tenant: nothing else may
// purge the database the fixtures use while Exercise runs.
func Exercise(ctx context.Context, t *testing.T, newFixture func(t *testing.T) *Fixture, caps Capabilities) {
	t.Helper()
	s := &suite{ctx: ctx, newFixture: newFixture, caps: caps}
	// The areas run one after the other (t.Run returns when an area's
	// parallel cases are done): a purge in one area must never meet the
	// expired-but-not-purged records another area is looking at.
	t.Run("Info", s.info)
	t.Run("Claim", s.claim)
	t.Run("Fencing", s.fencing)
	t.Run("Lease", s.lease)
	t.Run("Retention", s.retention)
	t.Run("Purge", s.purge)
	t.Run("Tenants", s.tenants)
	t.Run("Bodies", s.bodies)
	t.Run("Transactions", s.transactions)
	t.Run("Engine", s.engine)
	t.Run("Steps", s.steps)
	t.Run("Wait", s.wait)
	t.Run("StoreErrors", s.storeErrors)
	t.Run("Listing", s.listing)
}

// info checks that the store describes itself as the suite was told it
// behaves: the engine trusts StoreInfo.Transactional to decide whether a
// handler's work can be undone.
func (s *suite) info(t *testing.T) {
	fx := s.newFixture(t)
	info := fx.Store.Info()
	if info.Name == "" {
		t.Error("Store.Info().Name is empty")
	}
	if info.Transactional != s.caps.Transactional {
		t.Errorf("Store.Info().Transactional = %v, but the suite runs with Capabilities.Transactional = %v", info.Transactional, s.caps.Transactional)
	}
	// The engine finds out by a type assertion whether idem.Step can
	// record; the suite is told, so that a store losing the method fails
	// here instead of skipping its Steps area.
	_, keeps := fx.Store.(idem.StepStore)
	switch {
	case !keeps && !s.caps.NoSteps:
		t.Errorf("%T does not implement idem.StepStore (recovery points); implement it, or run the suite with Capabilities.NoSteps", fx.Store)
	case keeps && s.caps.NoSteps:
		t.Errorf("%T implements idem.StepStore, but the suite runs with Capabilities.NoSteps: its Steps area would be skipped", fx.Store)
	}
}
