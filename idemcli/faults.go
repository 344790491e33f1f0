package idemcli

// Crash injection for `idem serve`: TEST-ONLY.
//
// internal/crashtest proves that a process killed with SIGKILL at any step
// of a request loses nothing: it starts `idem serve` with
//
//	IDEM_FAULT=after-claim|after-write|after-commit
//	IDEM_FAULT_KEY=<an Idempotency-Key>
//
// and the process kills itself, with no chance to clean up, when the
// request carrying that key reaches that step. Without IDEM_FAULT nothing
// here runs: Serve.Run reads the variables once at start (not newServer,
// so in-process tests never see them), and an unarmed server's handlers
// carry no fault in their contexts, so the hooks in ordersApp.create are
// a context lookup that finds nothing. Never set these variables outside
// a test: the server dies on purpose.

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"syscall"

	"github.com/idem-go/idem/idemhttp"
)

// Environment variables of the crash injection.
const (
	envFault    = "IDEM_FAULT"
	envFaultKey = "IDEM_FAULT_KEY"
)

// faultPoint is a step of a request at which an armed server kills itself.
type faultPoint string

const (
	// faultAfterClaim: the handler starts. The claim is committed (the
	// key is in flight under a lease); nothing else is, and the handler's
	// transaction is open but empty.
	faultAfterClaim faultPoint = "after-claim"
	// faultAfterWrite: the order is inserted through the handler's
	// transaction, which is not committed yet.
	faultAfterWrite faultPoint = "after-write"
	// faultAfterCommit: idemhttp has committed the order and the stored
	// answer together, and is about to send that answer: the client never
	// gets it.
	faultAfterCommit faultPoint = "after-commit"
)

// faultCtxKey marks, in a request's context, the point at which that
// request kills the server. Only the request carrying IDEM_FAULT_KEY gets
// it, so the other requests of a test (and the retries after the restart,
// on a server started without IDEM_FAULT) run normally.
type faultCtxKey struct{}

// withFaults arms the crash injection when IDEM_FAULT is set and returns
// next wrapped in it; otherwise it returns next itself, untouched.
//
// It wraps the whole stack, outside the idempotency middleware: that is
// the only place where a response is seen after idemhttp's commit (the
// middleware buffers the handler's answer and writes it out only once
// the record is complete).
//
// An unknown IDEM_FAULT panics at start: the hook is one line in Run,
// where it cannot return an error, and a typo must not let a crash test
// run against a server that never crashes.
func withFaults(next http.Handler, logger *slog.Logger) http.Handler {
	point := faultPoint(os.Getenv(envFault))
	key := os.Getenv(envFaultKey)
	switch point {
	case "":
		return next
	case faultAfterClaim, faultAfterWrite, faultAfterCommit:
	default:
		panic(fmt.Sprintf("%s=%q: unknown fault point; want %s, %s or %s (test-only)",
			envFault, point, faultAfterClaim, faultAfterWrite, faultAfterCommit))
	}
	if key == "" {
		panic(fmt.Sprintf("%s=%s needs %s: the key of the request that kills the server (test-only)", envFault, point, envFaultKey))
	}
	logger.Warn("TEST-ONLY crash injection armed: the server kills itself with SIGKILL at this point of the request carrying this key",
		slog.String("fault", string(point)), slog.String("key", key))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// ParseKey, as idemhttp does: the bare and the quoted forms of a
		// key name one key. A malformed key never matches.
		if k, err := idemhttp.ParseKey(r.Header); err != nil || k != key {
			next.ServeHTTP(w, r)
			return
		}
		if point == faultAfterCommit {
			w = &killingWriter{ResponseWriter: w}
		} else {
			r = r.WithContext(context.WithValue(r.Context(), faultCtxKey{}, point))
		}
		next.ServeHTTP(w, r)
	})
}

// injectFault kills the process when ctx belongs to the armed request and
// point is its fault point. The handler's context derives from the
// request's, through idemhttp and the engine, so the mark set by
// withFaults reaches it.
func injectFault(ctx context.Context, point faultPoint) {
	if p, _ := ctx.Value(faultCtxKey{}).(faultPoint); p == point {
		die()
	}
}

// die kills the process the way a crash or the OOM killer would: SIGKILL
// cannot be caught, so no deferred call, rollback, key release or
// graceful shutdown runs. What survives is what the database committed.
func die() {
	syscall.Kill(os.Getpid(), syscall.SIGKILL) //nolint:errcheck // signalling oneself cannot fail
	select {}                                  // the signal is asynchronous: let nothing run after it
}

// killingWriter kills the process when the response starts: after the
// commit, before any byte of the answer reaches the client.
type killingWriter struct {
	http.ResponseWriter
}

func (w *killingWriter) WriteHeader(code int) {
	// 1xx (103 Early Hints) pass through idemhttp before the commit: not
	// the answer yet.
	if code >= 200 {
		die()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *killingWriter) Write(p []byte) (int, error) {
	die()
	return 0, nil // die does not return
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *killingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
