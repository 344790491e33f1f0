package idemcli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/idem-go/idem/idemjanitor"
)

// DefaultPurgeBatch is the --batch default of purge.
const DefaultPurgeBatch = 1000

// PurgeOpts are the options of Purge.
type PurgeOpts struct {
	// DB is the database: sqlite:PATH, postgres://… or mysql://….
	DB string
	// Batch bounds each delete, so that no statement holds locks long
	// enough to stall the claims of a live service.
	Batch int
}

// Purge deletes the idempotency records past their retention, once, in
// bounded batches (idemjanitor.Janitor.PurgeOnce), and prints how many it deleted.
// A record past retention already counts as absent; the purge only gives
// the space back. `idem serve` runs the same janitor in the background.
type Purge struct {
	CommandBase
}

const purgeHelp = `Usage: idem purge [flags]

Deletes the idempotency records whose retention has passed, in batches of
--batch rows, and prints how many it deleted ("purged N expired records").
Records in flight under a live lease are never deleted. Safe to run while
the service runs, for example from cron.
`

func runPurge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts := PurgeOpts{}
	fs := flag.NewFlagSet("purge", flag.ContinueOnError)
	fs.StringVar(&opts.DB, "db", DefaultDB, dbFlagHelp)
	intVar(fs, &opts.Batch, "batch", DefaultPurgeBatch, "delete at most `N` records per statement")
	if err := parseFlags(fs, purgeHelp, args, stdout); err != nil {
		return err
	}
	return (&Purge{CommandBase{Stdout: stdout, Logger: slog.New(slog.NewTextHandler(stderr, nil))}}).Run(ctx, &opts)
}

// Run purges opts.DB once.
func (c *Purge) Run(ctx context.Context, opts *PurgeOpts) error {
	if opts.Batch <= 0 {
		return usagef("--batch must be positive, got %d", opts.Batch)
	}
	if isDynamoURL(opts.DB) {
		return c.purgeDynamo(ctx, opts)
	}
	cn, err := openDB(ctx, opts.DB, openOptions{mustExist: true})
	if err != nil {
		return err
	}
	defer cn.Close() //nolint:errcheck // the deletes are committed
	store, err := cn.keyStore()
	if err != nil {
		return err
	}
	j, err := idemjanitor.NewJanitor(store, &idemjanitor.Config{BatchSize: opts.Batch, Logger: c.logger()})
	if err != nil {
		return err
	}
	n, err := j.PurgeOnce(ctx)
	if err != nil {
		return fmt.Errorf("purge (%d records deleted before the failure): %w", n, notMigrated(err))
	}
	_, err = fmt.Fprintf(c.stdout(), "purged %d expired records\n", n)
	return err
}
