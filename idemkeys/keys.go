// Package idemkeys is what operators see of the stored keys: a store
// implements [Lister] besides idem.Store to let the console (idem console)
// and the idem keys commands list its records, count them, and forget a
// completed one.
//
//	lister, ok := store.(idemkeys.Lister)
//	page, err := lister.ListKeys(ctx, idemkeys.ListParams{Tenant: "acme", Status: idemkeys.InFlight})
//	for _, r := range page.Records {
//		fmt.Println(r.Key, idemkeys.StatusOf(r, page.Now))
//	}
//
// Every store of this repository implements it, and idemstoretest's
// listing suite proves an implementation. It is a package of its own
// because the engine never lists keys: only operators do.
package idemkeys

import (
	"context"
	"time"

	"github.com/idem-go/idem"
)

// Lister is what an idem.Store implements, besides Store, to let operators
// find their records: list them by tenant, status, key prefix and time,
// count them, and forget a completed one. Every store of this module
// implements it; the console (idem console) and the idem keys commands
// need it.
//
// An operator releases a key in flight with idem.Store.Release and the lease
// token read from the record (ListKeys or Get): a release by token frees
// exactly the execution the operator looked at, never the retry that took
// the key over since, and if that execution's holder is alive after all,
// its completion is refused by the fence and its writes are rolled back.
type Lister interface {
	// ListKeys returns one page of records in (tenant, created at, key)
	// order, after ListParams.After. The records carry no body and no
	// steps (Get reads them): a page stays small whatever it answers.
	ListKeys(ctx context.Context, p ListParams) (Page, error)

	// KeyStats counts the records by tenant and status, finds the oldest
	// in flight, and counts the claims and completions of the last 24
	// hours, hour by hour.
	KeyStats(ctx context.Context, p StatsParams) (Stats, error)

	// Forget deletes the complete record of (tenant, key) whose lease
	// token is Token, so that the next request under the key runs again.
	// It returns idem.ErrNotFound, deleting nothing, when there is no such
	// record: absent, in flight, or completed under another token.
	Forget(ctx context.Context, p ForgetParams) error
}

// Status is where a record stands for an operator: the stored state
// and, judged by the store's clock, its lease and its retention.
type Status string

const (
	// InFlight: an execution holds the key under a live lease.
	InFlight Status = "in_flight"
	// Abandoned: in flight, its lease ended, and no retry has taken it
	// over since: the execution crashed or was cut off, and no client
	// came back. The next retry with the same request runs again.
	Abandoned Status = "abandoned"
	// Complete: the result is stored and replayed.
	Complete Status = "complete"
	// Expired: past retention and holding no live lease: it counts as
	// absent and waits for Purge.
	Expired Status = "expired"
)

// StatusOf returns where r stands at now, a reading of the store's clock
// (Page.Now, Stats.Now).
func StatusOf(r *idem.Record, now time.Time) Status {
	live := r.State == idem.StateInFlight && now.Before(r.LockedUntil)
	switch {
	case live:
		return InFlight
	case !now.Before(r.ExpiresAt):
		return Expired
	case r.State == idem.StateInFlight:
		return Abandoned
	}
	return Complete
}

// ListParams are the arguments of Lister.ListKeys. Zero fields do not
// filter.
type ListParams struct {
	// Tenant lists one tenant's records only.
	Tenant string
	// Status lists the records in this status only.
	Status Status
	// Prefix lists the keys that start with it only.
	Prefix string
	// CreatedFrom and CreatedBefore bound the claim time: From included,
	// Before excluded.
	CreatedFrom, CreatedBefore time.Time
	// Limit bounds the page. Defaults to 50 when zero; at most 1000.
	Limit int
	// After is Page.Next of the page before; empty for the first.
	After string
}

// Page is one page of ListKeys.
type Page struct {
	// Records are the page, without body or steps.
	Records []*idem.Record
	// Next is the cursor of the next page (ListParams.After); empty when
	// this page is the last.
	Next string
	// Now is the store's clock when the page was read: StatusOf(record, Now)
	// is the status the page was filtered on.
	Now time.Time
}

// StatsParams are the arguments of Lister.KeyStats.
type StatsParams struct {
	// Tenant counts one tenant's records only; empty counts every tenant.
	Tenant string
}

// Stats is what Lister.KeyStats counts.
type Stats struct {
	// Now is the store's clock when the records were counted.
	Now time.Time
	// Tenants holds the counts of each tenant with records, the tenant
	// with the most first.
	Tenants []TenantCounts
	// OldestInFlight is the in-flight record (lease live or ended) claimed
	// first, without body or steps; nil when none is in flight.
	OldestInFlight *idem.Record
	// Estimated is true when the counts (Tenants, Hours) are scaled from
	// a sample of the records rather than counted one by one: idempg
	// samples a table of millions, where exact counts of every tenant
	// would read every record.
	Estimated bool
	// Hours are the 24 hours before Now, oldest first, each starting on
	// the hour: how many of the records still stored were claimed, and
	// completed, in it.
	Hours []HourCounts
}

// TenantCounts are one tenant's records by status.
type TenantCounts struct {
	Tenant                                 string
	InFlight, Abandoned, Complete, Expired int
}

// Total returns the tenant's records, all statuses together.
func (c TenantCounts) Total() int { return c.InFlight + c.Abandoned + c.Complete + c.Expired }

// HourCounts are the claims and completions of one hour.
type HourCounts struct {
	Start               time.Time
	Claims, Completions int
}

// ForgetParams are the arguments of Lister.Forget.
type ForgetParams struct {
	Tenant string
	Key    string
	// Token is the lease token of the completion to forget, as the
	// operator read it: a record claimed again since is not deleted.
	Token int64
}
