package inboxtest

import (
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/ideminbox"
)

// soak scales the adapters' duplicates tests up:
// go test ./ideminbox/... -args -soak
var soak = flag.Bool("soak", false, "run the duplicates tests with thousands of messages")

// Soak reports whether the tests run at soak scale (-soak).
func Soak() bool { return *soak }

// Patience bounds every wait for the brokers: generous, since a loaded
// machine is slow, and more so for the soak.
func Patience() time.Duration {
	if *soak {
		return 15 * time.Minute
	}
	return time.Minute
}

// Quiet drops the logs of the many failures the tests cause on purpose.
var Quiet = slog.New(slog.DiscardHandler)

// InstanceConfig is the inbox configuration of an adapter test's consumer
// instance before the test changes it: quick retries and waits, five
// attempts.
func InstanceConfig() ideminbox.Config {
	return ideminbox.Config{
		Consumer:       "projector",
		Logger:         Quiet,
		MaxAttempts:    5,
		InFlightDelay:  20 * time.Millisecond,
		RetryDelayFunc: func(int) time.Duration { return 10 * time.Millisecond },
	}
}

// Eventually waits until cond holds, failing t with what when it does
// not within Patience: a bound against hanging, not a measure of speed.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Patience())
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// OrderIDs returns the message ids order-0 … order-n-1.
func OrderIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("order-%d", i)
	}
	return ids
}

// ExactlyOnce checks that each of ids took effect exactly once in b, and
// that nothing else did.
func ExactlyOnce(t testing.TB, b *Backend, ids []string) {
	t.Helper()
	rows := b.Rows(t, Effects)
	counts := Count(rows)
	for _, k := range ids {
		if counts[k] != 1 {
			t.Errorf("message %s took effect %d times", k, counts[k])
		}
	}
	if len(rows) != len(ids) {
		t.Errorf("%d effects for %d messages", len(rows), len(ids))
	}
}

// Tally is what an adapter test's consumer instances did, by message id:
// the inbox's answers, each with the delivery it answered, and the
// handler's runs. Safe for concurrent use.
type Tally struct {
	mu        sync.Mutex
	decisions map[string][]ideminbox.Action
	trace     map[string][]string // "action@delivery"
	calls     map[string]int
}

// NewTally returns an empty tally.
func NewTally() *Tally {
	return &Tally{decisions: map[string][]ideminbox.Action{}, trace: map[string][]string{}, calls: map[string]int{}}
}

// Called counts one run of id's handler, and returns how many there were.
func (ta *Tally) Called(id string) int {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	ta.calls[id]++
	return ta.calls[id]
}

// Observed records the inbox's answer a to delivery number delivery of
// id (0 when the broker does not number deliveries, counted as 1).
func (ta *Tally) Observed(id string, a ideminbox.Action, delivery int) {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	ta.decisions[id] = append(ta.decisions[id], a)
	ta.trace[id] = append(ta.trace[id], fmt.Sprintf("%s@%d", a, max(delivery, 1)))
}

// Calls returns how many times id's handler ran.
func (ta *Tally) Calls(id string) int {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	return ta.calls[id]
}

// Count returns how many times the inbox answered a to id.
func (ta *Tally) Count(id string, a ideminbox.Action) int {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	n := 0
	for _, x := range ta.decisions[id] {
		if x == a {
			n++
		}
	}
	return n
}

// Acked returns how many deliveries of id were acknowledged as processed
// or as a duplicate.
func (ta *Tally) Acked(id string) int {
	return ta.Count(id, ideminbox.Ack) + ta.Count(id, ideminbox.AckDuplicate)
}

// Decisions returns the inbox's answers to id, in order.
func (ta *Tally) Decisions(id string) []ideminbox.Action {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	return append([]ideminbox.Action(nil), ta.decisions[id]...)
}

// Trace returns id's answers as "action@delivery", held ones left out.
func (ta *Tally) Trace(id string) []string {
	ta.mu.Lock()
	defer ta.mu.Unlock()
	var out []string
	for _, s := range ta.trace[id] {
		if !strings.HasPrefix(s, ideminbox.Hold.String()+"@") {
			out = append(out, s)
		}
	}
	return out
}
