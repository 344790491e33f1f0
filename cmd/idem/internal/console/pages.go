package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkeys"
)

func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	st, err := h.lister.KeyStats(r.Context(), idemkeys.StatsParams{Tenant: r.URL.Query().Get("tenant")})
	if err != nil {
		h.fail(w, r, http.StatusBadGateway, "the store did not answer: "+err.Error())
		return
	}
	var total idemkeys.TenantCounts
	for _, t := range st.Tenants {
		total.InFlight += t.InFlight
		total.Abandoned += t.Abandoned
		total.Complete += t.Complete
		total.Expired += t.Expired
	}
	data := map[string]any{"Stats": st, "Total": total, "Chart": newChart(st.Hours), "Now": st.Now, "Title": "Overview"}
	if st.OldestInFlight != nil {
		data["Oldest"] = newKeyView(st.OldestInFlight, st.Now, h.lease, false, false)
	}
	h.render(w, r, http.StatusOK, "overview", data)
}

// listParams reads the filters of a list from a query string.
func listParams(r *http.Request) (idemkeys.ListParams, error) {
	q := r.URL.Query()
	p := idemkeys.ListParams{Tenant: q.Get("tenant"), Status: idemkeys.Status(q.Get("state")), Prefix: q.Get("prefix"), After: q.Get("after")}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return p, fmt.Errorf("limit %q: want a positive number", s)
		}
		p.Limit = n
	}
	for name, dst := range map[string]*time.Time{"from": &p.CreatedFrom, "before": &p.CreatedBefore} {
		s := q.Get(name)
		if s == "" {
			continue
		}
		t, err := parseTime(s)
		if err != nil {
			return p, fmt.Errorf("%s %q: want a time such as 2026-12-01T10:00:00Z", name, s)
		}
		*dst = t
	}
	return p, nil
}

// parseTime reads an RFC 3339 time, or the value of a datetime-local
// field (taken as UTC).
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02T15:04:05", "2006-01-02T15:04"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("bad time")
}

func (h *Handler) keys(w http.ResponseWriter, r *http.Request) { h.list(w, r, "Keys", false) }

func (h *Handler) abandoned(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	q.Set("state", string(idemkeys.Abandoned))
	r.URL.RawQuery = q.Encode()
	h.list(w, r, "Abandoned operations", true)
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request, title string, abandoned bool) {
	p, err := listParams(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	page, err := h.lister.ListKeys(r.Context(), p)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "the list failed: "+err.Error())
		return
	}
	views := make([]*keyView, len(page.Records))
	for i, rec := range page.Records {
		views[i] = newKeyView(rec, page.Now, h.lease, false, false)
	}
	q := r.URL.Query()
	h.render(w, r, http.StatusOK, "keys", map[string]any{
		"Title": title, "Abandoned": abandoned, "Keys": views, "Next": page.Next, "Now": page.Now,
		"Tenant": p.Tenant, "State": string(p.Status), "Prefix": p.Prefix, "From": q.Get("from"), "Before": q.Get("before"),
		"Limit": q.Get("limit"),
	})
}

func (h *Handler) key(w http.ResponseWriter, r *http.Request) {
	tenant, key := keyOf(r)
	rec, now, err := h.get(r.Context(), tenant, key)
	if err != nil {
		h.fail(w, r, statusOf(err), err.Error())
		return
	}
	h.render(w, r, http.StatusOK, "key", map[string]any{"Title": "Key", "K": newKeyView(rec, now, h.lease, true, r.URL.Query().Get("body") == "1"), "Now": now})
}

// get reads one record and the store's clock (that of a one-record list
// of the key's tenant and prefix would cost a scan on some stores; the
// clock of a stats call too): the local clock stands in, as idem inspect's.
func (h *Handler) get(ctx context.Context, tenant, key string) (*idem.Record, time.Time, error) {
	rec, err := h.store.Get(ctx, tenant, key)
	if errors.Is(err, idem.ErrNotFound) {
		return nil, time.Time{}, errNoRecord
	}
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("the store did not answer: %w", err)
	}
	return rec, time.Now(), nil
}

var errNoRecord = errors.New("no record for this key (never used, released, forgotten or purged)")

// actionError is an action refused, with the status it answers.
type actionError struct {
	status int
	msg    string
}

func (e *actionError) Error() string { return e.msg }

func statusOf(err error) int {
	var ae *actionError
	switch {
	case errors.As(err, &ae):
		return ae.status
	case errors.Is(err, errNoRecord):
		return http.StatusNotFound
	}
	return http.StatusBadGateway
}

func (h *Handler) confirm(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	if action != "release" && action != "forget" {
		h.fail(w, r, http.StatusNotFound, "no such action")
		return
	}
	tenant, key := keyOf(r)
	rec, now, err := h.get(r.Context(), tenant, key)
	if err != nil {
		h.fail(w, r, statusOf(err), err.Error())
		return
	}
	h.render(w, r, http.StatusOK, "confirm", map[string]any{"Title": "Confirm", "Action": action,
		"K": newKeyView(rec, now, h.lease, true, false), "Now": now, "Seen": rec.LockedUntil.UTC().Format(time.RFC3339Nano)})
}

// Action is one operator action on a key: Name "release" (of a key in
// flight, by its lease token) or "forget" (of a completed key).
type Action struct {
	Name, Tenant, Key string
	// Reason is logged with the action; required.
	Reason string
	// Token is the lease token the operator saw; 0 takes the record's.
	// A record claimed again since is left alone.
	Token int64
	// Seen is the end of the lease the operator saw; a later one means
	// its holder extended it since, and the release is refused unless
	// Force is set.
	Seen  time.Time
	Force bool
	// Who names the operator in the log.
	Who string
}

func (h *Handler) act(w http.ResponseWriter, r *http.Request) {
	tenant, key := keyOf(r)
	req := Action{Name: r.PathValue("action"), Tenant: tenant, Key: key,
		Reason: r.PostFormValue("reason"), Force: r.PostFormValue("force") == "1", Who: who(r.Context())}
	if s := r.PostFormValue("token"); s != "" {
		req.Token, _ = strconv.ParseInt(s, 10, 64)
	}
	if s := r.PostFormValue("seen"); s != "" {
		req.Seen, _ = time.Parse(time.RFC3339Nano, s)
	}
	if r.PostFormValue("confirm") != "yes" {
		h.fail(w, r, http.StatusBadRequest, "tick the confirmation box to "+req.Name+" the key")
		return
	}
	msg, err := Act(r.Context(), h.store, h.log, req)
	if err != nil {
		data := map[string]any{"Status": statusOf(err), "Message": err.Error()}
		if rec, now, gerr := h.get(r.Context(), req.Tenant, req.Key); gerr == nil && req.Name == "release" && rec.State == idem.StateInFlight {
			// Confirm again, on what the record is now.
			data["Again"] = newKeyView(rec, now, h.lease, true, false)
			data["Seen"] = rec.LockedUntil.UTC().Format(time.RFC3339Nano)
			data["Reason"] = req.Reason
		}
		h.render(w, r, statusOf(err), "error", data)
		return
	}
	h.render(w, r, http.StatusOK, "done", map[string]any{"Title": "Done", "Message": msg, "Path": keyPath(req.Tenant, req.Key)})
}

// Act runs one action on store, logs it to log, and returns what it did
// in one sentence. A refusal is an error that names why.
func Act(ctx context.Context, store idem.Store, log *slog.Logger, req Action) (string, error) {
	lister, ok := store.(idemkeys.Lister)
	if !ok {
		return "", fmt.Errorf("the store %T cannot forget its records", store)
	}
	req.Reason = strings.TrimSpace(req.Reason)
	if req.Reason == "" {
		return "", &actionError{http.StatusBadRequest, "a reason is required"}
	}
	if len(req.Reason) > 500 {
		return "", &actionError{http.StatusBadRequest, "the reason is longer than 500 bytes"}
	}
	if req.Name != "release" && req.Name != "forget" {
		return "", &actionError{http.StatusNotFound, "no such action"}
	}
	rec, err := store.Get(ctx, req.Tenant, req.Key)
	if errors.Is(err, idem.ErrNotFound) {
		return "", errNoRecord
	}
	if err != nil {
		return "", fmt.Errorf("the store did not answer: %w", err)
	}
	if req.Token != 0 && req.Token != rec.LeaseToken {
		return "", &actionError{http.StatusConflict, fmt.Sprintf("the key was claimed again since (lease token %d now, %d seen): look at it again", rec.LeaseToken, req.Token)}
	}
	token := rec.LeaseToken
	log = log.With(slog.String("action", req.Name), slog.String("tenant", req.Tenant), slog.String("key", req.Key),
		slog.Int64("lease_token", token), slog.String("reason", req.Reason), slog.String("who", req.Who))
	switch req.Name {
	case "release":
		if rec.State != idem.StateInFlight {
			return "", &actionError{http.StatusConflict, "the key is " + string(rec.State) + ", not in flight: nothing to release"}
		}
		if !req.Seen.IsZero() && rec.LockedUntil.After(req.Seen) && !req.Force {
			return "", &actionError{http.StatusConflict, fmt.Sprintf("the lease moved from %s to %s since you looked: its holder is alive and extending it. Releasing lets a retry run beside it (its completion would then be refused and its writes rolled back)",
				req.Seen.UTC().Format(time.RFC3339), rec.LockedUntil.UTC().Format(time.RFC3339))}
		}
		if err := store.Release(ctx, idem.ReleaseParams{Tenant: req.Tenant, Key: req.Key, Token: token}); err != nil {
			log.Error("idem console: release failed", slog.Any("err", err))
			return "", fmt.Errorf("the store did not release the key: %w", err)
		}
		after, err := store.Get(ctx, req.Tenant, req.Key)
		switch {
		case errors.Is(err, idem.ErrNotFound):
			log.Warn("idem console: key released")
			return "released: the record is deleted, the next request under the key runs afresh", nil
		case err != nil:
			return "", fmt.Errorf("released, but the record could not be read again: %w", err)
		case after.LeaseToken == token && after.State == idem.StateInFlight && !time.Now().Before(after.LockedUntil.Add(-time.Second)):
			log.Warn("idem console: key released, steps kept")
			return fmt.Sprintf("released: the lease is ended and the record keeps its %d recovery points; the next request takes the key over with them", len(after.Steps)), nil
		}
		return "", &actionError{http.StatusConflict, "not released: the key changed meanwhile (completed or claimed again); look at it again"}
	default:
		if rec.State != idem.StateComplete {
			return "", &actionError{http.StatusConflict, "the key is in flight, not complete: release it instead"}
		}
		if err := lister.Forget(ctx, idemkeys.ForgetParams{Tenant: req.Tenant, Key: req.Key, Token: token}); err != nil {
			if errors.Is(err, idem.ErrNotFound) {
				return "", &actionError{http.StatusConflict, "not forgotten: the key changed meanwhile; look at it again"}
			}
			log.Error("idem console: forget failed", slog.Any("err", err))
			return "", fmt.Errorf("the store did not forget the key: %w", err)
		}
		log.Warn("idem console: key forgotten")
		return "forgotten: the record is deleted, the next request under the key runs again", nil
	}
}
