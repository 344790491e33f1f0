package idempg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkeys"
	"github.com/idem-go/idem/internal/keylist"
)

var _ idemkeys.Lister = (*Store)(nil)

// listColumns reads a listed record: recordColumns without the body.
const listColumns = `tenant_id, idem_key, fingerprint, state, lease_token, locked_until, storage_mode, status_code,
	response_headers, NULL::bytea, resource_ref, created_at, completed_at, expires_at`

// statusConditions are the statuses on a reading of the database clock,
// $1. The expired one is Purge's: past retention, no live lease.
var statusConditions = map[idemkeys.Status]string{
	idemkeys.InFlight:  `state = 'in_flight' AND locked_until > $1`,
	idemkeys.Abandoned: `state = 'in_flight' AND locked_until <= $1 AND expires_at > $1`,
	idemkeys.Complete:  `state = 'complete' AND expires_at > $1`,
	idemkeys.Expired:   `expires_at <= $1 AND (state = 'complete' OR locked_until <= $1)`,
}

func (s *Store) clock(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, err
}

func scanListed(row pgx.Row) (*idem.Record, error) {
	var tenant, key string
	var r scannedRecord
	if err := row.Scan(append([]any{&tenant, &key}, r.dest()...)...); err != nil {
		return nil, err
	}
	return r.record(tenant, key)
}

// ListKeys implements idemkeys.Lister. Every page is one statement that
// walks idem_keys_tenant_created_idx from the cursor (a row comparison,
// which PostgreSQL turns into the start of an index range) and stops
// after Limit+1 matching rows; with a tenant the walk is a range of that
// tenant's entries. The status, the prefix and the time range are
// checked on the rows it meets.
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
		return idemkeys.Page{}, interpretError(err)
	}
	limit := keylist.Limit(p)
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where := []string{"true"}
	if p.Tenant != "" {
		where = append(where, `tenant_id = `+arg(p.Tenant))
	}
	if p.Status != "" {
		where = append(where, strings.ReplaceAll(statusConditions[p.Status], "$1", arg(now)))
	}
	if p.Prefix != "" {
		// starts_with, not LIKE: a prefix holding % or _ would need
		// escaping.
		where = append(where, `starts_with(idem_key, `+arg(p.Prefix)+`)`)
	}
	if !p.CreatedFrom.IsZero() {
		where = append(where, `created_at >= `+arg(p.CreatedFrom))
	}
	if !p.CreatedBefore.IsZero() {
		where = append(where, `created_at < `+arg(p.CreatedBefore))
	}
	if hasCur {
		where = append(where, `(tenant_id, created_at, idem_key) > (`+arg(cur.Tenant)+`, `+arg(cur.Time())+`, `+arg(cur.Key)+`)`)
	}
	q := `SELECT ` + listColumns + ` FROM idem_keys WHERE ` + strings.Join(where, " AND ") +
		` ORDER BY tenant_id, created_at, idem_key LIMIT ` + arg(limit+1)
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return idemkeys.Page{}, interpretError(err)
	}
	defer rows.Close()
	var recs []*idem.Record
	for rows.Next() {
		rec, err := scanListed(rows)
		if err != nil {
			return idemkeys.Page{}, fmt.Errorf("idempg: list: %w", err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return idemkeys.Page{}, interpretError(err)
	}
	return keylist.Cut(recs, limit, now), nil
}

// exactStatsRows is the size of table, by the planner's estimate, up to
// which KeyStats of every tenant counts every record; past it, it counts a
// sample of about sampleRows.
// They are variables for the tests.
var (
	exactStatsRows float64 = 200_000
	sampleRows     float64 = 20_000
)

// KeyStats implements idemkeys.Lister.
//
// For one tenant the counts are exact: one statement reads the tenant's
// range of idem_keys_tenant_created_idx once and counts it by status and
// by hour. For every tenant, a table the planner estimates at up to
// exactStatsRows records is counted whole, in one pass; a larger one is
// counted from a sample of its pages (TABLESAMPLE SYSTEM, about sampleRows
// records) scaled up, and KeyStats.Estimated says so: exact counts of
// millions of records would need a pass over all of them, or an index on
// state, which would cost every completion its HOT update. The oldest
// record in flight is then the first in flight along
// idem_keys_expires_at_idx (the one whose retention ends first: the
// oldest claim when the routes share one retention), a walk bounded at
// maxOldestWalk entries.
func (s *Store) KeyStats(ctx context.Context, p idemkeys.StatsParams) (idemkeys.Stats, error) {
	var now time.Time
	var estimate float64
	if err := s.pool.QueryRow(ctx, `SELECT now(), (SELECT reltuples FROM pg_class WHERE oid = 'idem_keys'::regclass)`).Scan(&now, &estimate); err != nil {
		return idemkeys.Stats{}, interpretError(err)
	}
	c := keylist.NewCounter(now)
	if p.Tenant == "" && estimate > exactStatsRows {
		return s.sampledStats(ctx, c, now, estimate)
	}
	// The tenant's condition is written into the statement, not passed as
	// "$3 = '' OR tenant_id = $3": a cached generic plan would then scan
	// the whole table for one tenant.
	from, args := `idem_keys`, []any{now, keylist.HoursStart(now)}
	if p.Tenant != "" {
		from, args = `idem_keys WHERE tenant_id = $3`, append(args, p.Tenant)
	}
	count := func(status idemkeys.Status) string {
		return `count(*) FILTER (WHERE ` + statusConditions[status] + `)`
	}
	// One pass (the CTE is read once), three groupings: by tenant, by hour
	// of claim, by hour of completion.
	rows, err := s.pool.Query(ctx, `WITH r AS MATERIALIZED (
	SELECT tenant_id, state, locked_until, created_at, completed_at, expires_at FROM `+from+`)
SELECT 0, tenant_id, 0::bigint, `+count(idemkeys.InFlight)+`, `+count(idemkeys.Abandoned)+`, `+
		count(idemkeys.Complete)+`, `+count(idemkeys.Expired)+`, min(created_at) FILTER (WHERE state = 'in_flight')
FROM r GROUP BY tenant_id
UNION ALL
SELECT 1, '', floor(extract(epoch FROM created_at) / 3600)::bigint, count(*), 0, 0, 0, NULL
FROM r WHERE created_at >= $2 GROUP BY 3
UNION ALL
SELECT 2, '', floor(extract(epoch FROM completed_at) / 3600)::bigint, count(*), 0, 0, 0, NULL
FROM r WHERE completed_at >= $2 GROUP BY 3`, args...)
	if err != nil {
		return idemkeys.Stats{}, interpretError(err)
	}
	var oldestTenant string
	var oldestAt time.Time
	for rows.Next() {
		var kind int
		var tc idemkeys.TenantCounts
		var hour int64
		var n [4]int64
		var oldest *time.Time
		if err := rows.Scan(&kind, &tc.Tenant, &hour, &n[0], &n[1], &n[2], &n[3], &oldest); err != nil {
			rows.Close()
			return idemkeys.Stats{}, fmt.Errorf("idempg: stats: %w", err)
		}
		switch kind {
		case 0:
			tc.InFlight, tc.Abandoned, tc.Complete, tc.Expired = int(n[0]), int(n[1]), int(n[2]), int(n[3])
			c.AddTenant(tc)
			if oldest != nil && (oldestAt.IsZero() || oldest.Before(oldestAt)) {
				oldestTenant, oldestAt = tc.Tenant, *oldest
			}
		case 1:
			c.AddHour(time.Unix(hour*3600, 0), int(n[0]), 0)
		default:
			c.AddHour(time.Unix(hour*3600, 0), 0, int(n[0]))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return idemkeys.Stats{}, interpretError(err)
	}

	if !oldestAt.IsZero() {
		rec, err := scanListed(s.pool.QueryRow(ctx, `SELECT `+listColumns+` FROM idem_keys
WHERE tenant_id = $1 AND created_at = $2 AND state = 'in_flight' ORDER BY idem_key LIMIT 1`, oldestTenant, oldestAt))
		switch {
		case err == nil:
			c.SetOldest(rec)
		case !errors.Is(err, pgx.ErrNoRows): // completed in between: none to show
			return idemkeys.Stats{}, interpretError(err)
		}
	}
	return c.Stats(), nil
}

// maxOldestWalk bounds the walk that looks for the oldest record in
// flight in a sampled KeyStats.
const maxOldestWalk = 100_000

// sampledStats counts a sample of the table's pages in Go (measured
// faster, on a busy machine, than aggregating the sample in SQL three
// ways) and scales it up.
func (s *Store) sampledStats(ctx context.Context, c *keylist.Counter, now time.Time, estimate float64) (idemkeys.Stats, error) {
	pct := min(100, 100*sampleRows/estimate)
	rows, err := s.pool.Query(ctx, `SELECT tenant_id, state, locked_until, created_at, completed_at, expires_at
FROM idem_keys TABLESAMPLE SYSTEM (`+strconv.FormatFloat(pct, 'f', 4, 64)+`)`)
	if err != nil {
		return idemkeys.Stats{}, interpretError(err)
	}
	for rows.Next() {
		var rec idem.Record
		var state string
		var completed *time.Time
		if err := rows.Scan(&rec.Tenant, &state, &rec.LockedUntil, &rec.CreatedAt, &completed, &rec.ExpiresAt); err != nil {
			rows.Close()
			return idemkeys.Stats{}, fmt.Errorf("idempg: stats: %w", err)
		}
		rec.State = idem.State(state)
		if completed != nil {
			rec.CompletedAt = *completed
		}
		c.Add(&rec)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return idemkeys.Stats{}, interpretError(err)
	}
	// The oldest in flight of the sample is not the oldest of the table.
	c.SetOldest(nil)
	rec, err := scanListed(s.pool.QueryRow(ctx, `SELECT `+listColumns+` FROM (
	SELECT * FROM idem_keys WHERE expires_at > $1 ORDER BY expires_at LIMIT `+strconv.Itoa(maxOldestWalk)+`
) t WHERE state = 'in_flight' ORDER BY expires_at LIMIT 1`, now))
	switch {
	case err == nil:
		c.SetOldest(rec)
	case !errors.Is(err, pgx.ErrNoRows):
		return idemkeys.Stats{}, interpretError(err)
	}
	st := c.Stats()
	st.Estimated = true
	scale := 100 / pct
	for i := range st.Tenants {
		t := &st.Tenants[i]
		t.InFlight, t.Abandoned, t.Complete, t.Expired = scaled(t.InFlight, scale), scaled(t.Abandoned, scale), scaled(t.Complete, scale), scaled(t.Expired, scale)
	}
	for i := range st.Hours {
		h := &st.Hours[i]
		h.Claims, h.Completions = scaled(h.Claims, scale), scaled(h.Completions, scale)
	}
	return st, nil
}

func scaled(n int, by float64) int { return int(float64(n)*by + 0.5) }

// Forget implements idemkeys.Lister: one DELETE, fenced by the token and
// the complete state.
func (s *Store) Forget(ctx context.Context, p idemkeys.ForgetParams) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM idem_keys
WHERE tenant_id = $1 AND idem_key = $2 AND lease_token = $3 AND state = 'complete'`, p.Tenant, p.Key, p.Token)
	if err != nil {
		return interpretError(err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrNotFound
	}
	return nil
}
