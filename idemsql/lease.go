package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// Extend implements idem.Store.
//
// On SQLite, while the execution's own transaction holds the write lock,
// Extend writes nothing and returns nil: no other writer, and so no
// takeover, can run before that transaction ends, and the unit of work
// extends the lease in the very transaction that releases the lock if it
// ends without completing (see unit.finish). Writing would only wait for
// the lock the execution itself holds.
func (s *Store) Extend(ctx context.Context, p idem.ExtendParams) error {
	var res sql.Result
	skipped := false
	err := s.retry(ctx, func() (err error) {
		if s.writes != nil {
			if skipped, err = s.writes.acquireExtend(ctx, s.writeLimit(ctx), p); err != nil || skipped {
				return err
			}
			defer s.unlockWrites()
		}
		res, err = s.extendOn(ctx, s.db, p)
		return err
	})
	if skipped {
		return nil
	}
	if err != nil {
		return fmt.Errorf("idemsql: extend: %w", err)
	}
	err = fenced(res)
	if errors.Is(err, idem.ErrLeaseLost) && s.d.changedRows {
		return s.stillHeld(ctx, p.Tenant, p.Key, p.Token)
	}
	return err
}

// fenced turns the rows affected by a statement fenced by (tenant, key,
// token, in flight) into nil or idem.ErrLeaseLost.
func fenced(res sql.Result) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idemsql: rows affected: %w", err)
	}
	if n == 0 {
		return idem.ErrLeaseLost
	}
	return nil
}

// stillHeld settles an Extend that changed no row where rows affected
// count changed rows (MySQL): it may have matched a lease already ending
// at that instant (two extensions within one microsecond). It runs outside
// any transaction, so it reads the latest committed row.
func (s *Store) stillHeld(ctx context.Context, tenant, key string, token int64) error {
	var one int
	err := s.db.QueryRowContext(ctx, s.d.held.text, s.d.held.args(map[string]any{
		"tenant": tenant, "key": key, "token": token,
	})...).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return idem.ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("idemsql: extend: %w", err)
	}
	return nil
}

// extendOn runs the extension on db, a pool or a connection.
func (s *Store) extendOn(ctx context.Context, db execer, p idem.ExtendParams) (sql.Result, error) {
	return db.ExecContext(ctx, s.d.extend.text, s.d.extend.args(map[string]any{
		"tenant": p.Tenant, "key": p.Key, "token": p.Token, "lease": p.Lease.Microseconds(),
	})...)
}

// Release implements idem.Store. It is fenced on the token and the
// in-flight state, so a release that comes late (after a takeover, or
// after a completion whose commit the caller could not confirm) changes
// nothing. A record without recovery points is deleted, so that the retry
// runs afresh; one that holds some is kept in flight with its lease ended
// at once, so that the retry takes it over and gets them.
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	values := map[string]any{"tenant": p.Tenant, "key": p.Key, "token": p.Token}
	err := s.retry(ctx, func() error {
		if err := s.lockWrites(ctx); err != nil {
			return err
		}
		defer s.unlockWrites()
		return s.releaseOnce(ctx, p, values)
	})
	if err != nil {
		return fmt.Errorf("idemsql: release: %w", err)
	}
	s.changed(p.Tenant, p.Key)
	return nil
}

func (s *Store) releaseOnce(ctx context.Context, p idem.ReleaseParams, values map[string]any) error {
	if s.d.releaseKeep.text == "" {
		_, err := s.db.ExecContext(ctx, s.d.release.text, s.d.release.args(values)...)
		return err
	}
	res, err := s.db.ExecContext(ctx, s.d.release.text, s.d.release.args(values)...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n > 0 {
		return err
	}
	// Nothing deleted: the record holds steps (or is no longer ours, and
	// this matches nothing either).
	_, err = s.db.ExecContext(ctx, s.d.releaseKeep.text, s.d.releaseKeep.args(values)...)
	return err
}
