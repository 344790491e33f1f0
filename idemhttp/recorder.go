package idemhttp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/idem-go/idem/idemfront"
)

// ErrHijack is returned by the Hijack method of the ResponseWriter a
// protected handler sees: a hijacked connection bypasses the response, so
// nothing could be stored for the retries.
var ErrHijack = errors.New("idemhttp: a protected request cannot hijack its connection")

// ErrResponseTooLarge is returned by the Write and ReadFrom methods of the
// ResponseWriter a protected handler sees once the response exceeds
// Config.MaxResponseBody. The handler may stop writing: the answer will be
// a 500 problem, its work rolled back and the key released.
// It wraps idemfront.ErrResponseTooLarge, the kit's name for it.
var ErrResponseTooLarge = fmt.Errorf("idemhttp: response too large to store: %w", idemfront.ErrResponseTooLarge)

// ErrHandlerReturned is returned by the Write, WriteString and ReadFrom
// methods of the ResponseWriter a protected handler saw, once that
// handler has returned: a goroutine it left behind writes too late, and
// its bytes go nowhere. (net/http drops them too, or answers
// http.ErrHandlerTimeout behind http.TimeoutHandler.)
var ErrHandlerReturned = errors.New("idemhttp: write after the protected handler returned")

// recorder is the http.ResponseWriter a protected handler writes to. It
// holds the status and the body until the engine has committed, because a
// response sent before the commit could reach the client for an operation
// that is then rolled back (lease lost, store failure). Modelled on chi's
// middleware/wrap_writer.go, but it buffers instead of passing through:
//
//   - Flush (http.Flusher) is recorded as a no-op: a protected response
//     is delivered whole, after the commit. Streaming endpoints should not
//     be protected.
//   - ReadFrom (io.ReaderFrom) copies through a pooled chunk.
//   - 103 Early Hints are passed straight through with the handler's Link
//     header only: they announce resources, not a result, so sending them
//     early is harmless. Other 1xx codes are dropped: 100 Continue is
//     already sent by the server when the middleware reads the body, and
//     101 Switching Protocols needs a hijack.
//   - Hijack fails with ErrHijack.
//   - Unwrap returns the underlying writer, so http.ResponseController
//     reaches deadlines and full-duplex; it finds Flush and Hijack here
//     first, so it cannot bypass the buffering.
//   - A declared Content-Length is enforced as net/http enforces it: the
//     write that would pass it fails with http.ErrContentLength and is
//     not recorded; statuses without a body (204, 304) refuse writes with
//     http.ErrBodyNotAllowed.
//
// The handler writes its headers straight into the underlying header map,
// as it would without the middleware: nothing reaches the wire before the
// underlying WriteHeader, and a successful answer then needs no copy. When
// the answer is discarded for a problem, restoreHeader puts back the map
// as it was before the handler ran, so that none of the handler's headers
// (a cookie, a Location) leak into the problem.
//
// A recorder belongs to one request and is never reused. Once its handler
// has returned, seal cuts it from the request: what a goroutine left
// behind writes then fails with ErrHandlerReturned, Header returns a map
// of its own, and Unwrap a writer that reaches nothing. Only then does the
// middleware read the body, whose buffer later requests reuse.
type recorder struct {
	mu     sync.Mutex
	sealed atomic.Bool // set under mu
	late   http.Header // what Header returns once sealed

	w       http.ResponseWriter
	status  int
	written bool  // WriteHeader or Write called with a final status
	declLen int64 // the Content-Length the handler declared; -1 for none
	tried   int64 // bytes the handler tried to write, as net/http counts
	body    []byte
	limit   int64
	over    bool   // the body went past limit; body is no longer kept
	ref     string // set through SetReference
	refSet  bool

	// outer is the underlying header map as it was before the handler
	// ran, as a list of fields: it is read back only when the answer is
	// discarded, and a list is cheaper to fill and to empty than a map.
	// It shares the value slices: the handler replaces values (Set, Add,
	// Del) rather than editing them in place.
	outer []headerField
}

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
	_ io.ReaderFrom = (*recorder)(nil)
)

// maxPooledBody bounds the buffers kept for reuse: one unusually large
// body must not pin its buffer in the pool for ever.
const maxPooledBody = 64 << 10

// headerField is one entry of a header map.
type headerField struct {
	name   string
	values []string
}

// start readies rec over w, writing into body (reused: its capacity is
// kept), and remembers w's header as it is now, into outer.
func (rec *recorder) start(w http.ResponseWriter, limit int64, body []byte, outer []headerField) {
	rec.w = w
	rec.limit = limit
	rec.body = body[:0]
	rec.declLen = -1
	for k, v := range w.Header() {
		outer = append(outer, headerField{k, v})
	}
	rec.outer = outer
}

// seal cuts rec from its handler (see recorder). It is idempotent.
func (rec *recorder) seal() {
	if rec.sealed.Load() {
		return
	}
	rec.mu.Lock()
	rec.sealed.Store(true)
	rec.mu.Unlock()
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
func (rec *recorder) Header() http.Header {
	if !rec.sealed.Load() {
		return rec.w.Header() // w is set before the handler runs, and stays
	}
	// The underlying map now belongs to the middleware and then to
	// net/http: a late caller gets one nobody reads.
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.late == nil {
		rec.late = make(http.Header)
	}
	return rec.late
}

// WriteHeader implements http.ResponseWriter.
func (rec *recorder) WriteHeader(code int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.writeHeader(code)
}

func (rec *recorder) writeHeader(code int) {
	if rec.sealed.Load() {
		return
	}
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
	// As net/http reads it: an invalid value is no declaration (net/http
	// drops it from the answer).
	if cl := rec.w.Header().Get("Content-Length"); cl != "" {
		if v, err := strconv.ParseInt(cl, 10, 64); err == nil && v >= 0 {
			rec.declLen = v
		}
	}
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
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if err := rec.admit(len(p)); err != nil {
		return 0, err
	}
	rec.body = append(rec.body, p...)
	return len(p), nil
}

// WriteString implements io.StringWriter, saving the handler's copy of s.
func (rec *recorder) WriteString(s string) (int, error) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if err := rec.admit(len(s)); err != nil {
		return 0, err
	}
	rec.body = append(rec.body, s...)
	return len(s), nil
}

// admit decides whether n more bytes may be recorded, in net/http's order:
// a status that allows no body, then the declared Content-Length (the
// bytes are counted even when refused, so every later write fails too),
// then the limit of what can be stored.
func (rec *recorder) admit(n int) error {
	if rec.sealed.Load() {
		return ErrHandlerReturned
	}
	if !rec.written {
		rec.writeHeader(http.StatusOK)
	}
	if n == 0 {
		return nil
	}
	if !bodyAllowed(rec.status) {
		return http.ErrBodyNotAllowed
	}
	rec.tried += int64(n)
	if rec.declLen >= 0 && rec.tried > rec.declLen {
		return http.ErrContentLength
	}
	if rec.over {
		return ErrResponseTooLarge
	}
	if int64(len(rec.body))+int64(n) > rec.limit {
		rec.over = true
		rec.body = rec.body[:0]
		return ErrResponseTooLarge
	}
	return nil
}

// bodyAllowed reports whether a response with status may have a body.
func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified && (status < 100 || status > 199)
}

// copyChunks are the buffers ReadFrom reads into. The recorder's own
// buffer is never handed to a reader: one still reading when its handler
// returned would write into a buffer a later request reuses.
var copyChunks = sync.Pool{New: func() any {
	b := make([]byte, 32<<10)
	return &b
}}

// ReadFrom implements io.ReaderFrom: io.Copy(w, r) goes through a pooled
// chunk, each one recorded as a Write.
func (rec *recorder) ReadFrom(src io.Reader) (int64, error) {
	chunk := copyChunks.Get().(*[]byte)
	defer copyChunks.Put(chunk)
	var n int64
	for {
		m, rerr := src.Read(*chunk)
		if m > 0 {
			if _, err := rec.Write((*chunk)[:m]); err != nil {
				return n, err
			}
			n += int64(m)
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// Flush implements http.Flusher as a no-op: the response is delivered
// whole after the commit.
func (rec *recorder) Flush() {}

// Hijack implements http.Hijacker and always fails with ErrHijack.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, ErrHijack
}

// Unwrap returns the underlying ResponseWriter, for http.ResponseController;
// once the handler has returned, a writer that reaches nothing, since the
// connection may be serving another request by then.
func (rec *recorder) Unwrap() http.ResponseWriter {
	if rec.sealed.Load() {
		return finishedWriter{}
	}
	return rec.w
}

// finishedWriter is what a handler reaches through Unwrap after it
// returned: nothing.
type finishedWriter struct{}

func (finishedWriter) Header() http.Header       { return http.Header{} }
func (finishedWriter) WriteHeader(int)           {}
func (finishedWriter) Write([]byte) (int, error) { return 0, ErrHandlerReturned }

// finalStatus is the status the handler answered; 200 when it wrote
// nothing, as net/http does. Call it once rec is sealed.
func (rec *recorder) finalStatus() int {
	if !rec.written {
		return http.StatusOK
	}
	return rec.status
}

// short reports whether the body is shorter than the Content-Length the
// handler declared: net/http would then send what it has and close the
// connection, and the client would see a broken response. Call it once
// rec is sealed.
func (rec *recorder) short() bool {
	return rec.declLen >= 0 && int64(len(rec.body)) < rec.declLen && bodyAllowed(rec.finalStatus())
}

// deliver sends the recorded response to the client; its headers are
// already in place. Call it once rec is sealed.
func (rec *recorder) deliver(status int, body []byte) {
	rec.w.WriteHeader(status)
	if len(body) > 0 {
		rec.w.Write(body) //nolint:errcheck // the client is gone; the result is stored
	}
}
