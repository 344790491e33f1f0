package demo

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// How much of a request a log line quotes. The request line is the
// client's to choose (up to the server's header limit): quoted whole, a
// few large requests would fill the disk with copies of themselves. A
// valid Idempotency-Key is at most 255 bytes and is kept whole, so that
// the log can be searched for it.
const (
	logMethodMax = 32
	logPathMax   = 256
	logQueryMax  = 256
	logKeyMax    = 255
)

// logRequests logs one line per request: what a demo's reader wants to
// see (status, replayed or not, the key). Values are quoted and escaped by
// slog's text handler where they need it, and cut by clip.
func logRequests(logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		attrs := []slog.Attr{
			slog.String("method", clip(r.Method, logMethodMax)),
			slog.String("path", clip(r.URL.EscapedPath(), logPathMax)),
		}
		if r.URL.RawQuery != "" {
			attrs = append(attrs, slog.String("query", clip(r.URL.RawQuery, logQueryMax)))
		}
		attrs = append(attrs,
			slog.Int("status", sw.code()),
			slog.Duration("took", time.Since(start)),
		)
		if key := r.Header.Get(idemhttp.HeaderKey); key != "" {
			attrs = append(attrs, slog.String("key", clip(key, logKeyMax)))
		}
		if w.Header().Get(idemhttp.HeaderReplayed) == "true" {
			attrs = append(attrs, slog.Bool("replayed", true))
		}
		logger.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
	})
}

// clip cuts s to limit bytes, on a character boundary, and says how long
// it was.
func clip(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	return cutText(s, limit) + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// statusWriter remembers the status sent through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
