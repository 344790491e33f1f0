package idemproxy

import (
	"net/http"
	"strings"
	"time"
)

// passWriter is the ResponseWriter ReverseProxy writes the upstream's
// answer to, behind the middleware. In BufferOnly it hands everything to
// the middleware's recorder. Otherwise it holds the answer itself up to
// the store limit and hands it to the recorder whole when it ends; an
// answer that turns out larger, or that modifyResponse saw is a stream,
// goes straight to the client instead (passed through), and the recorder
// gets the answer-not-stored marker under the same status, so that the
// key is kept and never stores a truncated body.
type passWriter struct {
	rec      http.ResponseWriter // the middleware's recorder
	st       *state
	limit    int64
	passMode bool // not BufferOnly
	passNow  bool // set by modifyResponse: pass through from the first byte

	wrote   bool // a final status was written
	status  int
	buf     []byte
	passing bool
	recErr  error // a write the recorder refused (BufferOnly)
}

func (pw *passWriter) Header() http.Header { return pw.rec.Header() }

func (pw *passWriter) WriteHeader(code int) {
	if code < 200 {
		if !pw.passing {
			pw.rec.WriteHeader(code) // the recorder passes 103 on, drops the rest
		}
		return
	}
	if pw.wrote {
		return
	}
	pw.wrote, pw.status = true, code
	switch {
	case !pw.passMode:
		pw.rec.WriteHeader(code)
	case pw.passNow:
		pw.startPass()
	}
}

func (pw *passWriter) Write(b []byte) (int, error) {
	if !pw.wrote {
		pw.WriteHeader(http.StatusOK)
	}
	if !pw.passMode {
		n, err := pw.rec.Write(b)
		if err != nil && pw.recErr == nil {
			pw.recErr = err
		}
		return n, err
	}
	if !pw.passing && int64(len(pw.buf))+int64(len(b)) > pw.limit {
		pw.startPass()
	}
	if pw.passing {
		return pw.st.outer.w.Write(b)
	}
	pw.buf = append(pw.buf, b...)
	return len(b), nil
}

// FlushError implements the flush http.ResponseController finds:
// ReverseProxy flushes a stream as it comes. A buffered answer is
// delivered whole after the commit, so flushing it does nothing.
func (pw *passWriter) FlushError() error {
	if pw.passing {
		return http.NewResponseController(pw.st.outer.w).Flush()
	}
	if !pw.passMode {
		if f, ok := pw.rec.(http.Flusher); ok {
			f.Flush()
		}
	}
	return nil
}

// startPass sends the status, the headers and what was held to the
// client, and passes the rest through.
func (pw *passWriter) startPass() {
	pw.passing = true
	pw.st.passed.Store(true)
	w := pw.st.outer.w
	// A stream outlives the server's write timeout, set for answers
	// that are whole by then.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	w.WriteHeader(pw.status)
	if len(pw.buf) > 0 {
		w.Write(pw.buf) //nolint:errcheck // a client gone is seen by the next write
	}
	pw.buf = nil
}

// finish hands the recorder what it stores: the answer held, or the
// marker of an answer passed through.
func (pw *passWriter) finish() {
	if !pw.passMode || !pw.wrote {
		return
	}
	if !pw.passing {
		pw.rec.WriteHeader(pw.status)
		if len(pw.buf) > 0 {
			pw.rec.Write(pw.buf) //nolint:errcheck // within the limit
		}
		return
	}
	// The answer's headers are sent: the map now describes the marker
	// the middleware stores (its allowlist picks from it), keeping the
	// trailers net/http sends once the handler returns.
	h := pw.rec.Header()
	var trailers http.Header
	for k, v := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) || k == "Trailer" {
			if trailers == nil {
				trailers = http.Header{}
			}
			trailers[k] = v
		}
	}
	clear(h)
	for k, v := range trailers {
		h[k] = v
	}
	h.Set("Content-Type", "application/problem+json")
	pw.rec.WriteHeader(pw.status)
	pw.rec.Write(answerNotStored(pw.status)) //nolint:errcheck // small
}

// outerWriter is the ResponseWriter the middleware writes to: the
// client's, except that it drops what follows an answer passed through
// (the middleware delivers the stored marker after it), and answers the
// proxy's own problem in place of the middleware's when the upstream's
// outcome is unknown.
type outerWriter struct {
	w          http.ResponseWriter
	st         *state
	leaseAfter string
	replaced   bool
}

func (o *outerWriter) Header() http.Header { return o.w.Header() }

func (o *outerWriter) WriteHeader(code int) {
	if o.st.passed.Load() {
		return
	}
	if p := o.st.override.Load(); p != nil && code >= 200 {
		if !o.replaced {
			o.replaced = true
			writeProblem(o.w, p, o.leaseAfter)
		}
		return
	}
	o.w.WriteHeader(code)
}

func (o *outerWriter) Write(b []byte) (int, error) {
	if o.st.passed.Load() {
		return len(b), nil
	}
	if o.st.override.Load() != nil {
		if !o.replaced {
			o.WriteHeader(http.StatusOK)
		}
		return len(b), nil
	}
	return o.w.Write(b)
}

// Unwrap lets http.ResponseController reach the client's writer.
func (o *outerWriter) Unwrap() http.ResponseWriter { return o.w }
