package idemhttp

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
)

// errRequestTooLarge is what readBody returns for a body past the limit.
var errRequestTooLarge = errors.New("idemhttp: request body too large")

// requestBody is the body read once for the fingerprint and handed back to
// the handler as its Request.Body. It is pooled with its buffer, and
// keeps the fingerprint's bytes too (the store copies them in Claim).
type requestBody struct {
	buf         []byte
	rd          bytes.Reader
	fingerprint [sha256.Size]byte
}

var requestBodies = sync.Pool{New: func() any { return new(requestBody) }}

// readBody reads r.Body whole, refusing more than limit bytes, and closes
// it. A request that announces a longer Content-Length is refused before a
// byte is read.
func readBody(r *http.Request, limit int64) (*requestBody, error) {
	b := requestBodies.Get().(*requestBody)
	if r.Body == nil || r.Body == http.NoBody {
		b.reset()
		return b, nil
	}
	defer r.Body.Close()
	if r.ContentLength > limit {
		b.free()
		return nil, errRequestTooLarge
	}
	buf := b.buf[:0]
	if r.ContentLength > 0 && int64(cap(buf)) < r.ContentLength+1 {
		// One byte of room past the announced length lets the read loop
		// see EOF without growing the buffer.
		buf = slices.Grow(buf, int(r.ContentLength)+1)
	}
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, max(512, cap(buf)))
		}
		room := min(int64(cap(buf)-len(buf)), limit+1-int64(len(buf)))
		n, err := r.Body.Read(buf[len(buf) : int64(len(buf))+room])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			b.buf = buf
			b.free()
			return nil, errRequestTooLarge
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			b.buf = buf
			b.free()
			var maxErr *http.MaxBytesError
			if errors.As(err, &maxErr) {
				// A limit set in front of the middleware.
				return nil, errRequestTooLarge
			}
			return nil, err
		}
	}
	b.buf = buf
	b.reset()
	return b, nil
}

func (b *requestBody) bytes() []byte { return b.buf }

// reset rewinds the reader to the start of the body.
func (b *requestBody) reset() { b.rd.Reset(b.buf) }

// Read implements io.Reader.
func (b *requestBody) Read(p []byte) (int, error) { return b.rd.Read(p) }

// WriteTo implements io.WriterTo, so io.Copy and io.ReadAll-like helpers
// skip a copy.
func (b *requestBody) WriteTo(w io.Writer) (int64, error) { return b.rd.WriteTo(w) }

// Close implements io.Closer. The buffer stays valid until the middleware
// frees it after the handler returned.
func (b *requestBody) Close() error { return nil }

// free returns b to the pool. Neither b nor its bytes may be used after.
func (b *requestBody) free() {
	if cap(b.buf) > maxPooledBody {
		b.buf = nil
	}
	b.buf = b.buf[:0]
	b.rd.Reset(nil)
	requestBodies.Put(b)
}
