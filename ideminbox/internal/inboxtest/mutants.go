package inboxtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/ideminbox"
)

// Mutants are the bugs an adapter's conformance run must catch, each with
// the case of ExerciseAdapter that must fail with it. An adapter plants
// them in its deliveries with Mutant.
var Mutants = map[string]string{
	"ackBeforeCommit":  "FailedHandlerRedelivered", // acknowledges on arrival, before the inbox ran
	"nakAcks":          "FailedHandlerRedelivered", // a failure is acknowledged: the message is lost
	"neverAck":         "Duplicates",               // never releases a processed message
	"keyPerDelivery":   "Duplicates",               // keys on the delivery, not the message: copies differ
	"attemptAlwaysOne": "Poison",                   // reports every delivery as the first
	"termRequeues":     "NoIDRejected",             // gives a message without an id back to run again
}

// Mutant is an adapter's delivery D with the bug Bug (one of Mutants)
// planted, for an adapter's mutant run (ExerciseMutants): the adapter
// runs its deliveries through ideminbox.NewLoop as Mutant values.
type Mutant[D ideminbox.Delivery] struct {
	Delivery D
	Bug      string
	// DeliveryID returns an id of this delivery rather than of its message
	// (a RabbitMQ delivery's random tag, a JetStream stream sequence): the
	// key of the keyPerDelivery bug.
	DeliveryID func() string
}

// Message is the delivery's message, with the bug planted.
func (m Mutant[D]) Message() (ideminbox.Message, error) {
	if m.Bug == "ackBeforeCommit" {
		_ = m.Delivery.Ack()
	}
	msg, err := m.Delivery.Message()
	switch m.Bug {
	case "attemptAlwaysOne":
		msg.Attempt = 1
	case "keyPerDelivery":
		msg.ID = m.DeliveryID()
	}
	return msg, err
}

// Ack acknowledges the delivery, unless the bug is neverAck.
func (m Mutant[D]) Ack() error {
	if m.Bug == "neverAck" {
		return nil
	}
	return m.Delivery.Ack()
}

// Term gives the delivery back for good, or to run again (termRequeues).
func (m Mutant[D]) Term() error {
	if m.Bug == "termRequeues" {
		return m.Delivery.Nak(0)
	}
	return m.Delivery.Term()
}

// Nak gives the delivery back, or acknowledges it (nakAcks).
func (m Mutant[D]) Nak(delay time.Duration) error {
	if m.Bug == "nakAcks" {
		return m.Delivery.Ack()
	}
	return m.Delivery.Nak(delay)
}

// InProgress is the delivery's.
func (m Mutant[D]) InProgress() error { return m.Delivery.InProgress() }

// ExerciseMutants proves an adapter's conformance run can fail: each bug
// of Mutants must make its case fail. Each runs in a child test binary
// (a failing subtest cannot be caught in process) that runs only the
// adapter's TestConformanceMutant, with env naming the bug; there,
// MutantBug returns it.
func ExerciseMutants(t *testing.T, env string) {
	if os.Getenv(env) != "" {
		t.Skip("in a mutant's child process")
	}
	if testing.Short() {
		t.Skip("skipping the mutants in -short mode: one child process per bug")
	}
	for bug, caught := range Mutants {
		t.Run(bug, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestConformanceMutant$/^"+caught+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), env+"="+bug)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed an adapter with bug %s:\n%s", bug, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestConformanceMutant/"+caught+" ") {
				t.Fatalf("bug %s did not fail %s:\n%s", bug, caught, out)
			}
		})
	}
}

// MutantBug returns the bug env names in a mutant's child process, and
// skips t elsewhere: TestConformanceMutant is run by ExerciseMutants.
func MutantBug(t *testing.T, env string) string {
	bug := os.Getenv(env)
	if bug == "" {
		t.Skip("run by TestConformanceMutants")
	}
	return bug
}
