package idemcheck_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/idemcheck"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = idemcheck.Main(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// line returns the report line of check id.
func line(t *testing.T, out string, id string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == id+"." {
			return l
		}
	}
	t.Fatalf("no line for check %s in:\n%s", id, out)
	return ""
}

func TestNaiveServerIsCaught(t *testing.T) {
	srv, o := naiveServer(t)
	code, out, errOut := run(t, "-d", orderBody, "--count-url", srv.URL+"/orders?cart_id=c_42", srv.URL+"/orders")
	t.Logf("report:\n%s%s", out, errOut)
	if code != idemcheck.ExitFail {
		t.Fatalf("exit code %d, want %d", code, idemcheck.ExitFail)
	}
	if o.count() < 4 {
		t.Fatalf("the naive server created only %d orders for 3 keys: the race did not happen, the test proves nothing", o.count())
	}
	if l := line(t, out, "1"); !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, "duplicates") {
		t.Errorf("check 1 not failed with duplicates: %s", l)
	}
	if l := line(t, out, "5"); !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, "duplicates") {
		t.Errorf("check 5 not failed with duplicates: %s", l)
	}
	if !strings.Contains(out, "\nFAIL: ") {
		t.Errorf("no FAIL verdict in:\n%s", out)
	}
}

func TestProtectedServerPasses(t *testing.T) {
	srv, o := protectedServer(t)
	code, out, errOut := run(t, "-d", orderBody, "--count-url", srv.URL+"/orders?cart_id=c_42", srv.URL+"/orders")
	t.Logf("report:\n%s%s", out, errOut)
	if code != idemcheck.ExitPass {
		t.Fatalf("exit code %d, want %d", code, idemcheck.ExitPass)
	}
	for _, id := range []string{"1", "2", "3", "4", "5", "6"} {
		if l := line(t, out, id); !strings.HasPrefix(l, "PASS") {
			t.Errorf("check %s: %s", id, l)
		}
	}
	if o.count() != 3 {
		t.Errorf("%d orders created, want 3 (one per key)", o.count())
	}
	if errOut != "" {
		t.Errorf("stderr %q, want nothing", errOut)
	}
}

func TestJSONReport(t *testing.T) {
	srv, _ := protectedServer(t)
	code, out, _ := run(t, "--json", "-n", "5", "-d", orderBody, "--count-url", srv.URL+"/orders?cart_id=c_42", srv.URL+"/orders")
	var rep idemcheck.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON (%v):\n%s", err, out)
	}
	if code != 0 || !rep.Passed || len(rep.Results) != 6 || rep.Concurrency != 5 || len(rep.Proven) != 6 || len(rep.NotProven) != 0 {
		t.Fatalf("code %d, report %+v", code, rep)
	}
	if rep.Results[0].Statuses["201"] < 1 {
		t.Errorf("check 1 statuses %v: no 201 counted", rep.Results[0].Statuses)
	}

	// Without --count-url: checks 5 and 6 skipped, nothing passes.
	code, out, _ = run(t, "--json", "-n", "5", "-d", orderBody, srv.URL+"/orders")
	rep = idemcheck.Report{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON (%v):\n%s", err, out)
	}
	if code != idemcheck.ExitFail || rep.Passed || rep.Results[4].Status != idemcheck.Skip || rep.Results[5].Status != idemcheck.Skip ||
		len(rep.NotProven) != 3 || !strings.Contains(rep.NotProven[0], "--count-url") {
		t.Fatalf("without --count-url: code %d, report %+v", code, rep)
	}
}

func TestUnreachableIsOneLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	code, out, errOut := run(t, "-n", "3", "http://"+addr+"/orders")
	if code != idemcheck.ExitUsage || out != "" {
		t.Fatalf("exit %d, stdout %q; want %d and nothing", code, out, idemcheck.ExitUsage)
	}
	if strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "cannot reach") {
		t.Fatalf("stderr %q, want one line saying it cannot reach the URL", errOut)
	}
}

func TestBadFlagsAreOneLine(t *testing.T) {
	cases := map[string][]string{
		"unknown flag": {"--nope", "http://127.0.0.1:1/x"},
		"no URL":       {"-d", "x"},
		"two URLs":     {"http://127.0.0.1:1/a", "http://127.0.0.1:1/b"},
		"bad scheme":   {"ftp://127.0.0.1/x"},
		"n too small":  {"-n", "1", "http://127.0.0.1:1/x"},
		"bad header":   {"-H", "no colon", "http://127.0.0.1:1/x"},
		"own key":      {"-H", "Idempotency-Key: k", "http://127.0.0.1:1/x"},
		"bad duration": {"--load", "--duration", "soon", "http://127.0.0.1:1/x"},
		"settle zero":  {"--settle", "0", "http://127.0.0.1:1/x"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := run(t, args...)
			if code != idemcheck.ExitUsage || out != "" {
				t.Fatalf("exit %d, stdout %q; want %d and nothing", code, out, idemcheck.ExitUsage)
			}
			if strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "idem check: ") {
				t.Fatalf("stderr %q, want one line", errOut)
			}
		})
	}
}

func TestFlagsAfterURL(t *testing.T) {
	srv, o := protectedServer(t)
	code, out, errOut := run(t, srv.URL+"/orders", "-n", "4", "-d", orderBody, "--count-url", srv.URL+"/orders")
	if code != 0 {
		t.Fatalf("exit %d:\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "(4 requests at once)") || o.count() != 3 {
		t.Fatalf("flags after the URL were not applied (orders %d):\n%s", o.count(), out)
	}
}

// --help lists the flags as every other idem command does: --name for a
// long one (one-letter ones keep curl's -d, -H, -X, -n).
func TestHelp(t *testing.T) {
	code, out, _ := run(t, "--help")
	if code != 0 {
		t.Fatalf("exit %d, usage:\n%s", code, out)
	}
	for _, want := range []string{"\n  --count-url URL\n", "\n  --load\n", "\n  --disconnect-after duration\n", "\n  -d body\n", "\n  -H header\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "-") && !strings.HasPrefix(f[0], "--") && len(f[0]) > 2 {
			t.Errorf("long flag listed with one dash: %q", l)
		}
	}
	// Errors name long flags the same way.
	_, _, errOut := run(t, "--nope", "http://127.0.0.1:1/x")
	if !strings.Contains(errOut, "--nope") {
		t.Errorf("error %q names the flag with one dash", errOut)
	}
}

// variant is a small idempotent server whose flaws can be switched on, to
// see that each check notices its own flaw.
type variant struct {
	unmarkedReplays  bool // replays without Idempotent-Replayed
	mismatchStatus   int  // answer to a key reused with another body; 0 replays anyway
	sameBodyEachTime bool // no dedup at all, and answers that name no resource
}

func variantServer(t *testing.T, v variant) *httptest.Server {
	t.Helper()
	o := &orders{}
	type entry struct {
		body []byte
		done bool
		rec  *httptest.ResponseRecorder
	}
	var mu sync.Mutex
	keys := map[string]*entry{}
	write := func(w http.ResponseWriter, rec *httptest.ResponseRecorder, replay bool) {
		for k, vs := range rec.Header() {
			w.Header()[k] = vs
		}
		if replay && !v.unmarkedReplays {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}
	post := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if v.sameBodyEachTime {
			rec := httptest.NewRecorder()
			o.create(rec, r)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"status":"created"}`))
			return
		}
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		e := keys[key]
		if e == nil { // claim and check in one critical section
			e = &entry{body: body}
			keys[key] = e
			mu.Unlock()
			rec := httptest.NewRecorder()
			o.create(rec, r)
			mu.Lock()
			e.rec, e.done = rec, true
			mu.Unlock()
			write(w, rec, false)
			return
		}
		defer mu.Unlock()
		switch {
		case !bytes.Equal(e.body, body) && v.mismatchStatus != 0:
			w.WriteHeader(v.mismatchStatus)
		case !e.done:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
		default:
			write(w, e.rec, true)
		}
	})
	srv := httptest.NewServer(o.mux(post))
	t.Cleanup(srv.Close)
	return srv
}

func TestEachFlawIsReported(t *testing.T) {
	cases := []struct {
		name    string
		v       variant
		code    int
		want    map[int]idemcheck.Status
		evident string
	}{
		{"correct", variant{mismatchStatus: 422}, 0,
			map[int]idemcheck.Status{1: idemcheck.Pass, 2: idemcheck.Pass, 3: idemcheck.Pass, 4: idemcheck.Pass, 5: idemcheck.Pass}, ""},
		{"fingerprint ignored", variant{}, 1,
			map[int]idemcheck.Status{1: idemcheck.Pass, 3: idemcheck.Fail}, "answer of another request"},
		{"mismatch answered 400", variant{mismatchStatus: 400}, 0,
			map[int]idemcheck.Status{3: idemcheck.Warn}, "422 is the expected status"},
		{"replays not marked", variant{mismatchStatus: 422, unmarkedReplays: true}, 0,
			map[int]idemcheck.Status{2: idemcheck.Warn, 5: idemcheck.Pass}, "not marked"},
		{"no dedup, identical answers", variant{sameBodyEachTime: true}, 1,
			map[int]idemcheck.Status{1: idemcheck.Fail, 4: idemcheck.Warn, 5: idemcheck.Fail, 6: idemcheck.Fail}, "duplicates"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := variantServer(t, c.v)
			rep, err := idemcheck.Check(context.Background(), idemcheck.Config{
				URL: srv.URL + "/orders", Body: []byte(orderBody), Concurrency: 8,
				Settle:   200 * time.Millisecond, // the count of an unmarked retry settles
				Header:   http.Header{"Content-Type": {"application/json"}},
				CountURL: srv.URL + "/orders?cart_id=c_42",
			})
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			idemcheck.WriteReport(&text, rep)
			t.Logf("report:\n%s", text.String())
			if rep.Passed != (c.code == 0) {
				t.Errorf("Passed = %v", rep.Passed)
			}
			for id, st := range c.want {
				if got := rep.Results[id-1].Status; got != st {
					t.Errorf("check %d: %s, want %s", id, got, st)
				}
			}
			if !strings.Contains(text.String(), c.evident) {
				t.Errorf("report does not say %q", c.evident)
			}
		})
	}
}

func TestBodyFromFile(t *testing.T) {
	srv, o := protectedServer(t)
	path := filepath.Join(t.TempDir(), "order.json")
	if err := os.WriteFile(path, []byte(orderBody), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "-n", "3", "-d", "@"+path, "--count-url", srv.URL+"/orders", srv.URL+"/orders")
	if code != 0 || o.count() != 3 {
		t.Fatalf("exit %d, %d orders:\n%s%s", code, o.count(), out, errOut)
	}
	code, _, errOut = run(t, "-d", "@"+path+".missing", srv.URL+"/orders")
	if code != idemcheck.ExitUsage || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("missing file: exit %d, stderr %q", code, errOut)
	}
}
