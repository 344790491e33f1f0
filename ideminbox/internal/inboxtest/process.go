package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
)

// The consumer processes of the crash tests: a test starts its own test
// binary again, running only child, with env naming the backend and the
// broker's destination; the child is a consumer that exits (os.Exit, no
// clean-up, its connection just drops) where the test says.

// runChild runs the test binary's test child with env added.
func runChild(child string, env []string) ([]byte, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+child+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	return cmd.CombinedOutput()
}

// crashStatus is the exit status of a consumer process that crashed as
// planned.
const crashStatus = 3

// ExitAfterCommit is what a crashing consumer process does right after
// its first commit, before the ack: it says which message it committed,
// for the test (CrashedAfterCommit), and exits.
func ExitAfterCommit(id string) {
	fmt.Printf("crashed after committing %s\n", id)
	os.Exit(crashStatus)
}

// CrashedAfterCommit runs the consumer process child (which calls
// ExitAfterCommit) with env, and returns the id of the message it
// committed and did not acknowledge.
func CrashedAfterCommit(t testing.TB, child string, env []string) string {
	t.Helper()
	out, err := runChild(child, env)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != crashStatus {
		t.Fatalf("the consumer process did not crash as planned: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^crashed after committing (\S+)$`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("the consumer process did not say what it committed:\n%s", out)
	}
	return string(m[1])
}

// CrashLoopMaxAttempts is the MaxAttempts of a crash loop's consumer
// processes.
const CrashLoopMaxAttempts = 3

// CrashLoopID and CrashLoopData are the message of a crash loop.
const (
	CrashLoopID   = "order-deadly"
	CrashLoopData = "deadly"
)

// CrashLoop runs a message that kills its consumer process every time:
// the broker's destination holds CrashLoopID, published once, and child
// is a consumer process (with CrashLoopInbox, and a handler that calls
// os.Exit(3)) that ends with AwaitPoisoned. Started again after each
// crash, the consumer gets the message back each time. The first
// delivery past MaxAttempts finds its key still held by the dead
// process's claim, and grants it a last run, which crashes too; the next
// delivery finds the key held by that last run's claim, records the
// message as poison without running it again, and acks it: the crash loop
// ends, after MaxAttempts+1 crashes. drained waits until the broker holds
// nothing more.
func CrashLoop(t *testing.T, b *Backend, child string, env []string, drained func()) {
	t.Helper()
	crashes := 0
	// transcript keeps what each consumer process saw, for a failure to
	// show the sequence.
	var transcript strings.Builder
	for n := 1; ; n++ {
		if n > CrashLoopMaxAttempts+3 {
			t.Fatalf("still crashing after %d consumer processes:\n%s", n-1, transcript.String())
		}
		out, err := runChild(child, append(b.Env(), env...))
		fmt.Fprintf(&transcript, "consumer process %d (%v):\n%s", n, err, out)
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == crashStatus {
			crashes++
			continue
		}
		if err != nil || !regexp.MustCompile(`(?m)^poisoned `+CrashLoopID+`$`).Match(out) {
			t.Fatalf("consumer process %d: %v\n%s", n, err, out)
		}
		break
	}
	drained()
	inbox, err := ideminbox.NewInbox(Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: Quiet})
	if err != nil {
		t.Fatal(err)
	}
	st, err := inbox.Status(context.Background(), CrashLoopID)
	if err != nil || st.State != ideminbox.StatePoison || st.Error != ideminbox.ErrUnanswered.Error() ||
		st.Attempt != CrashLoopMaxAttempts+2 || string(st.Data) != CrashLoopData || crashes != CrashLoopMaxAttempts+1 {
		t.Fatalf("after %d crashes: status %+v, %v; want poison, unanswered, on delivery %d after %d crashes\n%s",
			crashes, st, err, CrashLoopMaxAttempts+2, CrashLoopMaxAttempts+1, transcript.String())
	}
}

// CrashLoopInbox returns the inbox of a crash loop's consumer process: a
// short lease, so that the dead processes' claims end soon.
func CrashLoopInbox(t testing.TB, b *Backend) *ideminbox.Inbox {
	t.Helper()
	engine, err := idem.NewEngine(b.NewStore(t), &idem.Config{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: "projector", Logger: Quiet,
		MaxAttempts: CrashLoopMaxAttempts, InFlightDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return inbox
}

// AwaitPoisoned ends a crash loop's consumer process: once the inbox
// records a message as poison (its id sent on poisoned) it stops the
// consumption (stop; Consume acks the delivery in hand, then returns on
// done), sends what the client still holds (flush), and says so for
// CrashLoop. A Consume that returns first, or ctx's end, fails t.
func AwaitPoisoned(t testing.TB, ctx context.Context, poisoned <-chan string, done <-chan error, stop func(), flush func() error) {
	t.Helper()
	select {
	case k := <-poisoned:
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := flush(); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("poisoned %s\n", k)
	case err := <-done:
		t.Fatalf("Consume: %v", err)
	case <-ctx.Done():
		t.Fatal("no message")
	}
}
