package idemmem

import (
	"context"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkeys"
	"github.com/idem-go/idem/internal/keylist"
)

var _ idemkeys.Lister = (*Store)(nil)

// ListKeys implements idemkeys.Lister. The store has no index: every page
// walks every record, one shard lock at a time, which suits a store held
// in one process's memory.
func (s *Store) ListKeys(ctx context.Context, p idemkeys.ListParams) (idemkeys.Page, error) {
	now := s.now()
	var all []*idem.Record
	err := s.each(ctx, func(e *entry) {
		rec := keylist.Strip(e.record())
		if keylist.Match(rec, p, now) {
			all = append(all, rec)
		}
	})
	if err != nil {
		return idemkeys.Page{}, err
	}
	return keylist.Page(all, p, now)
}

// KeyStats implements idemkeys.Lister, walking every record.
func (s *Store) KeyStats(ctx context.Context, p idemkeys.StatsParams) (idemkeys.Stats, error) {
	c := keylist.NewCounter(s.now())
	err := s.each(ctx, func(e *entry) {
		if p.Tenant == "" || e.rec.Tenant == p.Tenant {
			c.Add(keylist.Strip(e.record()))
		}
	})
	return c.Stats(), err
}

// Forget implements idemkeys.Lister.
func (s *Store) Forget(ctx context.Context, p idemkeys.ForgetParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k := recordKey{p.Tenant, p.Key}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.records[k]
	if e == nil || e.inFlight() || e.rec.LeaseToken != p.Token {
		return idem.ErrNotFound
	}
	s.remove(k, e)
	return nil
}

// each calls fn for every record, under the store's lock.
func (s *Store) each(ctx context.Context, fn func(e *entry)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.records {
		fn(e)
	}
	return nil
}
