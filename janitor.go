package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// JanitorConfig configures a Janitor.
type JanitorConfig struct {
	// Interval is the pause between two purge passes. Defaults to 1m.
	Interval time.Duration
	// BatchSize bounds each Store.Purge call, so that no delete holds locks
	// long enough to stall claims. Defaults to 1000.
	BatchSize int
	// BatchPause is a pause between two batches of one pass, leaving room
	// to the claims. Defaults to 0 (none).
	BatchPause time.Duration
	// Logger receives a line per pass that deleted something and the
	// errors. Defaults to slog.Default().
	Logger *slog.Logger
	// Tracer observes each pass when it implements PurgeTracer, and each
	// Store.Purge call when it implements StoreTracer (the engine's
	// tracer, typically). Defaults to none.
	Tracer Tracer
}

// Janitor deletes expired records in the background, in bounded batches.
// A record past retention already counts as absent to claims; the janitor
// only gives the space back.
type Janitor struct {
	store  Store
	name   string // the store's
	config JanitorConfig
	purge  PurgeTracer // nil: passes not traced
	st     StoreTracer // nil: calls not traced
}

// NewJanitor returns a janitor over store. A nil config means the
// defaults; a negative setting is an error.
func NewJanitor(store Store, config *JanitorConfig) (*Janitor, error) {
	if store == nil {
		return nil, errors.New("idem: NewJanitor needs a store")
	}
	c := JanitorConfig{}
	if config != nil {
		c = *config
	}
	if c.Interval < 0 || c.BatchSize < 0 || c.BatchPause < 0 {
		return nil, errors.New("idem: JanitorConfig.Interval, BatchSize and BatchPause must not be negative")
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
	j.purge, _ = c.Tracer.(PurgeTracer)
	j.st, _ = c.Tracer.(StoreTracer)
	return j, nil
}

// PurgeOnce deletes expired records in batches until a batch comes back
// short, and returns how many it deleted.
func (j *Janitor) PurgeOnce(ctx context.Context) (int, error) {
	if j.purge == nil {
		n, _, err := j.purgeOnce(ctx)
		return n, err
	}
	start := time.Now()
	n, batches, err := j.purgeOnce(ctx)
	j.purge.TracePurge(ctx, TracePurgeData{Store: j.name, Deleted: n, Batches: batches, Duration: time.Since(start), Err: err})
	return n, err
}

// purgeOnce is PurgeOnce; it also says how many batches it ran.
func (j *Janitor) purgeOnce(ctx context.Context) (total, batches int, err error) {
	for {
		var n int
		batches++
		err := TraceStore(ctx, j.config.Tracer, StorePurge, j.name, func(ctx context.Context) (err error) {
			n, err = j.store.Purge(ctx, PurgeParams{Limit: j.config.BatchSize})
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
			j.config.Logger.WarnContext(ctx, "idem: purge failed", slog.String("store", j.name), errorAttr(err), slog.Int("deleted", n))
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
