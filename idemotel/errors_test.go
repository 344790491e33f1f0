package idemotel_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemotel"
)

// everyText returns every attribute value of every span ended, and of
// their events.
func (e *otelEnv) everyText() []string {
	var out []string
	for _, s := range e.spans.Ended() {
		for _, a := range s.Attributes() {
			out = append(out, string(a.Key)+"="+a.Value.String())
		}
		for _, ev := range s.Events() {
			for _, a := range ev.Attributes {
				out = append(out, ev.Name+"."+string(a.Key)+"="+a.Value.String())
			}
		}
	}
	return out
}

// TestPanicValueNotExported: a handler that panics with what it read of
// the request (the body, a card number) has its panic exported as its
// type and a fixed text, on the request span and on the operation span
// alike: never the value.
func TestPanicValueNotExported(t *testing.T) {
	e := newOtel(t, sdktrace.AlwaysSample(), idemotel.Config{})
	const secret = "4242424242424242"
	h := serve(t, e.tracer, "acme", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		panic("bad order: " + string(body))
	}))
	if w := post(h, "/orders/1", "k", `{"card":"`+secret+`"}`); w.Code != http.StatusInternalServerError {
		t.Fatalf("panicking handler: %d, want 500", w.Code)
	}
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: e.tracer, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = engine.Do(context.Background(), idem.Operation{Key: "op"}, func(ctx context.Context) (idem.Result, error) {
		panic(errors.New("token " + secret))
	})
	types := map[string]bool{}
	for _, s := range e.spans.Ended() {
		for _, ev := range s.Events() {
			if ev.Name != "exception" {
				continue
			}
			for _, a := range ev.Attributes {
				if a.Key == "exception.type" {
					types[a.Value.AsString()] = true
				}
			}
		}
	}
	if !types["panic(string)"] || !types["panic(*errors.errorString)"] {
		t.Errorf("exception types %v, want the panics' value types", types)
	}
	for _, text := range e.everyText() {
		if strings.Contains(text, secret) || strings.Contains(text, "bad order") {
			t.Errorf("exported: %s", text)
		}
	}
}

// TestControlCharactersEscaped: a tenant (RecordTenant) and an error text
// holding U+009B, which a terminal takes for ESC [, are exported escaped.
func TestControlCharactersEscaped(t *testing.T) {
	e := newOtel(t, sdktrace.AlwaysSample(), idemotel.Config{RecordTenant: true})
	const tenant = "acme\u009b31m"
	h := serve(t, e.tracer, tenant, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	post(h, "/orders/1", "k", "{}")
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: e.tracer, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = engine.Do(context.Background(), idem.Operation{Tenant: tenant, Key: "op"}, func(ctx context.Context) (idem.Result, error) {
		return idem.Result{}, errors.New("declined for \u009b31m" + "tenant")
	})
	var sawTenant, sawError bool
	for _, text := range e.everyText() {
		if strings.Contains(text, "\u009b") {
			t.Errorf("exported raw: %q", text)
		}
		sawTenant = sawTenant || text == `idem.tenant=acme\u009b31m`
		sawError = sawError || strings.Contains(text, `declined for \u009b31m`)
	}
	if !sawTenant || !sawError {
		t.Errorf("escaped tenant exported %v, escaped error %v:\n%q", sawTenant, sawError, e.everyText())
	}
}
