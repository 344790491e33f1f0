package idemsql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkeys"
	"github.com/idem-go/idem/internal/keylist"
)

var _ idemkeys.Lister = (*Store)(nil)

// listColumns is recordColumns without the body and the steps, which a
// listed record does not carry: a page reads no large column.
const listColumns = `tenant_id, idem_key, fingerprint, state, lease_token, locked_until,
    storage_mode, status_code, response_headers, NULL, resource_ref,
    created_at, completed_at, expires_at, NULL`

// The statuses as conditions on a reading of the store's clock, @now.
// The expired one is Purge's: past retention, no live lease.
var statusConditions = map[idemkeys.Status]string{
	idemkeys.InFlight:  `state = 'in_flight' AND locked_until > @now`,
	idemkeys.Abandoned: `state = 'in_flight' AND locked_until <= @now AND expires_at > @now`,
	idemkeys.Complete:  `state = 'complete' AND expires_at > @now`,
	idemkeys.Expired:   `expires_at <= @now AND (state = 'complete' OR locked_until <= @now)`,
}

// style is how the dialect spells parameters.
func (d *dialect) style() placeholderStyle { return d.placeholders }

// clock reads the database's clock: the one every stored time is written
// by.
func (s *Store) clock(ctx context.Context) (time.Time, error) {
	t := dbTime{utcWall: s.d.utcWall}
	if err := s.db.QueryRowContext(ctx, s.d.clockSQL).Scan(&t); err != nil {
		return time.Time{}, err
	}
	return t.t, nil
}

// timeArg is t as the dialect stores times: integer Unix microseconds
// (SQLite), a DATETIME(6) text in UTC (MySQL), a timestamptz (PostgreSQL).
func (d *dialect) timeArg(t time.Time) any { return d.timeValue(t) }

// hourOf is the hours since the Unix epoch of a time column, without a
// time zone in the way.
func (d *dialect) hourOf(col string) string { return d.hourSQL(col) }

// ListKeys implements idemkeys.Lister. Every page is one statement that
// walks idem_keys_tenant_created_idx from the cursor and stops after
// Limit+1 matching rows; with a tenant the walk is a range of that
// tenant's entries. The status, the prefix and the time range are checked
// on the rows it meets.
func (s *Store) ListKeys(ctx context.Context, p idemkeys.ListParams) (idemkeys.Page, error) {
	if err := keylist.CheckStatus(p.Status); err != nil {
		return idemkeys.Page{}, err
	}
	cur, hasCur, err := keylist.Decode(p.After)
	if err != nil {
		return idemkeys.Page{}, err
	}
	now, err := s.clock(ctx)
	if err != nil {
		return idemkeys.Page{}, fmt.Errorf("idemsql: list: %w", err)
	}
	limit := keylist.Limit(p)
	args := map[string]any{"now": s.d.timeArg(now), "limit": int64(limit + 1)}
	where := []string{"1 = 1"}
	if p.Tenant != "" {
		where = append(where, `tenant_id = @tenant`)
		args["tenant"] = p.Tenant
	}
	if p.Status != "" {
		where = append(where, statusConditions[p.Status])
	}
	if p.Prefix != "" {
		// substr, not LIKE: SQLite's LIKE ignores case, and a prefix
		// holding % or _ would need escaping.
		n := utf8.RuneCountInString(p.Prefix)
		if s.d.prefixBytes {
			n = len(p.Prefix)
		}
		where = append(where, `substr(idem_key, 1, @plen) = @prefix`)
		args["plen"], args["prefix"] = int64(n), p.Prefix
	}
	if !p.CreatedFrom.IsZero() {
		where = append(where, `created_at >= @from`)
		args["from"] = s.d.timeArg(p.CreatedFrom)
	}
	if !p.CreatedBefore.IsZero() {
		where = append(where, `created_at < @before`)
		args["before"] = s.d.timeArg(p.CreatedBefore)
	}
	if hasCur {
		where = append(where, s.d.cursorAfter)
		args["ct"], args["cc"], args["ck"] = cur.Tenant, s.d.timeArg(cur.Time()), cur.Key
	}
	q := compile(`SELECT `+listColumns+` FROM idem_keys WHERE `+strings.Join(where, " AND ")+`
ORDER BY tenant_id, created_at, idem_key LIMIT @limit`, s.d.style())
	rows, err := s.db.QueryContext(ctx, q.text, q.args(args)...)
	if err != nil {
		return idemkeys.Page{}, fmt.Errorf("idemsql: list: %w", err)
	}
	defer rows.Close()
	var recs []*idem.Record
	for rows.Next() {
		rec, _, err := scanRecord(s.d, rows)
		if err != nil {
			return idemkeys.Page{}, fmt.Errorf("idemsql: list: %w", err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return idemkeys.Page{}, fmt.Errorf("idemsql: list: %w", err)
	}
	return keylist.Cut(recs, limit, now), nil
}

// KeyStats implements idemkeys.Lister in three statements: the counts of
// each tenant (one pass over the table, or over the tenant's index range),
// the claims and completions by hour since 24 hours ago, and the oldest
// record in flight, read through idem_keys_tenant_created_idx.
func (s *Store) KeyStats(ctx context.Context, p idemkeys.StatsParams) (idemkeys.Stats, error) {
	now, err := s.clock(ctx)
	if err != nil {
		return idemkeys.Stats{}, fmt.Errorf("idemsql: stats: %w", err)
	}
	c := keylist.NewCounter(now)
	first := keylist.HoursStart(now)
	args := map[string]any{"now": s.d.timeArg(now), "first": s.d.timeArg(first), "tenant": p.Tenant}
	tenantIs := ``
	if p.Tenant != "" {
		tenantIs = ` AND tenant_id = @tenant`
	}
	sum := func(status idemkeys.Status) string {
		return `SUM(CASE WHEN ` + statusConditions[status] + ` THEN 1 ELSE 0 END)`
	}
	counts := compile(`SELECT tenant_id, `+sum(idemkeys.InFlight)+`, `+sum(idemkeys.Abandoned)+`, `+
		sum(idemkeys.Complete)+`, `+sum(idemkeys.Expired)+`,
    MIN(CASE WHEN state = 'in_flight' THEN created_at END)
FROM idem_keys WHERE 1 = 1`+tenantIs+` GROUP BY tenant_id`, s.d.style())
	var oldestTenant string
	var oldestAt time.Time
	err = s.each(ctx, counts, args, func(rows *sql.Rows) error {
		var tc idemkeys.TenantCounts
		var n [4]int64
		oldest := dbTime{utcWall: s.d.utcWall}
		if err := rows.Scan(&tc.Tenant, &n[0], &n[1], &n[2], &n[3], &oldest); err != nil {
			return err
		}
		tc.InFlight, tc.Abandoned, tc.Complete, tc.Expired = int(n[0]), int(n[1]), int(n[2]), int(n[3])
		c.AddTenant(tc)
		if !oldest.t.IsZero() && (oldestAt.IsZero() || oldest.t.Before(oldestAt)) {
			oldestTenant, oldestAt = tc.Tenant, oldest.t
		}
		return nil
	})
	if err != nil {
		return idemkeys.Stats{}, fmt.Errorf("idemsql: stats: %w", err)
	}

	hours := compile(`SELECT h, SUM(c), SUM(d) FROM (
    SELECT `+s.d.hourOf("created_at")+` AS h, 1 AS c, 0 AS d FROM idem_keys WHERE created_at >= @first`+tenantIs+`
    UNION ALL
    SELECT `+s.d.hourOf("completed_at")+`, 0, 1 FROM idem_keys WHERE completed_at >= @first`+tenantIs+`
) t GROUP BY h`, s.d.style())
	err = s.each(ctx, hours, args, func(rows *sql.Rows) error {
		var h, claims, completions int64
		if err := rows.Scan(&h, &claims, &completions); err != nil {
			return err
		}
		c.AddHour(time.Unix(h*3600, 0), int(claims), int(completions))
		return nil
	})
	if err != nil {
		return idemkeys.Stats{}, fmt.Errorf("idemsql: stats: %w", err)
	}

	if !oldestAt.IsZero() {
		q := compile(`SELECT `+listColumns+` FROM idem_keys
WHERE tenant_id = @tenant AND created_at = @at AND state = 'in_flight' ORDER BY idem_key LIMIT 1`, s.d.style())
		row := s.db.QueryRowContext(ctx, q.text, q.args(map[string]any{"tenant": oldestTenant, "at": s.d.timeArg(oldestAt)})...)
		rec, _, err := scanRecord(s.d, row)
		switch {
		case err == nil:
			c.SetOldest(rec)
		case err != sql.ErrNoRows: // completed in between: none to show
			return idemkeys.Stats{}, fmt.Errorf("idemsql: stats: %w", err)
		}
	}
	return c.Stats(), nil
}

// each runs q and calls fn for every row.
func (s *Store) each(ctx context.Context, q query, args map[string]any, fn func(*sql.Rows) error) error {
	rows, err := s.db.QueryContext(ctx, q.text, q.args(args)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Forget implements idemkeys.Lister: one DELETE, fenced by the token and
// the complete state.
func (s *Store) Forget(ctx context.Context, p idemkeys.ForgetParams) error {
	q := compile(`DELETE FROM idem_keys
WHERE tenant_id = @tenant AND idem_key = @key AND lease_token = @token AND state = 'complete'`, s.d.style())
	var n int64
	err := s.retry(ctx, func() error {
		if err := s.lockWrites(ctx); err != nil {
			return err
		}
		defer s.unlockWrites()
		res, err := s.db.ExecContext(ctx, q.text, q.args(map[string]any{"tenant": p.Tenant, "key": p.Key, "token": p.Token})...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsql: forget: %w", err)
	}
	if n == 0 {
		return idem.ErrNotFound
	}
	return nil
}
