package idemhttp_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
)

// TestConformance runs the front-end suite against the middleware over
// idemmem; tests/idemhttp runs it on SQLite and PostgreSQL.
func TestConformance(t *testing.T) {
	if name := os.Getenv(brokenEnv); name != "" {
		b, ok := broken[name]
		if !ok {
			t.Fatalf("unknown broken front end %q", name)
		}
		idemfronttest.Exercise(t, b.harness, idemfronttest.Features{}, nil)
		return
	}
	idemfronttest.Exercise(t, idemhttptest.Harness{}, idemfronttest.Features{}, nil)
}

// brokenEnv names the broken front end a child of TestConformanceCatches
// runs the suite against.
const brokenEnv = "IDEMHTTP_BROKEN_FRONT"

// broken are HTTP front ends with the mistakes an adapter built on
// idemhttp could make, each with the case of the suite that must catch
// it: the suite's own mutants run on an in-process front end; these prove
// that the HTTP harness reads real answers strictly enough to see them.
var broken = map[string]struct {
	harness idemhttptest.Harness
	caught  string
}{
	// A router's adapter that drops the marker on the way out.
	"replayWithoutMarker": {idemhttptest.Harness{Server: around(func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inner.ServeHTTP(dropHeader{w, idemhttp.HeaderReplayed}, r)
		})
	})}, "Replay/ByteForByte"},
	// Every status stored: a 429 (or 409) kept for the retention.
	"transientStored": {idemhttptest.Harness{Config: idemhttp.Config{UnstoredStatuses: []int{}}}, "Failures/TransientNotStored"},
	// The body hidden from the fingerprint, handed to the handler behind
	// the middleware's back: another request under the key is replayed
	// the first one's answer.
	"bodyNotFingerprinted": {idemhttptest.Harness{Server: func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler {
		m, err := idemhttp.NewMiddleware(engine, cfg)
		if err != nil {
			t.Fatal(err)
		}
		inner := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Body = io.NopCloser(bytes.NewReader(r.Context().Value(bodyKey{}).([]byte)))
			protected.ServeHTTP(w, r)
		}))
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			r = r.WithContext(context.WithValue(r.Context(), bodyKey{}, b))
			r.Body = http.NoBody
			inner.ServeHTTP(w, r)
		})
	}}, "Mismatch/AfterCompletion"},
	// Fails open: the handler runs unprotected when the store is down.
	"failOpen": {idemhttptest.Harness{Server: func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler {
		m, err := idemhttp.NewMiddleware(engine, cfg)
		if err != nil {
			t.Fatal(err)
		}
		inner := m.Handler(protected)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			rec := httptest.NewRecorder()
			r.Body = io.NopCloser(bytes.NewReader(body))
			inner.ServeHTTP(rec, r)
			if rec.Code == http.StatusServiceUnavailable {
				rec = httptest.NewRecorder()
				r.Body = io.NopCloser(bytes.NewReader(body))
				protected.ServeHTTP(rec, r)
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes()) //nolint:errcheck // the client is gone
		})
	}}, "StoreDown/HandlerNotRun"},
}

type bodyKey struct{}

// around serves the middleware inside wrap.
func around(wrap func(http.Handler) http.Handler) func(*testing.T, *idem.Engine, *idemhttp.Config, http.Handler) http.Handler {
	return func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler {
		m, err := idemhttp.NewMiddleware(engine, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return wrap(m.Handler(protected))
	}
}

// dropHeader deletes one header before the answer goes out.
type dropHeader struct {
	http.ResponseWriter
	name string
}

func (d dropHeader) WriteHeader(code int) {
	d.Header().Del(d.name)
	d.ResponseWriter.WriteHeader(code)
}

// TestConformanceCatches runs the suite against each broken front end in
// a child test binary (a failing subtest cannot be caught in process),
// and fails unless the case named in broken fails.
func TestConformanceCatches(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: one test binary per broken front end")
	}
	if os.Getenv(brokenEnv) != "" {
		t.Skip("skipping: a child of TestConformanceCatches")
	}
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			area, _, _ := strings.Cut(b.caught, "/")
			cmd := exec.Command(os.Args[0], "-test.run=^TestConformance$/^"+area+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), brokenEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed the broken front end %s:\n%s", name, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestConformance/"+b.caught+" ") {
				t.Fatalf("%s did not fail %s:\n%s", name, b.caught, out)
			}
		})
	}
}
