package idemhttp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
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
// holds the status and the body until the engine has committed, because a
// response sent before the commit could reach the client for an operation
// that is then rolled back (lease lost, store failure). Modelled on chi's
// middleware/wrap_writer.go, but it buffers instead of passing through:
//
//   - Flush (http.Flusher) is recorded as a no-op: a protected response
//     is delivered whole, after the commit. Streaming endpoints should not
//     be protected.
//   - ReadFrom (io.ReaderFrom) fills the buffer straight from the reader.
//   - 103 Early Hints are passed straight through with the handler's Link
//     header only: they announce resources, not a result, so sending them
//     early is harmless. Other 1xx codes are dropped: 100 Continue is
//     already sent by the server when the middleware reads the body, and
//     101 Switching Protocols needs a hijack.
//   - Hijack fails with ErrHijack.
//   - Unwrap returns the underlying writer, so http.ResponseController
//     reaches deadlines and full-duplex; it finds Flush and Hijack here
//     first, so it cannot bypass the buffering.
//
// The handler writes its headers straight into the underlying header map,
// as it would without the middleware: nothing reaches the wire before the
// underlying WriteHeader, and a successful answer then needs no copy. When
// the answer is discarded for a problem, restoreHeader puts back the map
// as it was before the handler ran, so that none of the handler's headers
// (a cookie, a Location) leak into the problem.
type recorder struct {
	w       http.ResponseWriter
	status  int
	body    []byte
	limit   int64
	over    bool   // the body went past limit; body is no longer kept
	ref     string // set through SetReference
	refSet  bool
	written bool // WriteHeader or Write called with a final status

	// outer is the underlying header map as it was before the handler
	// ran, as a list of fields: it is read back only when the answer is
	// discarded, and a list is cheaper to fill and to empty than a map.
	// It shares the value slices: the handler replaces values (Set, Add,
	// Del) rather than editing them in place.
	outer []headerField
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

// headerField is one entry of a header map.
type headerField struct {
	name   string
	values []string
}

var recorders = sync.Pool{New: func() any {
	return &recorder{outer: make([]headerField, 0, 4), stored: make(map[string][]string, 4)}
}}

// newRecorder returns a recorder over w, remembering w's header as it is
// now.
func newRecorder(w http.ResponseWriter, limit int64) *recorder {
	rec := recorders.Get().(*recorder)
	rec.w = w
	rec.limit = limit
	for k, v := range w.Header() {
		rec.outer = append(rec.outer, headerField{k, v})
	}
	return rec
}

// free returns rec to the pool. Nothing may use rec or its body
// afterwards.
func (rec *recorder) free() {
	clear(rec.outer) // drop the references: the pool must not keep them alive
	clear(rec.stored)
	body := rec.body[:0]
	if cap(body) > maxPooledBody {
		body = nil
	}
	*rec = recorder{body: body, outer: rec.outer[:0], stored: rec.stored}
	recorders.Put(rec)
}

// restoreHeader gives the underlying header map back the entries it had
// before the handler ran, dropping the handler's.
func (rec *recorder) restoreHeader() {
	h := rec.w.Header()
	clear(h)
	for _, f := range rec.outer {
		h[f.name] = f.values
	}
}

// Header implements http.ResponseWriter.
func (rec *recorder) Header() http.Header { return rec.w.Header() }

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

// earlyHints sends 103 with the handler's Link header and nothing else:
// net/http sends the whole header map with a 1xx, and the rest of it
// (a cookie, a Location) belongs to a result that is not committed yet.
func (rec *recorder) earlyHints() {
	h := rec.w.Header()
	links, ok := h["Link"]
	if !ok {
		return
	}
	saved := maps.Clone(h)
	clear(h)
	h["Link"] = links
	rec.w.WriteHeader(http.StatusEarlyHints)
	clear(h)
	maps.Copy(h, saved)
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
		room = min(room, rec.limit+1-int64(len(rec.body)))
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

// deliver sends the recorded response to the client; its headers are
// already in place.
func (rec *recorder) deliver(status int, body []byte) {
	rec.w.WriteHeader(status)
	if len(body) > 0 {
		rec.w.Write(body) //nolint:errcheck // the client is gone; the result is stored
	}
}
