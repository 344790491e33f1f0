package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// userKey is where authenticate leaves the caller it identified.
type userKey struct{}

// authenticate stands for the authentication a real API has in front of
// the middleware: it identifies the caller (here from a toy bearer token)
// and refuses the others, so that TenantFunc only reads what it left.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || user == "" {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

// tenantOfUser is the TenantFunc: each authenticated caller owns its key
// space, so nobody can replay another's answer by sending its key.
func tenantOfUser(r *http.Request) (string, error) {
	user, ok := r.Context().Value(userKey{}).(string)
	if !ok {
		return "", errors.New("no authenticated user")
	}
	return user, nil
}

// The middleware on the in-memory store, behind authentication: the retry
// of a POST is answered from the stored response, and the handler runs
// once.
func Example() {
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		panic(err)
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{TenantFunc: tenantOfUser})
	if err != nil {
		panic(err)
	}
	var orders atomic.Int64
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := orders.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	srv := httptest.NewServer(authenticate(mw.Handler(createOrder)))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set("Authorization", "Bearer alice")
		req.Header.Set(idemhttp.HeaderKey, "8e0f4c1e-order-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Location"), string(body), "replayed:", resp.Header.Get(idemhttp.HeaderReplayed) == "true")
	}
	fmt.Println("orders created:", orders.Load())
	// Output:
	// 201 /orders/1 {"id":1} replayed: false
	// 201 /orders/1 {"id":1} replayed: true
	// orders created: 1
}

// A key reused for another request is refused with a problem; the same
// key sent by another caller names another operation.
func Example_fingerprintMismatch() {
	engine, _ := idem.NewEngine(idemmem.NewStore(nil), nil)
	mw, _ := idemhttp.NewMiddleware(engine, &idemhttp.Config{TenantFunc: tenantOfUser})
	h := authenticate(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	for _, call := range []struct{ user, body string }{
		{"alice", `{"sku":"tea"}`},
		{"alice", `{"sku":"coffee"}`},
		{"bob", `{"sku":"coffee"}`},
	} {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(call.body))
		r.Header.Set("Authorization", "Bearer "+call.user)
		r.Header.Set(idemhttp.HeaderKey, "k-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%s: %d %q\n", call.user, w.Code, w.Header().Get("Content-Type"))
	}
	// Output:
	// alice: 201 ""
	// alice: 422 "application/problem+json"
	// bob: 201 ""
}

// In reference mode the store keeps the id of what the handler created,
// and replays are rebuilt from it.
func ExampleSetReference() {
	engine, _ := idem.NewEngine(idemmem.NewStore(nil), nil)
	mw, _ := idemhttp.NewMiddleware(engine, &idemhttp.Config{
		TenantFunc: tenantOfUser,
		Mode:       idem.ModeReference,
		ReplayFunc: func(w http.ResponseWriter, r *http.Request, res idem.Result) {
			// A real service would load the order from its database.
			w.Header().Set("Location", "/orders/"+res.Reference)
			w.WriteHeader(res.Status)
			fmt.Fprintf(w, `{"id":%q}`, res.Reference)
		},
	})
	h := authenticate(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		idemhttp.SetReference(r.Context(), "ord_7")
		w.Header().Set("Location", "/orders/ord_7")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"ord_7"}`)
	})))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
		r.Header.Set("Authorization", "Bearer alice")
		r.Header.Set(idemhttp.HeaderKey, "k-2")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get(idemhttp.HeaderReplayed) == "true")
	}
	// Output:
	// 201 {"id":"ord_7"} replayed: false
	// 201 {"id":"ord_7"} replayed: true
}

// ParseKey accepts the bare and the RFC 8941 string forms.
func ExampleParseKey() {
	for _, v := range []string{`abc-123`, `"abc-123"`, `abc, def`} {
		key, err := idemhttp.ParseKey(http.Header{idemhttp.HeaderKey: {v}})
		fmt.Printf("%q %v\n", key, err != nil)
	}
	// Output:
	// "abc-123" false
	// "abc-123" false
	// "" true
}
