package idemhttp

import (
	"context"
	"log/slog"
	"net/http"
	"runtime/debug"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
)

// hookRefused are the headers Config.OnReplay may not add: the
// middleware's own and those of the connection and the framing, which
// net/http or the replay itself set.
var hookRefused = map[string]bool{
	"Connection":        true,
	"Content-Length":    true,
	"Keep-Alive":        true,
	"Proxy-Connection":  true,
	"Te":                true,
	"Trailer":           true,
	"Transfer-Encoding": true,
	"Upgrade":           true,
	HeaderKey:           true,
	HeaderReplayed:      true,
}

// onReplay runs Config.OnReplay and adds the headers it gave to w, those
// the replay has not set. A panic is logged and its headers dropped: the
// hook only informs, and the replay is the client's answer.
func (m *Middleware) onReplay(w http.ResponseWriter, r *http.Request, res idem.Result) {
	if m.config.OnReplay == nil {
		return
	}
	extra := make(http.Header)
	ok := func() (ok bool) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				m.config.Logger.ErrorContext(r.Context(), "idemhttp: Config.OnReplay panicked; replay sent without its headers",
					slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			}
		}()
		m.config.OnReplay(r, res, extra)
		return true
	}()
	if !ok {
		return
	}
	h := w.Header()
	for k, v := range extra {
		if !idemfront.ValidHeaderName(k) {
			continue
		}
		k = http.CanonicalHeaderKey(k)
		if _, set := h[k]; set || hookRefused[k] || k == m.keyHeader {
			continue
		}
		h[k] = withoutCTL(v)
	}
}

// FirstExecution reports whether the handler running under ctx runs an
// operation no earlier execution left unfinished: it holds the key and is
// not a takeover (idem.Execution.Takeover). A takeover's handler may find
// that an earlier execution already did some of its work outside the
// store; the recovery points (idem.Step) say which. An execution after a
// released key (a 5xx under Config.ReleaseOn5xx, a handler error) is a
// first execution too, the engine having rolled the earlier one's writes
// back, unless the earlier one recorded steps: it is then a takeover.
// False outside an execution: a request without a key, or a method the
// middleware does not cover.
func FirstExecution(ctx context.Context) bool {
	x, ok := idem.ExecutionFromContext(ctx)
	return ok && !x.Takeover
}
