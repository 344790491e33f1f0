package idemhttptest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// CheckProblemTexts checks that the problems that tell a client what
// became of the work it asked for are true for the store newStore returns:
// "rolled back" on a transactional one (idem.StoreInfo.Transactional);
// "cannot roll work back", its effects standing, on one without
// transactions. A client deciding whether to retry must not be told that
// work was undone when it stands. Each failure (a panic, a cancelled
// request, a completion that fails, an answer too large) gets a store of
// its own.
func CheckProblemTexts(t *testing.T, newStore func(t *testing.T) idem.Store) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	for _, f := range []struct {
		slug   string
		status int
		config idemhttp.Config
		fail   func(w http.ResponseWriter, cancel func())
	}{
		{"handler-panic", 500, idemhttp.Config{}, func(http.ResponseWriter, func()) { panic("boom") }},
		{"request-cancelled", 500, idemhttp.Config{CancelOnDisconnect: true}, func(w http.ResponseWriter, cancel func()) {
			cancel()
			w.WriteHeader(http.StatusCreated)
		}},
		{"store-unavailable", 503, idemhttp.Config{}, func(w http.ResponseWriter, _ func()) { w.WriteHeader(http.StatusCreated) }},
		{"response-too-large", 500, idemhttp.Config{MaxResponseBody: 10}, func(w http.ResponseWriter, _ func()) {
			io.WriteString(w, "more than ten bytes") //nolint:errcheck // refused by the recorder, as the case wants
		}},
	} {
		t.Run(f.slug, func(t *testing.T) {
			store := newStore(t)
			transactional := store.Info().Transactional
			if f.slug == "store-unavailable" {
				store = completeFails{store}
			}
			engine, err := idem.NewEngine(store, &idem.Config{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = engine.Close(context.Background()) })
			cfg := f.config
			cfg.SharedKeySpace, cfg.Logger = true, quiet
			m, err := idemhttp.NewMiddleware(engine, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.fail(w, cancel) }))
			r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders", strings.NewReader("a"))
			r.Header.Set(idemhttp.HeaderKey, "problem-texts-"+f.slug)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			var p struct{ Type, Detail string }
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != f.status || p.Type != idemhttp.ProblemTypeBase+f.slug {
				t.Fatalf("answered %d %s, want the problem %s with status %d", w.Code, w.Body, f.slug, f.status)
			}
			switch {
			case transactional && (!strings.Contains(p.Detail, "rolled back") || strings.Contains(p.Detail, "cannot roll")):
				t.Fatalf("detail %q: want it to say the work was rolled back", p.Detail)
			case !transactional && (strings.Contains(p.Detail, "rolled back") || !strings.Contains(p.Detail, "cannot roll work back")):
				t.Fatalf("detail %q: want it to say the work stands", p.Detail)
			}
		})
	}
}

// completeFails is a store whose completions fail, as when the store goes
// away while the handler runs.
type completeFails struct{ idem.Store }

func (s completeFails) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	u, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return failingUnit{u}, nil
}

type failingUnit struct{ idem.UnitOfWork }

func (u failingUnit) Complete(ctx context.Context, _ idem.CompleteParams) error {
	_ = u.UnitOfWork.Rollback(ctx)
	return errors.New("idemhttptest: connection lost")
}
