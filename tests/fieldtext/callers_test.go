package fieldtext_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
)

// The callers of fieldtext, on a real store (SQLite, whose records go
// through idemcodec.MarshalHeader and idemcodec.UnmarshalHeader): a C1 control or
// DEL never reaches a stored header value, and a stored one is refused.

func sqliteStore(t *testing.T) *idemsql.Store {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := idemmigrate.Migrate(context.Background(), db, idemmigrate.SQLite); err != nil {
		t.Fatal(err)
	}
	return testenv.Must(idemsql.NewStore(db, idemsql.SQLite))
}

func TestHeaderRefusesC1AndDEL(t *testing.T) {
	for _, v := range []string{"a\u009bb", "a\u009db", "a\u0085b", "a\x7fb", "a\x1bb"} {
		h := map[string][]string{"Location": {v}}
		if _, err := idemcodec.MarshalHeader(h); err == nil {
			t.Errorf("MarshalHeader accepts %q", v)
		}
		raw := []byte(`{"Location":["` + strings.ReplaceAll(strings.ReplaceAll(v, "\x7f", `\u007f`), "\x1b", `\u001b`) + `"]}`)
		if _, err := idemcodec.UnmarshalHeader(raw); err == nil {
			t.Errorf("UnmarshalHeader accepts %s", raw)
		}
	}
	if _, err := idemcodec.MarshalHeader(map[string][]string{"Location": {"/orders/é\u00a0x\ty"}}); err != nil {
		t.Errorf("MarshalHeader refuses printable text: %v", err)
	}
}

// A handler's header value holding C1 controls is stored (and replayed)
// with each one as a space, the rule for C0: the answer is stored, not
// refused.
func TestMiddlewareSpacesC1(t *testing.T) {
	store := sqliteStore(t)
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/orders/1\u009b31m\u009d0;x\x7f")
		w.WriteHeader(http.StatusCreated)
	}))
	send := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("{}"))
		r.Header.Set("Idempotency-Key", "k1")
		h.ServeHTTP(rec, r)
		return rec
	}
	if first := send(); first.Code != http.StatusCreated {
		t.Fatalf("first answer %d %q", first.Code, first.Body)
	}
	rec, err := store.Get(context.Background(), "", "k1")
	if err != nil {
		t.Fatal(err)
	}
	const want = "/orders/1 31m 0;x "
	if got := rec.Result.Header["Location"]; len(got) != 1 || got[0] != want {
		t.Fatalf("stored Location %q, want %q", got, want)
	}
	replay := send()
	if replay.Header().Get("Idempotent-Replayed") != "true" || replay.Header().Get("Location") != want {
		t.Fatalf("replay %d, Location %q, want the stored %q", replay.Code, replay.Header().Get("Location"), want)
	}
}

// A poison message's subject and error are stored escaped, C1 included,
// so that the record can be written and read back.
func TestInboxEscapesC1(t *testing.T) {
	store := sqliteStore(t)
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: "c", MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	msg := ideminbox.Message{ID: "m1", Attempt: 1, Subject: "orders.\u009b2J", Data: []byte("x")}
	d, err := in.Process(context.Background(), msg, func(ctx context.Context) error {
		return errors.New("bad \u009d0;title")
	})
	if d.Action != ideminbox.AckPoison {
		t.Fatalf("Process = %+v, %v; want ack-poison", d, err)
	}
	st, err := in.Status(context.Background(), "m1")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != ideminbox.StatePoison || st.Subject != `orders.\u009b2J` || !strings.Contains(st.Error, `bad \u009d0;title`) {
		t.Fatalf("Status = %+v; want poison with the subject and error escaped", st)
	}
}
