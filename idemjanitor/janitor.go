// Package idemjanitor deletes expired records in the background, in
// bounded batches, so that a store gives back the space of the keys past
// their retention:
//
//	janitor, err := idemjanitor.NewJanitor(store, &idemjanitor.Config{Interval: time.Minute, Tracer: tracer})
//	…
//	go janitor.Run(ctx) // until ctx ends
//
// A record past retention already counts as absent to claims: the janitor
// only frees its space, and a store that expires records itself (Redis,
// DynamoDB's TTL) needs none. idem purge runs one pass from the command
// line.
package idemjanitor

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/fieldtext"
	"github.com/idem-go/idem/internal/tracers"
)

// Config configures a Janitor.
type Config struct {
	// Interval is the pause between two purge passes. Defaults to 1m.
	Interval time.Duration
	// BatchSize bounds each idem.Store.Purge call, so that no delete holds locks
	// long enough to stall claims. Defaults to 1000.
	BatchSize int
	// BatchPause is a pause between two batches of one pass, leaving room
	// to the claims. Defaults to 0 (none).
	BatchPause time.Duration
	// Logger receives a line per pass that deleted something and the
	// errors. Defaults to slog.Default().
	Logger *slog.Logger
	// Tracer observes each pass when it implements PurgeTracer, and each
	// Store.Purge call when it implements idem.StoreTracer (the engine's
	// tracer, typically: idemprom's and idemotel's implement both; the
	// PurgeTracers inside an idem.MultiTracer are found too). Defaults to
	// none.
	Tracer idem.Tracer
}

// Janitor deletes expired records in the background, in bounded batches.
// A record past retention already counts as absent to claims; the janitor
// only gives the space back.
type Janitor struct {
	store  idem.Store
	name   string // the store's
	config Config
	purge  []PurgeTracer // none: passes not traced
}

// NewJanitor returns a janitor over store. A nil config means the
// defaults; a negative setting is an error.
func NewJanitor(store idem.Store, config *Config) (*Janitor, error) {
	if store == nil {
		return nil, errors.New("idemjanitor: NewJanitor needs a store")
	}
	c := Config{}
	if config != nil {
		c = *config
	}
	if c.Interval < 0 || c.BatchSize < 0 || c.BatchPause < 0 {
		return nil, errors.New("idemjanitor: Config.Interval, BatchSize and BatchPause must not be negative")
	}
	if c.Interval <= 0 {
		c.Interval = time.Minute
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 1000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	j := &Janitor{store: store, name: store.Info().Name, config: c}
	j.purge = tracers.Find[PurgeTracer](c.Tracer)
	return j, nil
}

// PurgeOnce deletes expired records in batches until a batch comes back
// short, and returns how many it deleted.
func (j *Janitor) PurgeOnce(ctx context.Context) (int, error) {
	if len(j.purge) == 0 {
		n, _, err := j.purgeOnce(ctx)
		return n, err
	}
	start := time.Now()
	n, batches, err := j.purgeOnce(ctx)
	data := TracePurgeData{Store: j.name, Deleted: n, Batches: batches, Duration: time.Since(start), Err: err}
	for _, t := range j.purge {
		t.TracePurge(ctx, data)
	}
	return n, err
}

// purgeOnce is PurgeOnce; it also says how many batches it ran.
func (j *Janitor) purgeOnce(ctx context.Context) (total, batches int, err error) {
	for {
		var n int
		batches++
		err := tracers.Store(ctx, j.config.Tracer, idem.StorePurge, j.name, func(ctx context.Context) (err error) {
			n, err = j.store.Purge(ctx, idem.PurgeParams{Limit: j.config.BatchSize})
			return err
		})
		total += n
		if err != nil {
			return total, batches, err
		}
		if n < j.config.BatchSize {
			return total, batches, nil
		}
		if j.config.BatchPause > 0 {
			select {
			case <-ctx.Done():
				return total, batches, ctx.Err()
			case <-time.After(j.config.BatchPause):
			}
		}
	}
}

// Run purges every Interval until ctx ends, and then returns nil.
func (j *Janitor) Run(ctx context.Context) error {
	ticker := time.NewTicker(j.config.Interval)
	defer ticker.Stop()
	for {
		n, err := j.PurgeOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !errors.Is(err, context.Canceled):
			j.config.Logger.WarnContext(ctx, "idem: purge failed", slog.String("store", j.name), slog.String("error", fieldtext.Escape(err.Error())), slog.Int("deleted", n))
		case n > 0:
			j.config.Logger.InfoContext(ctx, "idem: purged expired records", slog.Int("deleted", n), slog.String("store", j.name))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// PurgeTracer observes the janitor's passes. Set the tracer in
// Config.Tracer.
type PurgeTracer interface {
	// TracePurge is called after each pass of Janitor.PurgeOnce.
	TracePurge(ctx context.Context, data TracePurgeData)
}

// TracePurgeData describes one purge pass.
type TracePurgeData struct {
	Store string
	// Deleted is how many records the pass deleted.
	Deleted int
	// Batches is how many idem.Store.Purge calls it made.
	Batches  int
	Duration time.Duration
	Err      error
}
