package idemhttp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
)

// ErrHijack is returned by the Hijack method of the ResponseWriter a
// protected handler sees: a hijacked connection bypasses the response, so
// nothing could be stored for the retries.
var ErrHijack = errors.New("idemhttp: a protected request cannot hijack its connection")

// ErrResponseTooLarge is returned by the Write and ReadFrom methods of the
// ResponseWriter a protected handler sees once the response exceeds
// Config.MaxResponseBody. The handler may stop writing: the answer will be
// a 500 problem, its work rolled back and the key released.
var ErrResponseTooLarge = errors.New("idemhttp: response too large to store")

// recorder is the http.ResponseWriter a protected handler writes to. It
// holds the status, the headers and the body until the engine has
// committed, because a response sent before the commit could reach the
// client for an operation that is then rolled back (lease lost, store
// failure). Modelled on chi's middleware/wrap_writer.go, but it buffers
// instead of passing through:
//
//   - Flush (http.Flusher) is recorded as a no-op: a protected response
//     is delivered whole, after the commit. Streaming endpoints should not
//     be protected.
//   - ReadFrom (io.ReaderFrom) fills the buffer straight from the reader.
//   - 103 Early Hints are passed straight through with the handler's Link
//     header: they announce resources, not a result, so sending them
//     early is harmless. Other 1xx codes are dropped: 100 Continue is
//     already sent by the server when the middleware reads the body, and
//     101 Switching Protocols needs a hijack.
//   - Hijack fails with ErrHijack.
//   - Unwrap returns the underlying writer, so http.ResponseController
//     reaches deadlines and full-duplex; it finds Flush and Hijack here
//     first, so it cannot bypass the buffering.
type recorder struct {
	w       http.ResponseWriter
	header  http.Header
	status  int
	body    []byte
	limit   int64
	over    bool   // the body went past limit; body is no longer kept
	ref     string // set through SetReference
	refSet  bool
	written bool // WriteHeader or Write called with a final status

	// stored is reused for the allowlisted headers given to the store,
	// which copies or encodes them in Complete.
	stored map[string][]string
}

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
	_ io.ReaderFrom = (*recorder)(nil)
)

// maxPooledBody bounds the buffers kept for reuse: one unusually large
// response must not pin its buffer in the pool for ever.
const maxPooledBody = 64 << 10

var recorders = sync.Pool{New: func() any {
	return &recorder{header: make(http.Header, 8), stored: make(map[string][]string, 4)}
}}

// newRecorder returns a recorder over w whose header starts as a copy of
// w's, so the handler sees and may change what outer middlewares set, as
// it would without the recorder.
func newRecorder(w http.ResponseWriter, limit int64) *recorder {
	rec := recorders.Get().(*recorder)
	rec.w = w
	rec.limit = limit
	for k, v := range w.Header() {
		rec.header[k] = v
	}
	return rec
}

// free returns rec to the pool. Nothing may use rec, its header or its
// body afterwards.
func (rec *recorder) free() {
	clear(rec.header)
	clear(rec.stored)
	body := rec.body[:0]
	if cap(body) > maxPooledBody {
		body = nil
	}
	*rec = recorder{header: rec.header, body: body, stored: rec.stored}
	recorders.Put(rec)
}

// Header implements http.ResponseWriter.
func (rec *recorder) Header() http.Header { return rec.header }

// WriteHeader implements http.ResponseWriter.
func (rec *recorder) WriteHeader(code int) {
	if code >= 100 && code <= 199 {
		if code == http.StatusEarlyHints && !rec.written {
			rec.earlyHints()
		}
		return
	}
	if rec.written {
		return
	}
	if code < 100 || code > 999 {
		// As net/http does: an invalid code is a programming error.
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	rec.status = code
	rec.written = true
}

// earlyHints sends 103 with the handler's Link header, and leaves the
// underlying header as it was (net/http keeps the header of a 1xx for the
// final response, which may be a problem that must not carry it).
func (rec *recorder) earlyHints() {
	links, ok := rec.header["Link"]
	if !ok {
		return
	}
	h := rec.w.Header()
	old, had := h["Link"]
	h["Link"] = links
	rec.w.WriteHeader(http.StatusEarlyHints)
	if had {
		h["Link"] = old
	} else {
		delete(h, "Link")
	}
}

// Write implements http.ResponseWriter.
func (rec *recorder) Write(p []byte) (int, error) {
	if !rec.written {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.over {
		return 0, ErrResponseTooLarge
	}
	if int64(len(rec.body))+int64(len(p)) > rec.limit {
		rec.overflow()
		return 0, ErrResponseTooLarge
	}
	rec.body = append(rec.body, p...)
	return len(p), nil
}

// WriteString implements io.StringWriter, saving the handler's copy of s.
func (rec *recorder) WriteString(s string) (int, error) {
	if !rec.written {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.over {
		return 0, ErrResponseTooLarge
	}
	if int64(len(rec.body))+int64(len(s)) > rec.limit {
		rec.overflow()
		return 0, ErrResponseTooLarge
	}
	rec.body = append(rec.body, s...)
	return len(s), nil
}

// ReadFrom implements io.ReaderFrom: io.Copy(w, r) fills the buffer
// without an intermediate copy, and stops at the limit.
func (rec *recorder) ReadFrom(src io.Reader) (int64, error) {
	if !rec.written {
		rec.WriteHeader(http.StatusOK)
	}
	var n int64
	for {
		if rec.over {
			return n, ErrResponseTooLarge
		}
		if len(rec.body) == cap(rec.body) {
			rec.body = slices.Grow(rec.body, max(512, cap(rec.body)))
		}
		// Read at most one byte past the limit: enough to know it is
		// exceeded without buffering more.
		room := int64(cap(rec.body) - len(rec.body))
		if max := rec.limit + 1 - int64(len(rec.body)); room > max {
			room = max
		}
		m, err := src.Read(rec.body[len(rec.body) : int64(len(rec.body))+room])
		rec.body = rec.body[:len(rec.body)+m]
		n += int64(m)
		if int64(len(rec.body)) > rec.limit {
			rec.overflow()
			return n, ErrResponseTooLarge
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

func (rec *recorder) overflow() {
	rec.over = true
	rec.body = rec.body[:0]
}

// Flush implements http.Flusher as a no-op: the response is delivered
// whole after the commit.
func (rec *recorder) Flush() {}

// Hijack implements http.Hijacker and always fails with ErrHijack.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, ErrHijack
}

// Unwrap returns the underlying ResponseWriter, for http.ResponseController.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// finalStatus is the status the handler answered; 200 when it wrote
// nothing, as net/http does.
func (rec *recorder) finalStatus() int {
	if !rec.written {
		return http.StatusOK
	}
	return rec.status
}

// deliver sends the recorded response to the client: the handler's
// headers replace the underlying ones, as if it had written them there.
func (rec *recorder) deliver(status int, body []byte) {
	h := rec.w.Header()
	clear(h)
	for k, v := range rec.header {
		h[k] = v
	}
	rec.w.WriteHeader(status)
	if len(body) > 0 {
		rec.w.Write(body) //nolint:errcheck // the client is gone; the result is stored
	}
}
