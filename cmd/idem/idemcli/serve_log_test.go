package idemcli

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeLogsEveryRequest: every request gets its log line, the
// router's own answers included: the 307 that cleans POST //orders was
// once answered by a mux in front of the demo's logger, and never logged.
func TestServeLogsEveryRequest(t *testing.T) {
	p := startServe(t, "idem serve", "--db", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, target := range []string{"//orders", "/nowhere"} {
		req, _ := http.NewRequest(http.MethodPost, p.url+target, strings.NewReader(`{}`))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for _, want := range []string{"path=//orders status=307", "path=/nowhere status=404"} {
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(p.log(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("no log line with %q:\n%s", want, p.log())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
