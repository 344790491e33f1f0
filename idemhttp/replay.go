package idemhttp

import (
	"log/slog"
	"net/http"
	"runtime/debug"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
)

// writeReplay sends a stored result back, and says how.
func (m *Middleware) writeReplay(w http.ResponseWriter, r *http.Request, body *requestBody, res idem.Result) (idemfront.Kind, int) {
	h := w.Header()
	if res.Mode != idem.ModeResponse {
		if m.config.ReplayFunc == nil {
			m.config.Logger.ErrorContext(r.Context(), "idemhttp: stored result needs Config.ReplayFunc",
				slog.String("mode", res.Mode.String()))
			return idemfront.ReplayFailed, writeProblem(w, problemReplayFailed)
		}
		h[HeaderReplayed] = replayedTrue
		m.onReplay(w, r, res)
		// The original body was read to fingerprint it: give the function
		// a request whose body reads it again. A copy, not r itself, which
		// outer middlewares still hold.
		r = r.WithContext(r.Context())
		if r.Body != nil && r.Body != http.NoBody {
			body.rewind()
			r.Body = body
		}
		return m.callReplayFunc(w, r, res)
	}
	h[HeaderReplayed] = replayedTrue
	for k, v := range res.Header {
		// Checked again on the way out: the record may have been stored
		// under another configuration, or by another program (a front
		// end that keeps lowercase names, as gRPC metadata is).
		if m.replay.Replayable(k) {
			h[http.CanonicalHeaderKey(k)] = v
		}
	}
	m.onReplay(w, r, res)
	w.WriteHeader(res.Status)
	if len(res.Body) > 0 {
		w.Write(res.Body) //nolint:errcheck // the client is gone
	}
	return idemfront.Replayed, res.Status
}

// callReplayFunc runs Config.ReplayFunc, containing its panics: the key
// is complete, so every retry would meet the same panic and a dropped
// connection; they get 500 replay-failed instead, when nothing was sent
// yet. http.ErrAbortHandler is raised again, as net/http means it.
func (m *Middleware) callReplayFunc(w http.ResponseWriter, r *http.Request, res idem.Result) (outcome idemfront.Kind, status int) {
	tw := &writeTracker{ResponseWriter: w}
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		if v == http.ErrAbortHandler {
			panic(v)
		}
		m.config.Logger.ErrorContext(r.Context(), "idemhttp: Config.ReplayFunc panicked",
			slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
		outcome, status = idemfront.ReplayFailed, tw.status
		if !tw.wrote {
			status = writeProblem(w, problemReplayFailed)
		}
	}()
	m.config.ReplayFunc(tw, r, res)
	if tw.status == 0 {
		tw.status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	return idemfront.Replayed, tw.status
}

// writeTracker notes whether anything was written through it. Unwrap
// keeps http.ResponseController working through it.
type writeTracker struct {
	http.ResponseWriter
	wrote  bool
	status int // the final status sent, 0 before
}

func (t *writeTracker) WriteHeader(code int) {
	if code >= 200 && !t.wrote {
		t.wrote, t.status = true, code
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *writeTracker) Write(p []byte) (int, error) {
	if !t.wrote {
		t.wrote, t.status = true, http.StatusOK
	}
	return t.ResponseWriter.Write(p)
}

func (t *writeTracker) Unwrap() http.ResponseWriter { return t.ResponseWriter }
