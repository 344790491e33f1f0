// Package keylist holds what the stores share to implement idemkeys.Lister:
// the cursor of a page, the bounds of a limit, the filter as a predicate
// for the stores that filter in Go (idemmem, idemredis), and the
// arrangement of the counts.
package keylist

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkeys"
)

// DefaultLimit and MaxLimit bound idemkeys.ListParams.Limit.
const (
	DefaultLimit = 50
	MaxLimit     = 1000
)

// Limit returns the page size p asks for, within the bounds.
func Limit(p idemkeys.ListParams) int {
	switch {
	case p.Limit <= 0:
		return DefaultLimit
	case p.Limit > MaxLimit:
		return MaxLimit
	}
	return p.Limit
}

// ErrCursor is returned, wrapped, for a cursor no store wrote.
var ErrCursor = errors.New("idem: bad list cursor")

// Cursor is the position after which a page starts: the last record of
// the page before, in (tenant, created, key) order. Created is in Unix
// nanoseconds, so that every store's precision survives the trip.
type Cursor struct {
	Tenant  string
	Created int64
	Key     string
}

// Of returns the cursor just after rec.
func Of(rec *idem.Record) Cursor {
	return Cursor{Tenant: rec.Tenant, Created: rec.CreatedAt.UnixNano(), Key: rec.Key}
}

// Encode returns c as the opaque text of idemkeys.Page.Next.
func (c Cursor) Encode() string {
	b, _ := json.Marshal([]any{c.Tenant, c.Created, c.Key})
	return base64.RawURLEncoding.EncodeToString(b)
}

// Time returns Created as a time.
func (c Cursor) Time() time.Time { return time.Unix(0, c.Created).UTC() }

// Decode reads what Encode wrote; ok is false for the empty cursor.
func Decode(s string) (c Cursor, ok bool, err error) {
	if s == "" {
		return Cursor{}, false, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Cursor{}, false, fmt.Errorf("%w: %v", ErrCursor, err)
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil || len(parts) != 3 {
		return Cursor{}, false, ErrCursor
	}
	if json.Unmarshal(parts[0], &c.Tenant) != nil || json.Unmarshal(parts[1], &c.Created) != nil || json.Unmarshal(parts[2], &c.Key) != nil {
		return Cursor{}, false, ErrCursor
	}
	return c, true, nil
}

// CheckStatus refuses a status that is none of idem's.
func CheckStatus(s idemkeys.Status) error {
	switch s {
	case "", idemkeys.InFlight, idemkeys.Abandoned, idemkeys.Complete, idemkeys.Expired:
		return nil
	}
	return fmt.Errorf("idem: unknown key status %q (want in_flight, abandoned, complete or expired)", string(s))
}

// Less orders records as pages list them.
func Less(a, b *idem.Record) bool {
	if a.Tenant != b.Tenant {
		return a.Tenant < b.Tenant
	}
	if !a.CreatedAt.Equal(b.CreatedAt) {
		return a.CreatedAt.Before(b.CreatedAt)
	}
	return a.Key < b.Key
}

// After reports whether rec comes after c in page order.
func (c Cursor) After(rec *idem.Record) bool {
	if rec.Tenant != c.Tenant {
		return rec.Tenant > c.Tenant
	}
	if n := rec.CreatedAt.UnixNano(); n != c.Created {
		return n > c.Created
	}
	return rec.Key > c.Key
}

// Match reports whether rec passes the filters of p at now (the cursor
// aside).
func Match(rec *idem.Record, p idemkeys.ListParams, now time.Time) bool {
	if p.Tenant != "" && rec.Tenant != p.Tenant {
		return false
	}
	if p.Status != "" && idemkeys.StatusOf(rec, now) != p.Status {
		return false
	}
	if !strings.HasPrefix(rec.Key, p.Prefix) {
		return false
	}
	if !p.CreatedFrom.IsZero() && rec.CreatedAt.Before(p.CreatedFrom) {
		return false
	}
	if !p.CreatedBefore.IsZero() && !rec.CreatedAt.Before(p.CreatedBefore) {
		return false
	}
	return true
}

// Page sorts the matching records and cuts the page that follows p.After:
// for the stores that filter in Go.
func Page(all []*idem.Record, p idemkeys.ListParams, now time.Time) (idemkeys.Page, error) {
	cur, hasCur, err := Decode(p.After)
	if err != nil {
		return idemkeys.Page{}, err
	}
	if err := CheckStatus(p.Status); err != nil {
		return idemkeys.Page{}, err
	}
	var out []*idem.Record
	for _, rec := range all {
		if Match(rec, p, now) && (!hasCur || cur.After(rec)) {
			out = append(out, rec)
		}
	}
	sort.Slice(out, func(i, j int) bool { return Less(out[i], out[j]) })
	return Cut(out, Limit(p), now), nil
}

// Cut makes a page of records read in page order, of which there may be
// one more than limit: that one says a next page exists.
func Cut(recs []*idem.Record, limit int, now time.Time) idemkeys.Page {
	page := idemkeys.Page{Now: now}
	if len(recs) > limit {
		recs = recs[:limit]
		page.Next = Of(recs[limit-1]).Encode()
	}
	page.Records = recs
	return page
}

// Counter builds an idemkeys.Stats from records one at a time.
type Counter struct {
	now     time.Time
	first   time.Time // the start of the first hour
	tenants map[string]*idemkeys.TenantCounts
	oldest  *idem.Record
	hours   []idemkeys.HourCounts
}

// NewCounter returns a Counter at now, a reading of the store's clock.
func NewCounter(now time.Time) *Counter {
	c := &Counter{now: now, tenants: map[string]*idemkeys.TenantCounts{}}
	c.first = HoursStart(now)
	c.hours = make([]idemkeys.HourCounts, 24)
	for i := range c.hours {
		c.hours[i].Start = c.first.Add(time.Duration(i) * time.Hour)
	}
	return c
}

// HoursStart is the start of the first of the 24 hours that end with the
// hour holding now.
func HoursStart(now time.Time) time.Time {
	return now.UTC().Truncate(time.Hour).Add(-23 * time.Hour)
}

// HourIndex returns the hour t falls in, or -1.
func HourIndex(first, t time.Time) int {
	if t.IsZero() || t.Before(first) {
		return -1
	}
	i := int(t.Sub(first) / time.Hour)
	if i >= 24 {
		return -1
	}
	return i
}

// Add counts rec.
func (c *Counter) Add(rec *idem.Record) {
	tc := c.tenants[rec.Tenant]
	if tc == nil {
		tc = &idemkeys.TenantCounts{Tenant: rec.Tenant}
		c.tenants[rec.Tenant] = tc
	}
	switch idemkeys.StatusOf(rec, c.now) {
	case idemkeys.InFlight:
		tc.InFlight++
	case idemkeys.Abandoned:
		tc.Abandoned++
	case idemkeys.Complete:
		tc.Complete++
	default:
		tc.Expired++
	}
	if rec.State == idem.StateInFlight && (c.oldest == nil || rec.CreatedAt.Before(c.oldest.CreatedAt)) {
		c.oldest = rec
	}
	if i := HourIndex(c.first, rec.CreatedAt); i >= 0 {
		c.hours[i].Claims++
	}
	if rec.State == idem.StateComplete {
		if i := HourIndex(c.first, rec.CompletedAt); i >= 0 {
			c.hours[i].Completions++
		}
	}
}

// AddHour adds counts read elsewhere (SQL) to the hour t falls in.
func (c *Counter) AddHour(t time.Time, claims, completions int) {
	if i := HourIndex(c.first, t); i >= 0 {
		c.hours[i].Claims += claims
		c.hours[i].Completions += completions
	}
}

// AddTenant adds counts read elsewhere (SQL).
func (c *Counter) AddTenant(tc idemkeys.TenantCounts) {
	old := c.tenants[tc.Tenant]
	if old == nil {
		c.tenants[tc.Tenant] = &tc
		return
	}
	old.InFlight += tc.InFlight
	old.Abandoned += tc.Abandoned
	old.Complete += tc.Complete
	old.Expired += tc.Expired
}

// SetOldest sets the oldest in-flight record, found elsewhere (SQL).
func (c *Counter) SetOldest(rec *idem.Record) { c.oldest = rec }

// Stats returns what was counted, the largest tenant first.
func (c *Counter) Stats() idemkeys.Stats {
	st := idemkeys.Stats{Now: c.now, OldestInFlight: c.oldest, Hours: c.hours}
	for _, tc := range c.tenants {
		st.Tenants = append(st.Tenants, *tc)
	}
	sort.Slice(st.Tenants, func(i, j int) bool {
		a, b := st.Tenants[i], st.Tenants[j]
		if a.Total() != b.Total() {
			return a.Total() > b.Total()
		}
		return a.Tenant < b.Tenant
	})
	return st
}

// Strip drops what a listed record does not carry: the body and steps.
func Strip(rec *idem.Record) *idem.Record {
	rec.Result.Body = nil
	rec.Steps = nil
	return rec
}
