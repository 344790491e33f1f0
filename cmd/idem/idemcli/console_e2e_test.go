package idemcli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
)

const consoleToken = "console-test-token-0123456789"

var consoleAddr = regexp.MustCompile(`msg="console listening" addr=(\S+)`)

// startConsole starts `idem console` on a free loopback port and returns
// its base URL.
func startConsole(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(idemBinary(t), append([]string{"console", "--addr", "127.0.0.1:0", "--token", consoleToken}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs strings.Builder
	addr := make(chan string, 1)
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			logs.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := consoleAddr.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
		cmd.Wait() //nolint:errcheck // killed at cleanup
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // may have exited
		<-exited
		if t.Failed() {
			mu.Lock()
			t.Logf("idem console logs:\n%s", logs.String())
			mu.Unlock()
		}
	})
	select {
	case a := <-addr:
		return "http://" + a
	case <-exited:
		t.Fatalf("idem console exited before listening:\n%s", logs.String())
	case <-time.After(2 * time.Minute):
		t.Fatal("idem console did not listen within 2 minutes")
	}
	return ""
}

// apiKey is what the console's API says of one key.
type apiKey struct {
	Tenant     string `json:"tenant"`
	Key        string `json:"key"`
	Status     string `json:"status"`
	LeaseToken string `json:"lease_token"`
}

// consoleAPI calls the console's API with the token (or without, when
// token is empty) and decodes the answer into v.
func consoleAPI(t *testing.T, method, u, token, body string, v any) int {
	t.Helper()
	var req *http.Request
	var err error
	if body != "" {
		req, err = http.NewRequest(method, u, strings.NewReader(body))
	} else {
		req, err = http.NewRequest(method, u, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("%s %s: %d, body not JSON: %v", method, u, resp.StatusCode, err)
		}
	}
	return resp.StatusCode
}

// listed returns the keys the API lists in state under the demo's tenant.
func listed(t *testing.T, base, state string) []string {
	t.Helper()
	var page struct {
		Keys []apiKey `json:"keys"`
	}
	q := url.Values{"state": {state}, "tenant": {defaultTenant}, "limit": {"100"}}
	if code := consoleAPI(t, "GET", base+"/api/keys?"+q.Encode(), consoleToken, "", &page); code != http.StatusOK {
		t.Fatalf("GET /api/keys?%s: %d", q.Encode(), code)
	}
	var keys []string
	for _, k := range page.Keys {
		if k.Status != state {
			t.Errorf("GET /api/keys?state=%s listed %q as %s", state, k.Key, k.Status)
		}
		keys = append(keys, k.Key)
	}
	return keys
}

// waitListed polls until key is listed in state.
func waitListed(t *testing.T, base, state, key string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !slices.Contains(listed(t, base, state), key) {
		if time.Now().After(deadline) {
			t.Fatalf("%q never listed as %s; %s lists %q", key, state, state, listed(t, base, state))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestConsoleAPIAgainstServe drives the console's API from outside against
// `idem serve` processes on one database: a request in flight is listed as
// in flight; after a kill -9 of its server, a retry gets 409 until the key
// is released through the API, then runs at once; a key whose holder died
// is listed as abandoned once its lease ends; without the token, 401.
func TestConsoleAPIAgainstServe(t *testing.T) {
	for _, kind := range []struct {
		name string
		db   func(*testing.T) string
	}{{"sqlite", sqliteDB}, {"postgres", postgresDB}} {
		t.Run(kind.name, func(t *testing.T) {
			db := kind.db(t)
			// The holders: handlers that sleep until they are killed, one
			// under the default lease (released by the operator before it
			// ends), one under a short lease (left to end: abandoned).
			holder := startServe(t, "idem serve (holder)", "--db", db, "--handler-delay", "10m")
			shortHolder := startServe(t, "idem serve (short lease)", "--db", db, "--handler-delay", "10m", "--lease", "2s")
			base := startConsole(t, "--db", db)

			if code := consoleAPI(t, "GET", base+"/api/keys", "", "", nil); code != http.StatusUnauthorized {
				t.Fatalf("GET /api/keys without the token: %d, want 401", code)
			}
			if code := consoleAPI(t, "GET", base+"/api/keys", "wrong-token", "", nil); code != http.StatusUnauthorized {
				t.Fatalf("GET /api/keys with a wrong token: %d, want 401", code)
			}

			stuck := "console-stuck-" + kind.name
			dead := "console-dead-" + kind.name
			go Send(http.DefaultClient, Req{Method: "POST", URL: holder.url + "/orders", Body: GoodOrder, Key: stuck})
			go Send(http.DefaultClient, Req{Method: "POST", URL: shortHolder.url + "/orders", Body: GoodOrder, Key: dead})
			waitListed(t, base, "in_flight", stuck)
			waitListed(t, base, "in_flight", dead)

			// A crash: no release, no rollback message, nothing.
			for _, p := range []*proc{holder, shortHolder} {
				if err := p.cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				<-p.exited
			}
			retrier := startServe(t, "idem serve (retries)", "--db", db)
			retry := Req{Method: "POST", URL: retrier.url + "/orders", Body: GoodOrder, Key: stuck}
			if a := Do(t, retry); a.Status != http.StatusConflict {
				t.Fatalf("retry before the release: %s, want 409 (the dead holder's lease runs 90s)", a)
			}
			var key apiKey
			query := "?" + url.Values{"tenant": {defaultTenant}, "key": {stuck}}.Encode()
			path, release := base+"/api/key"+query, base+"/api/key/release"+query
			if code := consoleAPI(t, "GET", path, consoleToken, "", &key); code != http.StatusOK || key.Status != "in_flight" {
				t.Fatalf("GET %s: %d %+v, want in_flight", path, code, key)
			}
			if code := consoleAPI(t, "POST", release, "", `{"reason":"holder killed"}`, nil); code != http.StatusUnauthorized {
				t.Fatalf("release without the token: %d, want 401", code)
			}
			var res map[string]string
			if code := consoleAPI(t, "POST", release, consoleToken, `{"reason":""}`, &res); code != http.StatusBadRequest {
				t.Fatalf("release without a reason: %d %v, want 400", code, res)
			}
			body := fmt.Sprintf(`{"reason":"holder pod killed -9","lease_token":%q}`, key.LeaseToken)
			if code := consoleAPI(t, "POST", release, consoleToken, body, &res); code != http.StatusOK {
				t.Fatalf("release: %d %v", code, res)
			}
			a := Do(t, retry)
			if a.Status != http.StatusCreated || a.Replayed() {
				t.Fatalf("retry after the release: %s replayed=%v, want 201 run afresh", a, a.Replayed())
			}
			if code := consoleAPI(t, "GET", path, consoleToken, "", &key); code != http.StatusOK || key.Status != "complete" {
				t.Fatalf("GET %s after the retry: %d %+v, want complete", path, code, key)
			}

			waitListed(t, base, "abandoned", dead)
			if slices.Contains(listed(t, base, "in_flight"), dead) {
				t.Errorf("%q listed in flight after its lease ended", dead)
			}
		})
	}
}
