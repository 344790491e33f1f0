package idemsql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idem-go/idem"
)

// defaultPurgeLimit is the batch of Purge when PurgeParams.Limit is zero.
const defaultPurgeLimit = 1000

// Purge implements idem.Store: one DELETE of at most Limit rows found
// through the expires_at index, sparing in-flight records whose lease is
// live.
func (s *Store) Purge(ctx context.Context, p idem.PurgeParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultPurgeLimit
	}
	var n int
	err := s.retry(ctx, func() (err error) {
		if err := s.lockWrites(ctx); err != nil {
			return fmt.Errorf("idemsql: purge: %w", err)
		}
		defer s.unlockWrites()
		n, err = s.purgeOnce(ctx, int64(limit))
		return err
	})
	return n, err
}

func (s *Store) purgeOnce(ctx context.Context, limit int64) (int, error) {
	if !s.d.purgeInTx {
		res, err := s.db.ExecContext(ctx, s.d.purge.text, s.d.purge.args(map[string]any{"limit": limit})...)
		return purged(res, err)
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: s.d.purgeIsolation})
	if err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // harmless after Commit
	var n int
	if s.d.purgePick.text != "" {
		n, err = s.purgePicked(ctx, tx, limit)
	} else {
		n, err = purged(tx.ExecContext(ctx, s.d.purge.text, s.d.purge.args(map[string]any{"limit": limit})...))
	}
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	return n, nil
}

// purgePicked runs purgePick in tx, then purge for each picked row, and
// returns how many it deleted.
func (s *Store) purgePicked(ctx context.Context, tx *sql.Tx, limit int64) (int, error) {
	rows, err := tx.QueryContext(ctx, s.d.purgePick.text, s.d.purgePick.args(map[string]any{"limit": limit})...)
	if err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	type pk struct{ tenant, key []byte }
	var picked []pk
	for rows.Next() {
		var p pk
		if err := rows.Scan(&p.tenant, &p.key); err != nil {
			rows.Close()
			return 0, fmt.Errorf("idemsql: purge: %w", err)
		}
		picked = append(picked, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	if len(picked) == 0 {
		return 0, nil
	}
	del, err := tx.PrepareContext(ctx, s.d.purge.text)
	if err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	defer del.Close()
	total := 0
	for _, p := range picked {
		n, err := purged(del.ExecContext(ctx, s.d.purge.args(map[string]any{"tenant": p.tenant, "key": p.key})...))
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

func purged(res sql.Result, err error) (int, error) {
	if err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	return int(n), nil
}
