package idemhttp_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

// sizeRecorder is a request body that sends little and records the
// largest buffer the middleware offered to read into.
type sizeRecorder struct {
	r   io.Reader
	max int
}

func (s *sizeRecorder) Read(p []byte) (int, error) {
	s.max = max(s.max, len(p))
	return s.r.Read(p)
}

func (s *sizeRecorder) Close() error { return nil }

// A request that announces a large Content-Length makes the middleware
// reserve memory only as the bytes arrive: about 150 bytes of header must
// not cost the server a megabyte.
func TestBodyBufferGrowsWithTheData(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{MaxResponseBody: 4 << 20}, c)
	body := &sizeRecorder{r: strings.NewReader("tea")}
	r := request(http.MethodPost, "/orders", "k1", "")
	r.Body, r.ContentLength = body, idemhttp.DefaultMaxRequestBody // announced, never sent
	w := serve(h, r)
	if w.Code != http.StatusCreated {
		t.Fatalf("%d %q", w.Code, w.Body)
	}
	if body.max > 64<<10 {
		t.Fatalf("the middleware offered a %d-byte buffer for a body of 3 bytes announced as %d", body.max, r.ContentLength)
	}

	// A body that does arrive whole is read whole, at the limit.
	big := strings.Repeat("x", idemhttp.DefaultMaxRequestBody)
	r = request(http.MethodPost, "/orders", "k2", big)
	if w := serve(h, r); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), big) {
		t.Fatalf("a body at the limit: %d, %d bytes", w.Code, w.Body.Len())
	}
}
