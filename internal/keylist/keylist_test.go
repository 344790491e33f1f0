package keylist

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func TestCursorRoundTrip(t *testing.T) {
	rec := &idem.Record{Tenant: "t|\x00\"", Key: "k\"}", CreatedAt: time.Unix(1700000000, 123456789)}
	c, ok, err := Decode(Of(rec).Encode())
	if err != nil || !ok || c != Of(rec) {
		t.Fatalf("Decode(Encode(%+v)) = %+v, %v, %v", Of(rec), c, ok, err)
	}
	if c.After(rec) {
		t.Error("a cursor comes after its own record")
	}
	later := *rec
	later.Key += "x"
	if !c.After(&later) {
		t.Error("the next key of the same claim time is not after the cursor")
	}
	for _, bad := range []string{"!", "W10", "WzEsMiwzXQ"} { // not base64, [], [1,2,3]
		if _, _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%q) accepted a cursor no store wrote", bad)
		}
	}
}

func TestCounterHours(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)
	c := NewCounter(now)
	c.Add(&idem.Record{Tenant: "a", State: idem.StateComplete, CreatedAt: now.Add(-time.Minute), CompletedAt: now, LockedUntil: now, ExpiresAt: now.Add(time.Hour)})
	c.Add(&idem.Record{Tenant: "a", State: idem.StateInFlight, CreatedAt: now.Add(-23 * time.Hour), LockedUntil: now.Add(-time.Hour), ExpiresAt: now.Add(time.Hour)})
	c.Add(&idem.Record{Tenant: "b", State: idem.StateInFlight, CreatedAt: now.Add(-48 * time.Hour), LockedUntil: now.Add(time.Hour), ExpiresAt: now.Add(time.Hour)})
	st := c.Stats()
	if st.Hours[23].Claims != 1 || st.Hours[23].Completions != 1 || st.Hours[0].Claims != 1 {
		t.Errorf("hours: first %+v, last %+v", st.Hours[0], st.Hours[23])
	}
	if len(st.Tenants) != 2 || st.Tenants[0].Tenant != "a" || st.Tenants[0].Abandoned != 1 || st.Tenants[1].InFlight != 1 {
		t.Errorf("tenants: %+v", st.Tenants)
	}
	if st.OldestInFlight == nil || st.OldestInFlight.Tenant != "b" {
		t.Errorf("oldest in flight: %+v", st.OldestInFlight)
	}
}
