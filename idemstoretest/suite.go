package idemstoretest

import (
	"context"
	"testing"
)

// suite carries what Exercise was given to every area.
type suite struct {
	ctx        context.Context
	newFixture func(t *testing.T) *Fixture
	caps       Capabilities
}

// parallel runs one case as a parallel subtest with a fixture and a tenant
// of its own.
func (s *suite) parallel(t *testing.T, name string, fn func(h *harness)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		t.Parallel()
		fn(s.setup(t))
	})
}

// serial runs one case as a subtest that no other case of its area runs
// beside.
func (s *suite) serial(t *testing.T, name string, fn func(h *harness)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		fn(s.setup(t))
	})
}

func (s *suite) setup(t *testing.T) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, caseTimeout)
	t.Cleanup(cancel)
	fx := s.newFixture(t)
	if fx == nil || fx.Store == nil {
		t.Fatal("idemstoretest: newFixture returned no Store")
	}
	if s.caps.Transactional && (fx.BusinessWrite == nil || fx.BusinessCount == nil) {
		t.Fatal("idemstoretest: a Transactional store's Fixture needs BusinessWrite and BusinessCount")
	}
	return &harness{t: t, ctx: ctx, fx: fx, caps: s.caps, tenant: newName("tenant")}
}
