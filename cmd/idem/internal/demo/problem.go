package demo

import (
	"encoding/json"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// problemBase prefixes the type URI of the demo's own problems; the
// fragment is the slug listed in docs/DEMO.md. The idempotency layer's
// problems (409, 422, …) have their own, in docs/PROBLEMS.md.
const problemBase = "https://github.com/idem-go/idem/blob/main/docs/DEMO.md#"

// writeProblem answers an RFC 9457 problem whose type is problemBase+slug.
func writeProblem(w http.ResponseWriter, status int, slug, title, detail string) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{problemBase + slug, title, status, detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(body, '\n')) //nolint:errcheck // the client is gone; nothing to do
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only orders and slices of orders come here: cannot happen.
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n')) //nolint:errcheck // the client is gone; nothing to do
}

// maxQuoted is how much of a client's text an error quotes: enough to
// recognise it, too little to let the client choose the size of an
// answer or a log line.
const maxQuoted = 32

// quote returns s for an error message: Go-quoted (control characters,
// C1 included, and invalid UTF-8 escaped), cut to maxQuoted bytes with
// its full length said.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return strconv.Quote(cutText(s, maxQuoted)) + "… (" + strconv.Itoa(len(s)) + " bytes)"
}

// cutText returns the first limit bytes of s, or a little less so as not
// to split a character.
func cutText(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > limit-utf8.UTFMax && cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
