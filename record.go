package idem

import (
	"bytes"
	"time"
)

// State is where a record stands in its life. A key with no record (or a
// record past its retention) is absent; the stored states are the other two.
type State string

const (
	// StateInFlight means an execution holds the key under a lease and has
	// not completed yet.
	StateInFlight State = "in_flight"
	// StateComplete means the operation ran and its result is stored for
	// replays.
	StateComplete State = "complete"
)

// StorageMode says how much of an operation's result is stored, which in
// turn decides how a replay is built.
type StorageMode uint8

const (
	// ModeResponse stores the whole result: status, headers and body. A
	// replay sends them back as they are. It is the default.
	ModeResponse StorageMode = iota
	// ModeReference stores the id of what the operation created
	// (Result.Reference) and the status. A replay rebuilds the answer
	// through a function the integrator gives, at the cost of a lookup.
	ModeReference
	// ModeMarker stores only the status: the smallest record. It fits
	// answers that can be recomputed. Where a key names a request, the
	// fingerprint is then mandatory, since it is the only thing that proves
	// a retry asks the same thing (idemhttp always computes one); where the
	// key names the thing itself, as a message id does for ideminbox, none
	// is needed. The engine does not check it.
	ModeMarker
)

// String returns the name used in stored records and in logs.
func (m StorageMode) String() string {
	switch m {
	case ModeResponse:
		return "response"
	case ModeReference:
		return "reference"
	case ModeMarker:
		return "marker"
	}
	return "unknown"
}

// Result is what an execution leaves behind for its replays. Its fields are
// protocol-neutral: idemhttp puts the HTTP status, the allowlisted response
// headers and the body in them; ideminbox stores an empty result.
type Result struct {
	// Mode says which of the fields below are meaningful.
	Mode StorageMode
	// Status is the outcome code: the HTTP status for idemhttp, zero where
	// the protocol has none.
	Status int
	// Header holds metadata to replay (for HTTP, the allowlisted response
	// headers). Stores keep it in the canonical encoding of idemcodec.MarshalHeader.
	Header map[string][]string
	// Body is the stored payload (ModeResponse only).
	Body []byte
	// Reference is the id of the created resource (ModeReference only).
	Reference string
}

// Record is the stored row for one (tenant, key).
type Record struct {
	Tenant string
	Key    string
	// Fingerprint identifies what the request asked for; empty when the
	// integrator does not fingerprint.
	Fingerprint []byte
	State       State
	// LeaseToken is the fencing token of the execution that holds (or last
	// held) the lease. Only the holder of this token can complete.
	LeaseToken int64
	// LockedUntil is when the lease ends, on the store's clock.
	LockedUntil time.Time
	// Result is the stored outcome; meaningful when State is StateComplete.
	Result      Result
	CreatedAt   time.Time
	CompletedAt time.Time // zero while in flight
	// Steps are the recovery points recorded while the key was in flight
	// (StepStore), in order.
	Steps []RecordedStep
	// ExpiresAt is the end of retention: past it the record counts as
	// absent, whether or not a purge has deleted it yet.
	ExpiresAt time.Time
}

// SameFingerprint reports whether a retry carrying fingerprint asks for the
// same thing as the execution that created r. A record and a retry that
// both carry no fingerprint match; one with and one without do not.
func (r *Record) SameFingerprint(fingerprint []byte) bool {
	return bytes.Equal(r.Fingerprint, fingerprint)
}
