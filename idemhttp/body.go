package idemhttp

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
)

// errRequestTooLarge is what readBody returns for a body past the limit.
var errRequestTooLarge = errors.New("idemhttp: request body too large")

// firstBodyChunk is the most readBody reserves before data arrives: a
// client announcing a large Content-Length and sending nothing must not
// make the server hold memory for it. The buffer then grows with the
// bytes actually read.
const firstBodyChunk = 4 << 10

// readBody reads r.Body whole into buf (reused: its capacity is kept),
// refusing more than limit bytes, and closes it. A request that announces
// a longer Content-Length is refused before a byte is read.
func readBody(r *http.Request, limit int64, buf []byte) ([]byte, error) {
	buf = buf[:0]
	if r.Body == nil || r.Body == http.NoBody {
		return buf, nil
	}
	defer r.Body.Close()
	if r.ContentLength > limit {
		return buf, errRequestTooLarge
	}
	if r.ContentLength > 0 && int64(cap(buf)) <= r.ContentLength {
		// One byte of room past the announced length lets the read loop
		// see EOF without growing the buffer; but no more than one chunk
		// before the bytes are there.
		buf = slices.Grow(buf, int(min(r.ContentLength+1, firstBodyChunk)))
	}
	for {
		if len(buf) == cap(buf) {
			// Doubling follows the data that arrived: what is reserved
			// is never more than twice what was read.
			buf = slices.Grow(buf, max(512, cap(buf)))
		}
		room := min(int64(cap(buf)-len(buf)), limit+1-int64(len(buf)))
		n, err := r.Body.Read(buf[len(buf) : int64(len(buf))+room])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return buf, errRequestTooLarge
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			var maxErr *http.MaxBytesError
			if errors.As(err, &maxErr) {
				// A limit set in front of the middleware.
				return buf, errRequestTooLarge
			}
			return buf, err
		}
	}
}

// requestBody is the body read once for the fingerprint and handed back
// to the handler as its Request.Body. It belongs to one request and is
// never reused: a handler, or a goroutine it started (http.TimeoutHandler
// leaves one running), may still hold it once the request has ended. Its
// buffer is reused by later requests, so end cuts the two apart: reads
// that come later fail with http.ErrBodyReadAfterClose, as net/http's own
// body does, and the buffer goes back to the pool only when no WriteTo is
// still writing from it.
type requestBody struct {
	mu   sync.Mutex
	buf  []byte
	off  int
	busy int  // WriteTo calls writing from buf outside mu
	done bool // the request ended: buf is no longer served
}

// set makes buf the body, read from its start.
func (b *requestBody) set(buf []byte) {
	b.mu.Lock()
	b.buf, b.off = buf, 0
	b.mu.Unlock()
}

// rewind reads the body again from its start.
func (b *requestBody) rewind() {
	b.mu.Lock()
	b.off = 0
	b.mu.Unlock()
}

// Read implements io.Reader.
func (b *requestBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.off >= len(b.buf) {
		return 0, io.EOF
	}
	n := copy(p, b.buf[b.off:])
	b.off += n
	return n, nil
}

// WriteTo implements io.WriterTo, so io.Copy and io.ReadAll-like helpers
// skip a copy. w is called outside the lock: a writer that blocks must
// not block the end of the request.
func (b *requestBody) WriteTo(w io.Writer) (int64, error) {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return 0, http.ErrBodyReadAfterClose
	}
	rest := b.buf[b.off:]
	b.off = len(b.buf)
	b.busy++
	b.mu.Unlock()

	var n int
	var err error
	if len(rest) > 0 {
		n, err = w.Write(rest)
	}
	b.mu.Lock()
	b.busy--
	b.mu.Unlock()
	return int64(n), err
}

// Close implements io.Closer. The body stays readable until the request
// ends.
func (b *requestBody) Close() error { return nil }

// end stops serving the body and returns its buffer for reuse, or nil
// when a WriteTo still writes from it: that buffer is then left to the
// garbage collector.
func (b *requestBody) end() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = true
	buf := b.buf
	b.buf = nil
	if b.busy > 0 {
		return nil
	}
	return buf
}
