package idemproxy_test

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
	"github.com/idem-go/idem/idemproxy"
)

// harness serves the suite's handler as an upstream on a server of its
// own, and the proxy in front of it: the suite's calls go through the
// proxy over loopback, the handler runs in the upstream's own request.
type harness struct{}

func (harness) Serve(t *testing.T, engine *idem.Engine, opts idemfronttest.Options, handler idemfronttest.Handler) idemfronttest.Client {
	h := idemhttptest.Harness{Server: func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler {
		upstream := httptest.NewUnstartedServer(protected)
		// The Failures cases panic in the handler on purpose.
		upstream.Config.ErrorLog = log.New(io.Discard, "", 0)
		upstream.Start()
		t.Cleanup(upstream.Close)
		u, err := url.Parse(upstream.URL)
		if err != nil {
			t.Fatal(err)
		}
		// BufferOnly: the suite's Limits case wants an answer over the
		// limit refused and its key released, as idemhttp does; the
		// passing through of large answers is tested on its own.
		p, err := idemproxy.New(engine, &idemproxy.Config{Upstream: u, Middleware: *cfg, BufferOnly: opts.MaxResponseBody > 0})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}}
	return client{h.Serve(t, engine, opts, handler)}
}

// client reads the proxy's own problem back in the kit's words.
type client struct{ idemfronttest.Client }

func (c client) Send(ctx context.Context, call idemfronttest.Call) (idemfronttest.Reply, error) {
	r, err := c.Client.Send(ctx, call)
	// A handler that panics or ends its goroutine in the upstream makes
	// net/http close the connection without an answer: the proxy says
	// the outcome is unknown, and holds the key until its lease ends,
	// which is the kit's Panicked on a store without transactions
	// (nothing undone, retry later).
	if err == nil && r.Kind == idemfront.Internal && strings.Contains(string(r.Body), idemproxy.ProblemTypeBase+idemproxy.SlugOutcomeUnknown) {
		r.Kind, r.Body = idemfront.Panicked, nil
	}
	return r, err
}

// TestConformance runs the front-end suite through the proxy, on idemmem:
// the Transactions area needs a store whose transaction the handler
// writes through, and the proxy cannot hand the upstream its
// transaction, so it is skipped as on every store without one.
func TestConformance(t *testing.T) {
	idemfronttest.Exercise(t, harness{}, idemfronttest.Features{}, nil)
}
