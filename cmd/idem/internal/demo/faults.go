//go:build idemfaults

package demo

// The crash injection hook (see faultpoints.go). Never in a release
// build: only `go build -tags idemfaults` compiles it, for the crash tests.

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"syscall"

	"github.com/idem-go/idem/idemhttp"
)

// faultAfterCommit: idemhttp has committed the order and the stored answer
// together, and is about to send that answer: the client never gets it.
const faultAfterCommit faultPoint = "after-commit"

// faultCtxKey marks, in a request's context, the point at which that
// request kills the server. Only the request carrying IDEM_FAULT_KEY gets
// it, so the other requests of a test (and the retries after the restart,
// on a server started without IDEM_FAULT) run normally.
type faultCtxKey struct{}

// Faults arms the crash injection when IDEM_FAULT is set and returns
// next wrapped in it; otherwise it returns next itself, untouched.
//
// It wraps the whole stack, outside the idempotency middleware: that is
// the only place where a response is seen after idemhttp's commit (the
// middleware buffers the handler's answer and writes it out only once
// the record is complete).
//
// `idem serve` calls it once at start, after building the stack (so that
// in-process tests, which build the stack alone, never arm it). An unknown
// IDEM_FAULT panics there: the hook is one line in the command, where it
// cannot return an error, and a typo must not let a crash test run against
// a server that never crashes.
func Faults(next http.Handler, logger *slog.Logger) http.Handler {
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
// request's, through idemhttp and the engine, so the mark set by Faults
// reaches it.
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
