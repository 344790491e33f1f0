package idempg

import (
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// recordColumns lists what a record is read from, in scannedRecord.dest
// order.
const recordColumns = `fingerprint, state, lease_token, locked_until, storage_mode, status_code,
	response_headers, response_body, resource_ref, created_at, completed_at, expires_at`

// scannedRecord receives one idem_keys row. Nullable columns scan into
// pointers; every column is nullable here because the claim returns them
// through a LEFT JOIN that yields NULLs when the claim was won.
type scannedRecord struct {
	fingerprint []byte
	state       *string
	leaseToken  *int64
	lockedUntil *time.Time
	mode        *int16
	status      *int32
	headers     []byte
	body        []byte
	ref         *string
	createdAt   *time.Time
	completedAt *time.Time
	expiresAt   *time.Time
}

func (r *scannedRecord) dest() []any {
	return []any{&r.fingerprint, &r.state, &r.leaseToken, &r.lockedUntil, &r.mode, &r.status,
		&r.headers, &r.body, &r.ref, &r.createdAt, &r.completedAt, &r.expiresAt}
}

// present reports whether a row was scanned (state is NOT NULL in the
// table, so NULL means the LEFT JOIN found nothing).
func (r *scannedRecord) present() bool { return r.state != nil }

func (r *scannedRecord) record(tenant, key string) (*idem.Record, error) {
	header, err := idemcodec.UnmarshalHeader(r.headers)
	if err != nil {
		return nil, err
	}
	rec := &idem.Record{
		Tenant:      tenant,
		Key:         key,
		Fingerprint: r.fingerprint,
		State:       idem.State(deref(r.state)),
		LeaseToken:  deref(r.leaseToken),
		LockedUntil: deref(r.lockedUntil),
		Result: idem.Result{
			Mode:      idem.StorageMode(deref(r.mode)),
			Status:    int(deref(r.status)),
			Header:    header,
			Body:      r.body,
			Reference: deref(r.ref),
		},
		CreatedAt:   deref(r.createdAt),
		CompletedAt: deref(r.completedAt),
		ExpiresAt:   deref(r.expiresAt),
	}
	if len(rec.Fingerprint) == 0 {
		rec.Fingerprint = nil
	}
	if len(rec.Result.Body) == 0 {
		rec.Result.Body = nil
	}
	return rec, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
