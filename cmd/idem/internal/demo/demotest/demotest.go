// Package demotest drives the demo orders API (internal/demo) in tests,
// in-process or in an `idem serve` process: requests sent one by one or
// duplicates released at the same instant, and the checks that they had
// exactly one effect.
package demotest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/atonce"
)

// GoodOrder is a valid POST /orders body.
const GoodOrder = `{"cart_id":"c_42","total_cents":1900}`

// Order is the JSON of an order.
type Order struct {
	ID         string    `json:"id"`
	CartID     string    `json:"cart_id"`
	TotalCents int64     `json:"total_cents"`
	CreatedAt  time.Time `json:"created_at"`
}

// Same reports whether a and b are the same order.
func (a Order) Same(b Order) bool {
	return a.ID == b.ID && a.CartID == b.CartID && a.TotalCents == b.TotalCents && a.CreatedAt.Equal(b.CreatedAt)
}

// Answer is one HTTP response, read whole.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
	Err    error
}

func (a Answer) String() string {
	if a.Err != nil {
		return "error: " + a.Err.Error()
	}
	return fmt.Sprintf("%d %s %q", a.Status, a.Header.Get("Content-Type"), bytes.TrimSpace(a.Body))
}

// Replayed reports whether the answer is marked Idempotent-Replayed.
func (a Answer) Replayed() bool { return a.Header.Get("Idempotent-Replayed") == "true" }

// Req describes one request to send.
type Req struct {
	Method, URL, Body string
	Key, Auth         string
	// ContentType defaults to application/json when there is a body.
	ContentType string
}

// Build returns the request, carrying ctx.
func (r Req) Build(ctx context.Context) (*http.Request, error) {
	var body io.Reader
	if r.Body != "" {
		body = strings.NewReader(r.Body)
	}
	hr, err := http.NewRequestWithContext(ctx, r.Method, r.URL, body)
	if err != nil {
		return nil, err
	}
	if r.Body != "" {
		ct := r.ContentType
		if ct == "" {
			ct = "application/json"
		}
		hr.Header.Set("Content-Type", ct)
	}
	if r.Key != "" {
		hr.Header.Set("Idempotency-Key", r.Key)
	}
	if r.Auth != "" {
		hr.Header.Set("Authorization", r.Auth)
	}
	return hr, nil
}

// NoRedirects is a client that hands redirects back instead of following
// them.
var NoRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// Send sends r through client and reads the answer.
func Send(client *http.Client, r Req) Answer {
	hr, err := r.Build(context.Background())
	if err != nil {
		return Answer{Err: err}
	}
	return read(client.Do(hr))
}

func read(resp *http.Response, err error) Answer {
	if err != nil {
		return Answer{Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return Answer{Status: resp.StatusCode, Header: resp.Header, Body: body, Err: err}
}

// Do sends r without following redirects and fails t when no answer
// comes.
func Do(t testing.TB, r Req) Answer {
	t.Helper()
	a := Send(NoRedirects, r)
	if a.Err != nil {
		t.Fatalf("%s %s: %v", r.Method, r.URL, a.Err)
	}
	return a
}

// FireTogether sends every request at the same instant: all are built
// first, then released by one barrier (atonce), each on a connection of
// its own.
func FireTogether(reqs []Req) []Answer {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: len(reqs)}}
	defer client.CloseIdleConnections()
	answers := make([]Answer, len(reqs))
	built := make([]*http.Request, len(reqs))
	for i, r := range reqs {
		hr, err := r.Build(context.Background())
		if err != nil {
			answers[i] = Answer{Err: err}
		}
		built[i] = hr
	}
	atonce.Run(len(reqs), func(i int) {
		if built[i] != nil {
			answers[i] = read(client.Do(built[i]))
		}
	})
	return answers
}

// CheckOneEffect checks the answers of duplicates sent together: exactly
// one fresh 201, and every other answer either a byte-identical replay of
// it with Idempotent-Replayed: true, or a 409 problem with Retry-After. It
// returns the fresh answer.
func CheckOneEffect(t testing.TB, answers []Answer) Answer {
	t.Helper()
	var fresh []Answer
	for _, a := range answers {
		if a.Err != nil {
			t.Fatalf("request failed: %v", a.Err)
		}
		if a.Status == http.StatusCreated && !a.Replayed() {
			fresh = append(fresh, a)
		}
	}
	if len(fresh) != 1 {
		t.Fatalf("%d fresh 201 answers, want exactly 1; answers:\n%s", len(fresh), List(answers))
	}
	first := fresh[0]
	replays, conflicts := 0, 0
	for _, a := range answers {
		switch {
		case a.Status == http.StatusCreated && !a.Replayed():
			// the fresh one
		case a.Status == http.StatusCreated:
			replays++
			if !bytes.Equal(a.Body, first.Body) {
				t.Errorf("replay body %q differs from the first answer %q", a.Body, first.Body)
			}
			if a.Header.Get("Location") != first.Header.Get("Location") || a.Header.Get("Content-Type") != first.Header.Get("Content-Type") {
				t.Errorf("replay headers %v differ from the first answer's %v", a.Header, first.Header)
			}
		case a.Status == http.StatusConflict:
			conflicts++
			if ct := a.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("409 with Content-Type %q, want application/problem+json", ct)
			}
			if a.Header.Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After")
			}
		default:
			t.Errorf("unexpected answer %s", a)
		}
	}
	t.Logf("%d requests: 1 fresh 201, %d replays, %d conflicts", len(answers), replays, conflicts)
	return first
}

// List prints answers one per line.
func List(answers []Answer) string {
	var b strings.Builder
	for _, a := range answers {
		fmt.Fprintf(&b, "  %s replayed=%v\n", a, a.Replayed())
	}
	return b.String()
}

// DecodeOrder reads the order in a's body.
func DecodeOrder(t testing.TB, a Answer) Order {
	t.Helper()
	var o Order
	if err := json.Unmarshal(a.Body, &o); err != nil {
		t.Fatalf("order body %q: %v", a.Body, err)
	}
	return o
}

// Problem is an RFC 9457 problem body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// CheckProblem checks that a is an RFC 9457 problem with status and the
// type slug, and returns its detail.
func CheckProblem(t testing.TB, a Answer, status int, slug string) string {
	t.Helper()
	if a.Status != status {
		t.Fatalf("status %d, want %d: %s", a.Status, status, a)
	}
	if ct := a.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json: %s", ct, a)
	}
	var p Problem
	if err := json.Unmarshal(a.Body, &p); err != nil {
		t.Fatalf("problem body %q: %v", a.Body, err)
	}
	if p.Status != status || p.Title == "" || p.Detail == "" {
		t.Errorf("problem %+v: want status %d, a title and a detail", p, status)
	}
	if slug != "" && !strings.HasSuffix(p.Type, "#"+slug) {
		t.Errorf("problem type %q, want the slug %q", p.Type, slug)
	}
	return p.Detail
}

// ListOrders returns the orders GET /orders?cart_id=cartID lists.
func ListOrders(t testing.TB, baseURL, cartID string) []Order {
	t.Helper()
	a := Do(t, Req{Method: "GET", URL: baseURL + "/orders?cart_id=" + cartID})
	var got []Order
	if a.Status != http.StatusOK || json.Unmarshal(a.Body, &got) != nil {
		t.Fatalf("GET /orders?cart_id=%s: %s", cartID, a)
	}
	return got
}
