package console

import (
	"encoding/hex"
	"html/template"
	"net/url"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/safetext"
	"github.com/idem-go/idem/idemkeys"
)

// bodyPreview bounds how much of a stored body a page or the API shows.
const bodyPreview = 4096

// keyView is one record as the pages and the API show it.
type keyView struct {
	Tenant      string              `json:"tenant"`
	Key         string              `json:"key"`
	Status      idemkeys.Status     `json:"status"`
	State       idem.State          `json:"stored_state"`
	Fingerprint string              `json:"fingerprint,omitempty"`
	LeaseToken  int64               `json:"lease_token,string"`
	LockedUntil time.Time           `json:"locked_until"`
	LeaseLive   bool                `json:"lease_live"`
	Extended    bool                `json:"lease_extended"`
	CreatedAt   time.Time           `json:"created_at"`
	CompletedAt *time.Time          `json:"completed_at,omitempty"`
	ExpiresAt   time.Time           `json:"expires_at"`
	Mode        string              `json:"mode,omitempty"`
	Answer      int                 `json:"answer_status,omitempty"`
	Header      map[string][]string `json:"header,omitempty"`
	Reference   string              `json:"reference,omitempty"`
	BodySize    *int                `json:"body_size,omitempty"`
	Steps       []stepView          `json:"steps,omitempty"`
	Body        *bodyView           `json:"body,omitempty"`
	Now         time.Time           `json:"-"`
}

type stepView struct {
	Name string `json:"name"`
	Size int    `json:"size"`
}

// bodyView is a bounded preview of a stored body: text when it is UTF-8,
// hex otherwise.
type bodyView struct {
	Text      string `json:"text,omitempty"`
	Hex       string `json:"hex,omitempty"`
	Shown     int    `json:"shown"`
	Size      int    `json:"size"`
	Truncated bool   `json:"truncated"`
}

func newBodyView(b []byte) *bodyView {
	v := &bodyView{Size: len(b)}
	cut := b
	if len(cut) > bodyPreview {
		cut = cut[:bodyPreview]
		v.Truncated = true
	}
	if utf8.Valid(b) {
		for !utf8.Valid(cut) {
			cut = cut[:len(cut)-1] // do not split a character
		}
		v.Text = string(cut)
	} else {
		v.Hex = hex.EncodeToString(cut)
	}
	v.Shown = len(cut)
	return v
}

// newKeyView describes rec at now, the store's clock; lease is the lease
// the services give, which says whether the lease has been extended.
// full means rec came from Get: its body size and steps are known.
func newKeyView(rec *idem.Record, now time.Time, lease time.Duration, full, withBody bool) *keyView {
	v := &keyView{
		Tenant: rec.Tenant, Key: rec.Key, Status: idemkeys.StatusOf(rec, now), State: rec.State,
		LeaseToken: rec.LeaseToken, LockedUntil: rec.LockedUntil.UTC(), CreatedAt: rec.CreatedAt.UTC(),
		ExpiresAt: rec.ExpiresAt.UTC(), Now: now,
		LeaseLive: rec.State == idem.StateInFlight && now.Before(rec.LockedUntil),
		// A lease ends Lease after its claim unless a heartbeat moved it
		// (a second of slack for the store's rounding).
		Extended: rec.LockedUntil.Sub(rec.CreatedAt) > lease+time.Second,
	}
	if len(rec.Fingerprint) > 0 {
		v.Fingerprint = hex.EncodeToString(rec.Fingerprint)
	}
	if rec.State == idem.StateComplete {
		at := rec.CompletedAt.UTC()
		v.CompletedAt = &at
		v.Mode, v.Answer, v.Header, v.Reference = rec.Result.Mode.String(), rec.Result.Status, rec.Result.Header, rec.Result.Reference
	}
	if full {
		n := len(rec.Result.Body)
		v.BodySize = &n
		for _, s := range rec.Steps {
			v.Steps = append(v.Steps, stepView{Name: s.Name, Size: len(s.Value)})
		}
		if withBody && n > 0 {
			v.Body = newBodyView(rec.Result.Body)
		}
	}
	return v
}

// HeaderNames returns the stored header names in order.
func (v *keyView) HeaderNames() []string {
	names := make([]string, 0, len(v.Header))
	for n := range v.Header {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Path is the URL of the key's page.
func (v *keyView) Path() string { return keyPath(v.Tenant, v.Key) }

// BodyPath is the URL of the key's page with the body shown.
func (v *keyView) BodyPath() string { return keyPath(v.Tenant, v.Key) + "&body=1" }

// ActionPath is the URL of action on the key.
func (v *keyView) ActionPath(action string) string { return actionPath(action, v.Tenant, v.Key) }

var funcs = template.FuncMap{
	"time": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
	},
	"since":   func(now, t time.Time) string { return roughDuration(now.Sub(t)) },
	"until":   func(now, t time.Time) string { return roughDuration(t.Sub(now)) },
	"keypath": keyPath,
	"query": func(pairs ...string) string {
		q := url.Values{}
		for i := 0; i+1 < len(pairs); i += 2 {
			if pairs[i+1] != "" {
				q.Set(pairs[i], pairs[i+1])
			}
		}
		return q.Encode()
	},
	"token": func(t int64) string { return strconv.FormatInt(t, 10) },
	// shown is stored text as a page shows it: its control and invisible
	// characters (a right-to-left override, a zero-width space) as
	// escapes, so that a key reads as what it holds; html/template then
	// escapes its markup.
	"shown": safetext.Escape,
}

// roughDuration prints d to the second, or to the minute past an hour.
func roughDuration(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	if d >= time.Hour {
		d = d.Round(time.Minute)
	} else {
		d = d.Round(time.Second)
	}
	s := d.String()
	if neg {
		return "-" + s
	}
	return s
}

// chart is the SVG of claims and completions per hour, drawn on the
// server.
type chart struct {
	Width, Height int
	Bars          []bar
	Max           int
}

type bar struct {
	X, ClaimY, ClaimH, DoneX, DoneY, DoneH int
	Label                                  string
	Claims, Completions                    int
	Tick                                   bool
}

const (
	chartHeight = 160
	slot        = 28
)

func newChart(hours []idemkeys.HourCounts) chart {
	c := chart{Width: slot*len(hours) + 10, Height: chartHeight + 20, Max: 1}
	for _, h := range hours {
		c.Max = max(c.Max, h.Claims, h.Completions)
	}
	for i, h := range hours {
		ch := h.Claims * chartHeight / c.Max
		dh := h.Completions * chartHeight / c.Max
		x := 5 + i*slot
		c.Bars = append(c.Bars, bar{
			X: x, ClaimY: chartHeight - ch, ClaimH: ch,
			DoneX: x + slot/2 - 1, DoneY: chartHeight - dh, DoneH: dh,
			Label: h.Start.UTC().Format("15h"), Claims: h.Claims, Completions: h.Completions, Tick: i%3 == 0,
		})
	}
	return c
}
