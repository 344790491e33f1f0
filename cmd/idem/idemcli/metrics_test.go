package idemcli

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
	"github.com/idem-go/idem/internal/obsload"
)

// scrape reads GET url in the Prometheus text format: every sample by its
// name and labels as written ("idem_requests_total{method=\"POST\",…}").
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	a := Do(t, Req{Method: "GET", URL: url})
	if a.Status != http.StatusOK || !strings.HasPrefix(a.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET %s: %s", url, a)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(a.Body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestServeMetrics sends a known workload to `idem serve` and reads
// GET /metrics on --metrics-addr: every count is what the client saw.
func TestServeMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	p := startServe(t, "idem serve", "--db", "sqlite:"+path, "--metrics-addr", "127.0.0.1:0")
	found := metricsAddr.FindStringSubmatch(p.log())
	if found == nil {
		t.Fatalf("no metrics listening line:\n%s", p.log())
	}
	w := &obsload.Workload{Fresh: 5, Replays: 4, Prefix: "metrics"}
	n := w.Run(t, func(key, body string) (int, bool) {
		a := Do(t, Req{Method: "POST", URL: p.url + "/orders", Body: body, Key: key})
		return a.Status, a.Replayed()
	})
	// Without a key the request passes through; a GET is no covered
	// method and is not counted.
	if a := Do(t, Req{Method: "POST", URL: p.url + "/orders", Body: GoodOrder}); a.Status != http.StatusCreated {
		t.Fatalf("POST without key: %s", a)
	}
	Do(t, Req{Method: "GET", URL: p.url + "/orders?cart_id=c_1"})

	m := scrape(t, "http://"+found[1]+"/metrics")
	req := func(outcome string) string {
		return `idem_requests_total{method="POST",outcome="` + outcome + `",route="/orders"}`
	}
	call := func(op string) string {
		return `idem_store_operation_duration_seconds_count{operation="` + op + `",result="ok",store="sqlite"}`
	}
	for name, want := range map[string]float64{
		req("executed"):             float64(n.Executed),
		req("replayed"):             float64(n.Replayed),
		req("fingerprint_mismatch"): float64(n.FingerprintMismatch),
		req("passthrough"):          1,
		req("in_flight"):            0,
		call("claim"):               float64(n.Claims),
		call("complete"):            float64(n.Completions),
		`idem_operations_total{outcome="executed",store="sqlite"}`:                  float64(n.Executed),
		`idem_execution_duration_seconds_count{outcome="executed",route="/orders"}`: float64(n.Executed),
		`idem_stored_response_bytes_count`:                                          float64(n.Executed),
		`idem_replay_age_seconds_count`:                                             float64(n.Replayed),
		`idem_in_flight`:                                                            0,
	} {
		if got, ok := m[name]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	if _, ok := m["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}
	if n.Executed != 5 || n.Replayed != 4 || n.FingerprintMismatch != 1 {
		t.Fatalf("workload: %+v", n)
	}
	p.stop()
}

var metricsAddr = regexp.MustCompile(`msg="metrics listening" addr=(\S+)`)

// TestServeMetricsAddr: with --metrics-addr, GET /metrics is served
// there, and the API's address no longer answers it.
func TestServeMetricsAddr(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	p := startServe(t, "idem serve", "--db", "sqlite:"+path, "--metrics-addr", "127.0.0.1:0", "--purge-interval", "20ms")
	found := metricsAddr.FindStringSubmatch(p.log())
	if found == nil {
		t.Fatalf("no metrics listening line:\n%s", p.log())
	}
	if a := Do(t, Req{Method: "GET", URL: p.url + "/metrics"}); a.Status != http.StatusNotFound {
		t.Fatalf("GET /metrics on the API: %s, want the API's 404", a)
	}
	// The janitor's passes are counted: wait for the first one.
	for i := 0; ; i++ {
		m := scrape(t, "http://"+found[1]+"/metrics")
		if m[`idem_purge_passes_total{result="ok"}`] > 0 {
			break
		}
		if i == 500 {
			t.Fatalf("no purge pass counted:\n%v", m)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.stop()
}

// TestServeNoMetricsByDefault: without --metrics-addr, GET /metrics on
// the API's address is the API's own 404: no client of the API reads the
// other tenants' traffic there.
func TestServeNoMetricsByDefault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	p := startServe(t, "idem serve", "--db", "sqlite:"+path)
	if a := Do(t, Req{Method: "GET", URL: p.url + "/metrics"}); a.Status != http.StatusNotFound || strings.Contains(string(a.Body), "idem_") {
		t.Fatalf("GET /metrics on the API: %s, want the API's 404", a)
	}
	if strings.Contains(p.log(), "metrics listening") {
		t.Fatalf("metrics served without --metrics-addr:\n%s", p.log())
	}
	p.stop()
}

// TestServeMetricsListenerTimeouts: the --metrics-addr listener closes a
// connection that stalls in its request's body, and one left idle after
// an answer, as the API's does.
func TestServeMetricsListenerTimeouts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	p := startServe(t, "idem serve", "--db", "sqlite:"+path, "--metrics-addr", "127.0.0.1:0",
		"--read-timeout", "200ms", "--idle-timeout", "200ms")
	found := metricsAddr.FindStringSubmatch(p.log())
	if found == nil {
		t.Fatalf("no metrics listening line:\n%s", p.log())
	}
	// closed reports whether the server closes c: a read that ends with
	// EOF or a reset. The deadline only keeps a failing test from
	// hanging: without timeouts the server would keep c for ever.
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
	stalled, err := net.Dial("tcp", found[1])
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	// Headers whole, the body announced and never sent: past the header
	// timeout, only a read timeout ends it.
	if _, err := stalled.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	if !closed(stalled) {
		t.Error("a connection stalled in its request's body is still open after a minute")
	}
	idle, err := net.Dial("tcp", found[1])
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := idle.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %v, %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !closed(idle) {
		t.Error("an idle kept-alive connection is still open after a minute")
	}
	p.stop()
}
