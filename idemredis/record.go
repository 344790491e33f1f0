package idemredis

import (
	"fmt"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// modeNames are the stored names of the storage modes: words rather than
// numbers, so that an operator reading a record with HGETALL understands it.
var modeNames = map[string]idem.StorageMode{
	idem.ModeResponse.String():  idem.ModeResponse,
	idem.ModeReference.String(): idem.ModeReference,
	idem.ModeMarker.String():    idem.ModeMarker,
}

// decodeRecord builds a Record from the fields of its hash. It refuses a
// hash that this package could not have written, rather than replaying a
// half-understood result.
func decodeRecord(f map[string]string) (*idem.Record, error) {
	rec := &idem.Record{
		Tenant: f["tenant"],
		Key:    f["key"],
		State:  idem.State(f["state"]),
	}
	if fp := f["fingerprint"]; fp != "" {
		rec.Fingerprint = []byte(fp)
	}
	switch rec.State {
	case idem.StateInFlight, idem.StateComplete:
	default:
		return nil, fmt.Errorf("idemredis: stored record has state %q", rec.State)
	}
	var err error
	if rec.LeaseToken, err = strconv.ParseInt(f["token"], 10, 64); err != nil {
		return nil, fmt.Errorf("idemredis: stored token: %w", err)
	}
	if rec.LockedUntil, err = parseMicros(f, "locked_until"); err != nil {
		return nil, err
	}
	if rec.CreatedAt, err = parseMicros(f, "created_at"); err != nil {
		return nil, err
	}
	if rec.ExpiresAt, err = parseMicros(f, "expires_at"); err != nil {
		return nil, err
	}
	if rec.Steps, err = decodeSteps(f["steps"]); err != nil {
		return nil, err
	}
	if rec.State != idem.StateComplete {
		return rec, nil
	}
	if rec.CompletedAt, err = parseMicros(f, "completed_at"); err != nil {
		return nil, err
	}
	mode, ok := modeNames[f["mode"]]
	if !ok {
		return nil, fmt.Errorf("idemredis: stored record has mode %q", f["mode"])
	}
	rec.Result.Mode = mode
	if rec.Result.Status, err = strconv.Atoi(f["status"]); err != nil {
		return nil, fmt.Errorf("idemredis: stored status: %w", err)
	}
	if rec.Result.Header, err = idemcodec.UnmarshalHeader([]byte(f["header"])); err != nil {
		return nil, err
	}
	if body := f["body"]; body != "" {
		rec.Result.Body = []byte(body)
	}
	rec.Result.Reference = f["reference"]
	return rec, nil
}

// decodePairs turns the flat [field, value, …] reply of HGETALL inside a
// script into a map.
func decodePairs(v any) (map[string]string, error) {
	list, ok := v.([]any)
	if !ok || len(list)%2 != 0 {
		return nil, fmt.Errorf("idemredis: unexpected record reply %T", v)
	}
	f := make(map[string]string, len(list)/2)
	for i := 0; i < len(list); i += 2 {
		name, ok1 := list[i].(string)
		value, ok2 := list[i+1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("idemredis: unexpected record field %T=%T", list[i], list[i+1])
		}
		f[name] = value
	}
	return f, nil
}

func parseMicros(f map[string]string, name string) (time.Time, error) {
	us, err := strconv.ParseInt(f[name], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("idemredis: stored %s: %w", name, err)
	}
	return time.UnixMicro(us), nil
}
