package idemcheck_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/idemcheck"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// The checks' keys, in the order a run uses them: checks 1 to 3, check 4,
// check 6. Test servers use the third to act on check 6's request only.
var testKeys = []string{"key-1", "key-2", "key-3"}

const disconnectKey = "key-3"

func keyFunc() func() string {
	var mu sync.Mutex
	next := 0
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		next++
		return testKeys[next-1]
	}
}

func check(t *testing.T, srv *httptest.Server, config idemcheck.Config) *idemcheck.Report {
	t.Helper()
	config.URL = srv.URL + "/orders"
	config.Body = []byte(orderBody)
	config.Header = http.Header{"Content-Type": {"application/json"}}
	config.CountURL = srv.URL + "/orders?cart_id=c_42"
	config.Concurrency = 6
	config.KeyFunc = keyFunc()
	rep, err := idemcheck.Check(context.Background(), config)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	idemcheck.WriteReport(&text, rep)
	t.Logf("report:\n%s", text.String())
	return rep
}

// waitFor waits for ch, failing the test after a long deadline.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Errorf("gave up waiting for %s", what)
	}
}

// cutGate makes the order of check 6's requests on the server certain.
// The check cuts its first request and then retries; the network may
// deliver the retry first, and the test would then not be about a
// disconnect. The gate holds every request with the disconnect key until
// it knows which one was cut: the one whose client is gone once its body
// has been read. That one goes on, with a context the gate cancels once
// the handler holds the key (start), so the handler meets its client's
// departure midway, as a slow handler would; the retries go on after it.
type cutGate struct {
	once    sync.Once
	mu      sync.Mutex
	cancel  context.CancelFunc
	started chan struct{}
}

func newCutGate() *cutGate { return &cutGate{started: make(chan struct{})} }

func (g *cutGate) wrap(t *testing.T, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Idempotency-Key") != disconnectKey {
			h.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body) // read to its end: net/http now watches the connection
		r.Body = io.NopCloser(bytes.NewReader(body))
		select {
		case <-r.Context().Done(): // the cut request
			ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
			g.mu.Lock()
			g.cancel = cancel
			g.mu.Unlock()
			h.ServeHTTP(w, r.WithContext(ctx))
			g.start() // in case the handler never started
		case <-g.started: // a retry, once the cut request holds the key
			h.ServeHTTP(w, r)
		case <-time.After(30 * time.Second):
			t.Error("gave up waiting for check 6's cut request")
		}
	})
}

// wouldStart reports whether start has not been called yet.
func (g *cutGate) wouldStart() bool {
	select {
	case <-g.started:
		return false
	default:
		return true
	}
}

// start is called by the handler once it holds the key: the first time,
// it delivers the cut request's disconnect and lets the retries in, and
// reports true.
func (g *cutGate) start() bool {
	first := false
	g.once.Do(func() {
		first = true
		g.mu.Lock()
		if g.cancel != nil {
			g.cancel()
		}
		g.mu.Unlock()
		close(g.started)
	})
	return first
}

// An idemhttp server whose handler is still working when check 6's client
// goes away: the retries meet the execution in flight (409, retried), and
// once it completes, its replay. One order for the key: check 6 passes.
func TestDisconnectWhileTheHandlerWorks(t *testing.T) {
	o := &orders{}
	eng, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idemhttp.NewMiddleware(eng, &idemhttp.Config{SharedKeySpace: true})
	if err != nil {
		t.Fatal(err)
	}
	gate := newCutGate()
	conflict := make(chan struct{})
	var once sync.Once
	// The handler runs on a context its client's disconnect does not end
	// (idemhttp's default): the server's own request context tells.
	clientGone := make(chan struct{})
	var goneOnce sync.Once
	handler := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == disconnectKey && gate.start() {
			// The order is written; the rest of the work outlasts the
			// client and a retry of it.
			rec := httptest.NewRecorder()
			o.create(rec, r)
			waitFor(t, clientGone, "the client to go")
			waitFor(t, conflict, "a retry to meet the execution")
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		o.create(w, r)
	}))
	mux := o.mux(gate.wrap(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == disconnectKey {
			go func() {
				<-r.Context().Done()
				goneOnce.Do(func() { close(clientGone) })
			}()
		}
		sw := &statusWriter{ResponseWriter: w}
		handler.ServeHTTP(sw, r)
		if sw.status == http.StatusConflict && r.Header.Get("Idempotency-Key") == disconnectKey {
			once.Do(func() { close(conflict) })
		}
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	rep := check(t, srv, idemcheck.Config{})
	r6 := rep.Results[5]
	if r6.Status != idemcheck.Pass || r6.Statuses["cut"] != 1 || r6.Statuses["409"] < 1 || !strings.Contains(r6.Evidence, "(+1)") {
		t.Fatalf("check 6: %s %s, statuses %v; want a pass after the cut and at least one 409", r6.Status, r6.Evidence, r6.Statuses)
	}
	if !rep.Passed || o.count() != 3 {
		t.Fatalf("passed %v, %d orders; want a pass and 3 orders", rep.Passed, o.count())
	}
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// rerunServer is idempotent for requests whose client stays, but when the
// client of a running execution goes away it releases the key, and the
// order the execution already wrote stays: the retry runs the operation
// again. Check 6 must fail it.
func rerunServer(t *testing.T) (*httptest.Server, *orders) {
	t.Helper()
	o := &orders{}
	gate := newCutGate()
	type record struct {
		body []byte
		rec  *httptest.ResponseRecorder // nil while in flight
	}
	var mu sync.Mutex
	keys := map[string]*record{}
	post := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		rec, seen := keys[key]
		switch {
		case seen && !bytes.Equal(rec.body, body):
			mu.Unlock()
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		case seen && rec.rec == nil:
			mu.Unlock()
			w.WriteHeader(http.StatusConflict)
			return
		case seen:
			mu.Unlock()
			for k, v := range rec.rec.Header() {
				w.Header()[k] = v
			}
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(rec.rec.Code)
			_, _ = w.Write(rec.rec.Body.Bytes())
			return
		}
		keys[key] = &record{body: body}
		mu.Unlock()
		out := httptest.NewRecorder()
		o.create(out, r)
		if key == disconnectKey && gate.start() {
			// Still working when the client leaves: "nobody to answer",
			// so the key is released; the order is not undone.
			<-r.Context().Done()
		}
		mu.Lock()
		defer mu.Unlock()
		if r.Context().Err() != nil {
			delete(keys, key)
			return
		}
		keys[key].rec = out
		for k, v := range out.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(out.Code)
		_, _ = w.Write(out.Body.Bytes())
	})
	srv := httptest.NewServer(o.mux(gate.wrap(t, post)))
	t.Cleanup(srv.Close)
	return srv, o
}

func TestDisconnectRerunIsCaught(t *testing.T) {
	srv, o := rerunServer(t)
	rep := check(t, srv, idemcheck.Config{})
	for _, r := range rep.Results[:5] {
		if r.Status != idemcheck.Pass {
			t.Errorf("check %d: %s %s; the server is correct there", r.ID, r.Status, r.Evidence)
		}
	}
	r6 := rep.Results[5]
	if r6.Status != idemcheck.Fail || !strings.Contains(r6.Evidence, "ran 2 times") || rep.Passed {
		t.Fatalf("check 6: %s %s; want a failure: the operation ran twice", r6.Status, r6.Evidence)
	}
	if o.count() != 4 {
		t.Fatalf("%d orders, want 4 (the disconnected key's two)", o.count())
	}
}

// An answer that comes before the cut: the disconnect was not tried, and
// the report says so rather than pass check 6.
func TestAnsweredBeforeTheCut(t *testing.T) {
	srv, _ := protectedServer(t)
	rep := check(t, srv, idemcheck.Config{DisconnectAfter: time.Minute})
	r6 := rep.Results[5]
	if r6.Status != idemcheck.Warn || r6.Statuses["201"] != 2 || !strings.Contains(r6.Unproven, "--disconnect-after") {
		t.Fatalf("check 6: %s %s (%s), statuses %v; want a warning naming --disconnect-after", r6.Status, r6.Evidence, r6.Unproven, r6.Statuses)
	}
	if !strings.Contains(strings.Join(rep.NotProven, "\n"), "6. ") {
		t.Fatalf("not proven: %q; want check 6 there", rep.NotProven)
	}
}

// An execution that never ends keeps the retries at 409: check 6 retries
// for InFlightWait, then fails.
func TestStillInFlightFails(t *testing.T) {
	o := &orders{}
	eng, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idemhttp.NewMiddleware(eng, &idemhttp.Config{SharedKeySpace: true})
	if err != nil {
		t.Fatal(err)
	}
	stuck := make(chan struct{})
	gate := newCutGate()
	srv := httptest.NewServer(o.mux(gate.wrap(t, m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idempotency-Key") == disconnectKey && gate.start() {
			<-stuck
		}
		o.create(w, r)
	})))))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stuck) })
	rep := check(t, srv, idemcheck.Config{InFlightWait: 200 * time.Millisecond})
	r6 := rep.Results[5]
	if r6.Status != idemcheck.Fail || !strings.Contains(r6.Evidence, "still 409 after retrying for 200ms") || r6.Statuses["409"] < 2 {
		t.Fatalf("check 6: %s %s, statuses %v", r6.Status, r6.Evidence, r6.Statuses)
	}
}

// releasingServer is idempotent for requests whose client stays (409
// while in flight, replays marked), but when check 6's client goes away
// its middleware releases the key, and the business work goes on and
// commits later: the released execution's order is written only once
// the check has counted after the retry's answer, so that a count taken
// right after the answer cannot see it, and the next one does. With
// conflictFirst, a retry meets the execution in flight (409) before the
// release; without, the key is released before any retry comes. With
// rollback instead, the released execution writes nothing: one order for
// the key, which is correct.
func releasingServer(t *testing.T, conflictFirst, rollback bool) (*httptest.Server, *orders) {
	t.Helper()
	o := &orders{}
	gate := newCutGate()
	type record struct {
		body []byte
		rec  *httptest.ResponseRecorder // nil while in flight
	}
	var (
		mu       sync.Mutex
		keys     = map[string]*record{}
		late     func() // the released execution's commit, once the retry was answered
		armed    bool
		conflict = make(chan struct{})
		once     sync.Once
	)
	release := func(key string, body []byte) {
		mu.Lock()
		defer mu.Unlock()
		delete(keys, key)
		if !rollback {
			late = func() {
				r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader(body))
				o.create(httptest.NewRecorder(), r)
			}
		}
	}
	post := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		rec, seen := keys[key]
		switch {
		case seen && !bytes.Equal(rec.body, body):
			mu.Unlock()
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		case seen && rec.rec == nil:
			mu.Unlock()
			w.WriteHeader(http.StatusConflict)
			if key == disconnectKey {
				once.Do(func() { close(conflict) })
			}
			return
		case seen:
			mu.Unlock()
			for k, v := range rec.rec.Header() {
				w.Header()[k] = v
			}
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(rec.rec.Code)
			_, _ = w.Write(rec.rec.Body.Bytes())
			return
		}
		keys[key] = &record{body: body}
		mu.Unlock()
		if key == disconnectKey && !conflictFirst && gate.wouldStart() {
			// The key is released before any retry is let in.
			release(key, body)
			gate.start()
			return
		}
		if key == disconnectKey && conflictFirst && gate.start() {
			<-r.Context().Done() // the client is gone
			waitFor(t, conflict, "a retry to meet the execution in flight")
			release(key, body)
			return
		}
		out := httptest.NewRecorder()
		o.create(out, r)
		mu.Lock()
		keys[key].rec = out
		if key == disconnectKey && late != nil {
			armed = true // the retry's fresh answer: the next count runs the late commit
		}
		mu.Unlock()
		for k, v := range out.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(out.Code)
		_, _ = w.Write(out.Body.Bytes())
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", gate.wrap(t, post))
	mux.HandleFunc("GET /orders", func(w http.ResponseWriter, r *http.Request) {
		o.listHandler(w, r)
		mu.Lock()
		commit := late
		if !armed {
			commit = nil
		} else {
			late = nil
		}
		mu.Unlock()
		if commit != nil {
			// After the list was written: this count does not see it.
			commit()
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, o
}

// A fresh answer to check 6's retry means that the cut execution did not
// keep its key to the end; its work may still commit after the retry was
// answered. Check 6 counts again until the count settles, and fails on
// the second resource, whether or not a retry met the execution first.
func TestLateCommitAfterAReleaseFails(t *testing.T) {
	for _, c := range []struct {
		name          string
		conflictFirst bool
		want          string
	}{
		{"after a 409", true, "after a 409: the first execution's key was released"},
		{"no 409", false, "did not keep its key to the end"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, o := releasingServer(t, c.conflictFirst, false)
			rep := check(t, srv, idemcheck.Config{})
			for _, r := range rep.Results[:5] {
				if r.Status != idemcheck.Pass {
					t.Errorf("check %d: %s %s; the server is correct there", r.ID, r.Status, r.Evidence)
				}
			}
			r6 := rep.Results[5]
			if r6.Status != idemcheck.Fail || rep.Passed || !strings.Contains(r6.Evidence, c.want) ||
				!strings.Contains(r6.Evidence, "(+2): the operation ran 2 times") || !strings.Contains(r6.Evidence, "3 right after the answer, 4 ") {
				t.Fatalf("check 6: %s %s; want a failure: 3 orders right after the answer, 4 later", r6.Status, r6.Evidence)
			}
			if (r6.Statuses["409"] > 0) != c.conflictFirst {
				t.Fatalf("check 6 statuses %v", r6.Statuses)
			}
			if o.count() != 4 {
				t.Fatalf("%d orders, want 4 (the disconnected key's two)", o.count())
			}
		})
	}
}

// A server that releases the key of a cut execution and rolls its work
// back has one order for the key: check 6 passes once the count has
// stayed the same for Settle, and says why it waited.
func TestReleaseAndRollbackPassesOnceSettled(t *testing.T) {
	srv, o := releasingServer(t, true, true)
	rep := check(t, srv, idemcheck.Config{Settle: 200 * time.Millisecond})
	r6 := rep.Results[5]
	if r6.Status != idemcheck.Pass || !rep.Passed || !strings.Contains(r6.Evidence, "key was released") ||
		!strings.Contains(r6.Evidence, "3 after, unchanged for 200ms (+1)") {
		t.Fatalf("check 6: %s %s; want a pass after the count settled", r6.Status, r6.Evidence)
	}
	if o.count() != 3 {
		t.Fatalf("%d orders, want 3", o.count())
	}
}
