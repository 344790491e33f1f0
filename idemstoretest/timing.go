package idemstoretest

import (
	"testing"
	"time"
)

// The suite waits on the store's clock by sleeping: a fake clock would
// only test the fake. The short durations are long enough for every store's
// clock resolution, and the long ones never end during a case, so that a
// slow machine delays the suite but never fails it.
const (
	// shortLease is a lease the suite waits out.
	shortLease = 300 * time.Millisecond
	// shortRetention is a retention the suite waits out. It leaves room
	// for a claim, a completion and a replay before it ends.
	shortRetention = 900 * time.Millisecond
	// clockSlack covers the rounding of the store's timestamps and the gap
	// between the store's clock and the moment a call returns.
	clockSlack = 200 * time.Millisecond
	// longLease never ends during a case.
	longLease = 10 * time.Minute
	// longRetention never ends during a case.
	longRetention = 24 * time.Hour
	// caseTimeout bounds every case, so that a store that hangs fails the
	// case instead of the whole test binary.
	caseTimeout = 60 * time.Second
)

// sleepPast sleeps until d (plus clockSlack) has passed since since, a
// local time taken after the store call that started d returned. The
// store stamped its own clock before that, so once this returns d has
// passed on the store's clock too.
func sleepPast(t *testing.T, since time.Time, d time.Duration) {
	t.Helper()
	if wait := time.Until(since.Add(d + clockSlack)); wait > 0 {
		time.Sleep(wait)
	}
}
