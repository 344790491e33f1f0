package console

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/safetext"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
	// The same JSON, its invisible characters escaped: a terminal (curl)
	// shows them as they are.
	_, _ = w.Write(safetext.JSON(b.Bytes()))
}

func apiError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func (h *Handler) apiList(w http.ResponseWriter, r *http.Request) {
	p, err := listParams(r)
	if err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	page, err := h.lister.ListKeys(r.Context(), p)
	if err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	views := make([]*keyView, len(page.Records))
	for i, rec := range page.Records {
		views[i] = newKeyView(rec, page.Now, h.lease, false, false)
	}
	writeJSON(w, http.StatusOK, struct {
		Keys []*keyView `json:"keys"`
		Next string     `json:"next,omitempty"`
		Now  time.Time  `json:"now"`
	}{views, page.Next, page.Now})
}

func (h *Handler) apiKey(w http.ResponseWriter, r *http.Request) {
	tenant, key := keyOf(r)
	rec, now, err := h.get(r.Context(), tenant, key)
	if err != nil {
		apiError(w, statusOf(err), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, newKeyView(rec, now, h.lease, true, r.URL.Query().Get("body") == "1"))
}

// apiAction is the body of a POST …/release or …/forget.
type apiAction struct {
	Reason string `json:"reason"`
	// Token, when given, is the lease token the caller saw: the action
	// is refused if the key was claimed again since.
	Token string `json:"lease_token"`
}

func (h *Handler) apiAct(w http.ResponseWriter, r *http.Request) {
	var body apiAction
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
		apiError(w, http.StatusBadRequest, `want a JSON body such as {"reason": "holder pod killed"}`)
		return
	}
	tenant, key := keyOf(r)
	req := Action{Name: r.PathValue("action"), Tenant: tenant, Key: key, Reason: body.Reason, Who: who(r.Context())}
	if body.Token != "" {
		t, err := strconv.ParseInt(body.Token, 10, 64)
		if err != nil {
			apiError(w, http.StatusBadRequest, "lease_token: want the decimal token as a string")
			return
		}
		req.Token = t
	}
	msg, err := Act(r.Context(), h.store, h.log, req)
	if err != nil {
		apiError(w, statusOf(err), err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"result": msg})
}
