package idemstoretest

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// checkResult reports every field of got that differs from want. An empty
// body or header equals a nil one: SQL columns and Redis fields need not
// tell them apart, and no protocol does.
func checkResult(t *testing.T, what string, got, want idem.Result) {
	t.Helper()
	if got.Mode != want.Mode {
		t.Errorf("%s: Mode = %v, want %v", what, got.Mode, want.Mode)
	}
	if got.Status != want.Status {
		t.Errorf("%s: Status = %d, want %d", what, got.Status, want.Status)
	}
	if got.Reference != want.Reference {
		t.Errorf("%s: Reference = %q, want %q", what, got.Reference, want.Reference)
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("%s: Body differs (%d bytes, want %d): %s", what, len(got.Body), len(want.Body), firstDiff(got.Body, want.Body))
	}
	if (len(got.Header) != 0 || len(want.Header) != 0) && !reflect.DeepEqual(got.Header, want.Header) {
		t.Errorf("%s: Header = %q, want %q", what, got.Header, want.Header)
	}
}

func firstDiff(a, b []byte) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("first difference at byte %d", i)
		}
	}
	return "one is a prefix of the other"
}

// describe renders a record for failure messages, without its result.
func describe(rec *idem.Record) string {
	if rec == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s/%s %s token=%d fingerprint=%x locked_until=%s expires_at=%s",
		rec.Tenant, rec.Key, rec.State, rec.LeaseToken, rec.Fingerprint,
		rec.LockedUntil.Format(time.RFC3339Nano), rec.ExpiresAt.Format(time.RFC3339Nano))
}

// checkSpan reports a store-clock span that is not want, within a second.
func checkSpan(t *testing.T, what string, got, want time.Duration) {
	t.Helper()
	if got < want-time.Second || got > want+time.Second {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}
