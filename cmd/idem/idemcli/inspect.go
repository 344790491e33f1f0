package idemcli

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/idem-go/idem/cmd/idem/internal/safetext"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/demo"
	"github.com/idem-go/idem/ideminbox"
)

// InspectOpts are the options of Inspect.
type InspectOpts struct {
	// DB is the database holding the records: sqlite:PATH, postgres://… or
	// mysql://….
	DB string
	// Keys, when set to a redis:// URL, reads the record from Redis
	// instead of DB (as `idem serve --keys` keeps them).
	Keys string
	// Tenant scopes the key. Defaults to the demo's tenant for requests
	// without Authorization, "default".
	Tenant string
	// Consumer, when set, looks the key up under the tenant of that
	// ideminbox consumer (ideminbox.Tenant) instead of Tenant: Key is then
	// a message id, looked up as ideminbox.Key(Key).
	Consumer string
	// Key is the Idempotency-Key to look up.
	Key string
	// JSON prints the record as one JSON object instead of text.
	JSON bool
	// FullBody prints the whole stored body; by default the text form
	// shows its first 1 KiB.
	FullBody bool
}

// Inspect prints the idempotency record of one key: its state, lease,
// times, fingerprint and stored answer. It only reads.
type Inspect struct {
	CommandBase
	// Now is the clock that says whether the lease and the retention have
	// ended. Defaults to time.Now.
	Now func() time.Time
}

const inspectHelp = `Usage: idem inspect --key KEY [flags]

Prints the idempotency record of KEY under --tenant: its state (in flight,
complete, or expired: past its retention, which counts as absent), its
lease, fingerprint, times, and the answer it replays. With --consumer, KEY
is the id of a message of that ideminbox consumer. It only reads, so it is
safe against a live service. Exits 1, with one line, when the key has no
record (never used, released after a failure, or purged).

What the record holds came from clients and servers: tenant, key, header
values, reference and body are printed quoted, with Go escapes for control
characters and invalid UTF-8, so that none of it can act on the terminal.

Whether a lease or a retention has ended is judged by this machine's clock;
the times themselves are the store's.
`

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts := InspectOpts{}
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.StringVar(&opts.Key, "key", "", "the Idempotency-Key to look up, or the message id with --consumer (required)")
	fs.StringVar(&opts.Tenant, "tenant", defaultTenant, "the `tenant` of the key (the demo's: the Bearer name)")
	fs.StringVar(&opts.Consumer, "consumer", "", "the ideminbox consumer `name` whose message id KEY is (instead of --tenant)")
	fs.StringVar(&opts.DB, "db", DefaultDB, dbFlagHelp)
	fs.StringVar(&opts.Keys, "keys", "", "read the record from Redis at this redis:// `URL` (or DynamoDB: dynamodb://TABLE?…) instead of --db")
	fs.BoolVar(&opts.JSON, "json", false, "print the record as one JSON object")
	fs.BoolVar(&opts.FullBody, "full-body", false, "print the whole stored body, not its first 1 KiB")
	if err := parseFlags(fs, inspectHelp, args, stdout); err != nil {
		return err
	}
	if isSet(fs, "tenant") && opts.Consumer != "" {
		return usagef("--tenant and --consumer both name the tenant; give one")
	}
	return (&Inspect{CommandBase: CommandBase{Stdout: stdout, Logger: slog.New(slog.NewTextHandler(stderr, nil))}}).Run(ctx, &opts)
}

// errNoRecord is what Inspect returns for a key without a record.
var errNoRecord = errors.New("no record")

// defaultTenant is the demo's tenant for requests without Authorization.
const defaultTenant = demo.DefaultTenant

// Run reads and prints the record of opts.Key.
func (c *Inspect) Run(ctx context.Context, opts *InspectOpts) error {
	if opts.Key == "" {
		return usagef("--key is required")
	}
	tenant, key := opts.Tenant, opts.Key
	if opts.Consumer != "" {
		// The inbox keys a message by its id, hashed when the id is not
		// a valid key: any id may be asked for.
		tenant, key = ideminbox.Tenant(opts.Consumer), ideminbox.Key(opts.Key)
	} else if err := idem.ValidateKey(opts.Key); err != nil {
		return usagef("--key: %v", err)
	}
	var store idem.Store
	if opts.Keys != "" {
		cn := &conn{}
		defer cn.Close() //nolint:errcheck // nothing was written
		rs, err := cn.useKeys(ctx, opts.Keys, c.logger(), false)
		if err != nil {
			return err
		}
		store = rs
	} else {
		cn, err := openDB(ctx, opts.DB, openOptions{mustExist: true})
		if err != nil {
			return err
		}
		defer cn.Close() //nolint:errcheck // nothing was written
		if store, err = cn.keyStore(); err != nil {
			return err
		}
	}
	rec, err := store.Get(ctx, tenant, key)
	if errors.Is(err, idem.ErrNotFound) {
		return fmt.Errorf("%w for key %s under tenant %s (never used, released after a failure, or purged)", errNoRecord, strconv.Quote(key), strconv.Quote(tenant))
	}
	if err != nil {
		return fmt.Errorf("read the record: %w", notMigrated(err))
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	v := newRecordView(rec, now)
	if opts.JSON {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return err
		}
		_, err := c.stdout().Write(safetext.JSON(b.Bytes()))
		return err
	}
	return v.writeText(c.stdout(), opts.FullBody)
}

// recordView is a record as inspect prints it; its JSON form is the
// --json output.
type recordView struct {
	Tenant      string              `json:"tenant"`
	Key         string              `json:"key"`
	State       string              `json:"state"` // in_flight, complete or expired
	Stored      idem.State          `json:"stored_state"`
	Fingerprint string              `json:"fingerprint,omitempty"` // hex
	LeaseToken  int64               `json:"lease_token"`
	LockedUntil time.Time           `json:"locked_until"`
	LeaseEnded  bool                `json:"lease_ended"`
	CreatedAt   time.Time           `json:"created_at"`
	CompletedAt *time.Time          `json:"completed_at,omitempty"`
	ExpiresAt   time.Time           `json:"expires_at"`
	Mode        string              `json:"mode,omitempty"`
	Status      int                 `json:"status,omitempty"`
	Header      map[string][]string `json:"header,omitempty"`
	Body        *string             `json:"body,omitempty"`        // when valid UTF-8
	BodyBytes   []byte              `json:"body_base64,omitempty"` // otherwise
	BodySize    int                 `json:"body_size"`
	Reference   string              `json:"reference,omitempty"`
}

func newRecordView(rec *idem.Record, now time.Time) *recordView {
	v := &recordView{
		Tenant:      rec.Tenant,
		Key:         rec.Key,
		State:       string(rec.State),
		Stored:      rec.State,
		LeaseToken:  rec.LeaseToken,
		LockedUntil: rec.LockedUntil.UTC(),
		LeaseEnded:  !now.Before(rec.LockedUntil),
		CreatedAt:   rec.CreatedAt.UTC(),
		ExpiresAt:   rec.ExpiresAt.UTC(),
	}
	if len(rec.Fingerprint) > 0 {
		v.Fingerprint = hex.EncodeToString(rec.Fingerprint)
	}
	// Past retention a record counts as absent, in flight or not (the
	// engine keeps the retention at least as long as the lease, and the
	// heartbeat moves both).
	if !now.Before(rec.ExpiresAt) {
		v.State = "expired"
	}
	if rec.State == idem.StateComplete {
		at := rec.CompletedAt.UTC()
		v.CompletedAt = &at
		res := rec.Result
		v.Mode, v.Status, v.Header, v.Reference = res.Mode.String(), res.Status, res.Header, res.Reference
		v.BodySize = len(res.Body)
		if utf8.Valid(res.Body) {
			if len(res.Body) > 0 {
				s := string(res.Body)
				v.Body = &s
			}
		} else {
			v.BodyBytes = res.Body
		}
	}
	return v
}

// bodyPreview is how much of a body the text form prints without
// --full-body.
const bodyPreview = 1024

func (v *recordView) writeText(w io.Writer, fullBody bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	line := func(name, value string) { fmt.Fprintf(tw, "%s\t%s\n", name, value) }
	line("tenant", strconv.Quote(v.Tenant))
	line("key", strconv.Quote(v.Key))
	switch v.State {
	case "expired":
		line("state", "expired (stored "+stateText(v.Stored)+", past retention: counts as absent, a retry runs afresh)")
	case string(idem.StateInFlight):
		if v.LeaseEnded {
			line("state", "in flight, lease ended (a retry with the same request takes it over)")
		} else {
			line("state", "in flight (retries get 409 until it completes or its lease ends)")
		}
	default:
		line("state", "complete (retries with the same request get the stored answer)")
	}
	if v.Fingerprint != "" {
		line("fingerprint", "sha256:"+v.Fingerprint)
	} else {
		line("fingerprint", "none")
	}
	lease := v.LockedUntil.Format(time.RFC3339Nano)
	if v.LeaseEnded {
		lease += " (ended)"
	}
	line("lease token", strconv.FormatInt(v.LeaseToken, 10))
	line("locked until", lease)
	line("created", v.CreatedAt.Format(time.RFC3339Nano))
	if v.CompletedAt != nil {
		line("completed", v.CompletedAt.Format(time.RFC3339Nano))
	}
	line("expires", v.ExpiresAt.Format(time.RFC3339Nano))
	if v.Stored == idem.StateComplete {
		line("answer", fmt.Sprintf("%d, stored as %s", v.Status, v.Mode))
		names := make([]string, 0, len(v.Header))
		for name := range v.Header {
			names = append(names, name)
		}
		slices.Sort(names)
		for i, name := range names {
			label := ""
			if i == 0 {
				label = "header"
			}
			values := make([]string, len(v.Header[name]))
			for j, value := range v.Header[name] {
				values[j] = strconv.Quote(value)
			}
			line(label, headerNameText(name)+": "+strings.Join(values, ", "))
		}
		if v.Reference != "" {
			line("reference", strconv.Quote(v.Reference))
		}
		if v.BodySize > 0 {
			line("body", v.bodyText(fullBody))
		}
	}
	return tw.Flush()
}

// stateText names a stored state, quoted when it is not one of idem's.
func stateText(s idem.State) string {
	switch s {
	case idem.StateInFlight, idem.StateComplete:
		return string(s)
	}
	return strconv.Quote(string(s))
}

// headerNameText prints a stored header name as it is when it is an HTTP
// token (the stores refuse anything else), quoted otherwise.
func headerNameText(name string) string {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return strconv.Quote(name)
		}
	}
	if name == "" {
		return `""`
	}
	return name
}

// bodyText is the body on one line: quoted (so that control characters
// and newlines cannot break the output) when it is text, in hex otherwise,
// cut to bodyPreview bytes unless full.
func (v *recordView) bodyText(full bool) string {
	raw := v.BodyBytes
	if v.Body != nil {
		raw = []byte(*v.Body)
	}
	cut := raw
	if !full && len(cut) > bodyPreview {
		cut = cut[:bodyPreview]
		for !utf8.Valid(cut) && len(cut) > bodyPreview-4 && v.Body != nil {
			cut = cut[:len(cut)-1] // do not split a character
		}
	}
	var s string
	if v.Body != nil {
		s = strconv.Quote(string(cut))
	} else {
		s = "hex:" + hex.EncodeToString(cut)
	}
	s += fmt.Sprintf(" (%d bytes", v.BodySize)
	if len(cut) < len(raw) {
		s += fmt.Sprintf(", first %d shown; --full-body for all", len(cut))
	}
	return s + ")"
}
