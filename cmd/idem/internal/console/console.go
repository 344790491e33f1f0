// Package console is the operator console of idem console: server-rendered
// pages (html/template, assets embedded, no script needed) and a JSON API
// over a store that implements idemkeys.Lister, behind one token.
//
// Every page and API call needs the token: pages through a login form that
// sets an HttpOnly, SameSite=Strict cookie (a session that the console
// itself ends after Config.SessionLifetime), the API through
// "Authorization: Bearer TOKEN" (cookies are not accepted there, so the
// API needs no CSRF defence). The forms that change something carry a
// CSRF token and are refused from another origin. Everything a record
// holds came from clients and is escaped by html/template, or encoded as
// JSON. Every action is logged with its reason and who did it.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkeys"
)

//go:embed templates/*.html assets/*
var files embed.FS

// Config configures a Handler.
type Config struct {
	// Store holds the records; it must implement idemkeys.Lister.
	Store idem.Store
	// Token is the secret every page and API call needs. Required.
	Token string
	// Lease is the lease the services give their claims: a lease that
	// ends later than this after its claim has been extended by a
	// heartbeat. Defaults to idem's 90s.
	Lease time.Duration
	// Logger receives the actions. Defaults to slog.Default().
	Logger *slog.Logger
	// SessionLifetime is how long a login lasts. The console refuses a
	// session older than this whatever the browser sends (a cookie copied
	// off a machine, a browser that keeps it): the session's time of
	// issue is in the cookie, under its HMAC. Defaults to 12 hours.
	SessionLifetime time.Duration
}

// Handler serves the console.
type Handler struct {
	store  idem.Store
	lister idemkeys.Lister
	token  string
	lease  time.Duration
	log    *slog.Logger
	pages  map[string]*template.Template
	mux    *http.ServeMux
	// sessionLifetime bounds a session's age; now is the clock it is
	// measured with (a test's, in the tests).
	sessionLifetime time.Duration
	now             func() time.Time
}

// New returns the console's handler.
func New(cfg Config) (*Handler, error) {
	lister, ok := cfg.Store.(idemkeys.Lister)
	if !ok {
		return nil, fmt.Errorf("the store %T cannot list its records", cfg.Store)
	}
	if cfg.Token == "" {
		return nil, errors.New("a token is required")
	}
	h := &Handler{store: cfg.Store, lister: lister, token: cfg.Token, lease: cfg.Lease, log: cfg.Logger,
		sessionLifetime: cfg.SessionLifetime, now: time.Now}
	if h.lease <= 0 {
		h.lease = 90 * time.Second
	}
	if h.sessionLifetime <= 0 {
		h.sessionLifetime = 12 * time.Hour
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.pages = map[string]*template.Template{}
	for _, name := range []string{"login", "overview", "keys", "key", "confirm", "done", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		h.pages[name] = t
	}
	assets, _ := fs.Sub(files, "assets")
	m := http.NewServeMux()
	m.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(assets)))
	m.HandleFunc("GET /login", h.loginPage)
	m.HandleFunc("POST /login", h.login)
	m.HandleFunc("POST /logout", h.page(h.logout))
	m.HandleFunc("GET /{$}", h.page(h.overview))
	m.HandleFunc("GET /keys", h.page(h.keys))
	m.HandleFunc("GET /abandoned", h.page(h.abandoned))
	// One key is named in the query (?tenant=…&key=…), not in the path:
	// a tenant or key is any text a client sent, and as path segments "",
	// "." and ".." do not survive (the mux cleans them away, a browser
	// too). The path forms are kept for the links and scripts written
	// before; they serve the names that survive in a path.
	m.HandleFunc("GET /key", h.page(h.key))
	m.HandleFunc("GET /key/{action}", h.page(h.confirm))
	m.HandleFunc("POST /key/{action}", h.page(h.act))
	m.HandleFunc("GET /keys/{tenant}/{key}", h.page(h.key))
	m.HandleFunc("GET /keys/{tenant}/{key}/{action}", h.page(h.confirm))
	m.HandleFunc("POST /keys/{tenant}/{key}/{action}", h.page(h.act))
	m.HandleFunc("GET /api/keys", h.api(h.apiList))
	m.HandleFunc("GET /api/key", h.api(h.apiKey))
	m.HandleFunc("POST /api/key/{action}", h.api(h.apiAct))
	m.HandleFunc("GET /api/keys/{tenant}/{key}", h.api(h.apiKey))
	m.HandleFunc("POST /api/keys/{tenant}/{key}/{action}", h.api(h.apiAct))
	h.mux = m
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// Nothing on a page may come from elsewhere, and no page may be framed.
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer a browser sends
	// "Origin: null" with the forms, which the CSRF check must refuse.
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cache-Control", "no-store")
	h.mux.ServeHTTP(w, r)
}

const cookieName = "idem_console"

// mac is the HMAC of parts under the token: what a session cookie and a
// CSRF token hold, so that neither is the token itself.
func (h *Handler) mac(parts ...string) string {
	m := hmac.New(sha256.New, []byte(h.token))
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return hex.EncodeToString(m.Sum(nil))
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// session is one login: the operator's name, and when the console let
// them in (Unix seconds, as the cookie holds it).
type session struct {
	name   string
	issued string
}

// cookieValue is what the session cookie of s holds: its time of issue,
// the HMAC of both under the token, and the name last (it may hold any
// character, "|" included).
func (h *Handler) cookieValue(s session) string {
	return url.QueryEscape(s.issued + "|" + h.mac("session", s.issued, s.name) + "|" + s.name)
}

// maxSkew is how far in the future a session's time of issue may be: the
// clock of the console that issued it may run a little ahead (several
// instances behind one address), no further.
const maxSkew = time.Minute

// session returns the operator's session from a valid session cookie: its
// HMAC right, and issued less than the session lifetime ago.
func (h *Handler) session(r *http.Request) (session, bool) {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return session{}, false
	}
	raw, err := url.QueryUnescape(c.Value)
	if err != nil {
		return session{}, false
	}
	issued, rest, ok := strings.Cut(raw, "|")
	sig, name, ok2 := strings.Cut(rest, "|")
	if !ok || !ok2 || !equal(sig, h.mac("session", issued, name)) {
		return session{}, false
	}
	sec, err := strconv.ParseInt(issued, 10, 64)
	if err != nil {
		return session{}, false
	}
	if age := h.now().Sub(time.Unix(sec, 0)); age >= h.sessionLifetime || age < -maxSkew {
		return session{}, false
	}
	return session{name: name, issued: issued}, true
}

// csrf is the CSRF token of the operator's session: another login, even
// under the same name, has another.
func (h *Handler) csrf(s session) string { return h.mac("csrf", s.issued, s.name) }

type ctxKey struct{}

// who is the operator doing a request, as the login or the API named it.
func who(ctx context.Context) string { s, _ := ctx.Value(ctxKey{}).(string); return s }

// page wraps a page handler: without a session, to the login form; a
// POST must carry the session's CSRF token and come from this origin.
func (h *Handler) page(fn http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok := h.session(r)
		if !ok {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			http.Error(w, "log in first", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			if !sameOrigin(r) || !equal(r.PostFormValue("csrf"), h.csrf(s)) {
				http.Error(w, "refused: the form did not come from this console (CSRF check)", http.StatusForbidden)
				return
			}
		}
		fn(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, s.name+" (console, "+r.RemoteAddr+")")))
	}
}

// sameOrigin refuses a request that a browser says another site sent.
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	return true
}

// api wraps an API handler: the Bearer token is required.
func (h *Handler) api(fn http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		tok, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok || !equal(tok, h.token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem console"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong Authorization: Bearer token"})
			return
		}
		op := r.Header.Get("X-Idem-Operator")
		if op == "" {
			op = "api"
		}
		fn(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, op+" (api, "+r.RemoteAddr+")")))
	}
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, "login", map[string]any{"Next": safeNext(r.URL.Query().Get("next"))})
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimSpace(r.PostFormValue("name"))
	if !sameOrigin(r) {
		http.Error(w, "refused: the form did not come from this console", http.StatusForbidden)
		return
	}
	if !equal(r.PostFormValue("token"), h.token) || name == "" || len(name) > 64 {
		h.render(w, r, http.StatusUnauthorized, "login", map[string]any{"Next": safeNext(r.PostFormValue("next")), "Error": "wrong token, or no name given"})
		return
	}
	h.log.Info("idem console: login", slog.String("who", name), slog.String("remote", r.RemoteAddr))
	s := session{name: name, issued: strconv.FormatInt(h.now().Unix(), 10)}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: h.cookieValue(s),
		Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(h.sessionLifetime / time.Second)})
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// safeNext keeps a redirect after the login on this console. Browsers
// drop tabs and newlines from a URL before reading it ("/\t/evil" is
// "//evil" to them), so no control character or space is let through.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsRune(next, '\\') ||
		strings.ContainsFunc(next, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return "/"
	}
	return next
}

// render writes a page; the layout gets the operator's CSRF token.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, data map[string]any) {
	if data == nil {
		data = map[string]any{}
	}
	if s, ok := h.session(r); ok {
		data["Operator"] = s.name
		data["CSRF"] = h.csrf(s)
	}
	var b strings.Builder
	if err := h.pages[name].Execute(&b, data); err != nil {
		h.log.Error("idem console: render", slog.String("page", name), slog.Any("err", err))
		http.Error(w, "the page could not be drawn", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	h.render(w, r, status, "error", map[string]any{"Status": status, "Message": msg})
}

// keyQuery names one key in a query string: whatever bytes tenant and
// key hold come back from it as they were ("", ".", "..", "/", "%2F",
// "?", "#", invalid UTF-8 included).
func keyQuery(tenant, key string) string {
	return url.Values{"tenant": {tenant}, "key": {key}}.Encode()
}

// keyPath is the URL of a key's page.
func keyPath(tenant, key string) string { return "/key?" + keyQuery(tenant, key) }

// actionPath is the URL of an action on a key: its confirmation (GET),
// the action itself (POST).
func actionPath(action, tenant, key string) string {
	return "/key/" + url.PathEscape(action) + "?" + keyQuery(tenant, key)
}

// keyOf returns the key a request names: in its query (/key, /api/key),
// or in its path (the older /keys/{tenant}/{key} forms).
func keyOf(r *http.Request) (tenant, key string) {
	if strings.Contains(r.Pattern, "{key}") {
		return r.PathValue("tenant"), r.PathValue("key")
	}
	q := r.URL.Query()
	return q.Get("tenant"), q.Get("key")
}
