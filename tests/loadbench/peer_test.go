package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/testenv"
)

type answer struct {
	status int
	header http.Header
	body   []byte
}

func postOrder(t *testing.T, url, key string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(requestBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Header.Del("Date")
	return answer{resp.StatusCode, resp.Header, body}
}

func headerNames(h http.Header) []string {
	var names []string
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// TestPeerAnswersAsIdem checks that the peer's route answers in the shape
// of the idem route, so that the two are compared doing the same work: the
// same headers on a first execution and on a replay, and a replay byte for
// byte the first answer, marked Idempotent-Replayed.
func TestPeerAnswersAsIdem(t *testing.T) {
	ctx := context.Background()
	db, err := openDatabase(ctx, testenv.PostgresURL(t), 4, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer db.close()
	mux, err := newMux(db, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()

	var first, replay [2]answer
	for i, route := range []string{routeIdem, routePeer} {
		key := "shape-" + route
		first[i] = postOrder(t, srv.URL+route, key)
		replay[i] = postOrder(t, srv.URL+route, key)
		if first[i].status != http.StatusCreated || replay[i].status != http.StatusCreated {
			t.Fatalf("%s: statuses %d, %d, want 201 twice", route, first[i].status, replay[i].status)
		}
		if first[i].header.Get(idemhttp.HeaderReplayed) != "" || replay[i].header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Errorf("%s: %s %q then %q, want none then true", route, idemhttp.HeaderReplayed,
				first[i].header.Get(idemhttp.HeaderReplayed), replay[i].header.Get(idemhttp.HeaderReplayed))
		}
		if !bytes.Equal(first[i].body, replay[i].body) {
			t.Errorf("%s: replay %q, first answer %q", route, replay[i].body, first[i].body)
		}
		for _, name := range []string{"Location", "Content-Type", "Content-Length"} {
			if first[i].header.Get(name) != replay[i].header.Get(name) {
				t.Errorf("%s: %s %q on the replay, %q first", route, name, replay[i].header.Get(name), first[i].header.Get(name))
			}
		}
	}
	for j, what := range []string{"first answer", "replay"} {
		a := [2]answer{first[0], first[1]}
		if j == 1 {
			a = [2]answer{replay[0], replay[1]}
		}
		if idem, peer := headerNames(a[0].header), headerNames(a[1].header); !slices.Equal(idem, peer) {
			t.Errorf("%s: idem's headers %q, the peer's %q", what, idem, peer)
		}
	}
}

// TestPeerLease checks the peer's lease: a key in flight is refused with
// 409, a key whose lease ended is taken over and runs, and a key reused
// with another body is refused.
func TestPeerLease(t *testing.T) {
	ctx := context.Background()
	db, err := openDatabase(ctx, testenv.PostgresURL(t), 4, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer db.close()
	mux, err := newMux(db, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// Executions in flight, as a crashed one leaves its key: one within
	// its lease, one after.
	fingerprint := sha256.Sum256(append([]byte("POST "+routePeer+"\n"), requestBody...))
	if _, err := db.pool.Exec(ctx, `INSERT INTO peer_keys (tenant, key, fingerprint, locked_until)
		VALUES ($1, 'held', $2, now() + interval '1 minute'), ($1, 'expired', $2, now() - interval '1 second')`, tenant, fingerprint[:]); err != nil {
		t.Fatal(err)
	}
	if a := postOrder(t, srv.URL+routePeer, "held"); a.status != http.StatusConflict {
		t.Errorf("held key: status %d, want 409", a.status)
	}
	a := postOrder(t, srv.URL+routePeer, "expired")
	if a.status != http.StatusCreated || a.header.Get(idemhttp.HeaderReplayed) != "" {
		t.Errorf("expired lease: status %d, replayed %q, want a first execution", a.status, a.header.Get(idemhttp.HeaderReplayed))
	}
	if r := postOrder(t, srv.URL+routePeer, "expired"); !bytes.Equal(r.body, a.body) || r.header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Errorf("after the takeover: %q replayed %q, want the takeover's answer replayed", r.body, r.header.Get(idemhttp.HeaderReplayed))
	}
	var orders int
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE idem_key = 'expired'`).Scan(&orders); err != nil || orders != 1 {
		t.Errorf("orders of the expired key: %d (%v), want 1", orders, err)
	}

	req, _ := http.NewRequest(http.MethodPost, srv.URL+routePeer, bytes.NewReader([]byte(`{"cart_id":"other","total_cents":1}`)))
	req.Header.Set(idemhttp.HeaderKey, "expired")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("key reused with another body: status %d, want 422", resp.StatusCode)
	}
}
