package idemcli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idem-go/idem/idemmigrate"
)

// MigrateOpts are the options of Migrate.
type MigrateOpts struct {
	// DB is the database: sqlite:PATH, postgres://… or mysql://….
	DB string
	// DryRun lists the pending migrations without applying them.
	DryRun bool
}

// Migrate creates or updates the idempotency records table through the
// embedded migrations of idemmigrate, and prints the migrations it applied
// (or, with DryRun, would apply), one per line.
type Migrate struct {
	CommandBase
}

const migrateHelp = `Usage: idem migrate [flags]

Creates or updates the idempotency records table (idem_keys) in the
database, with the migrations embedded in idem. Prints each migration
applied, one per line, or "up to date". Safe to run again, and from several
processes at once.

The same SQL is available as plain files in idemmigrate/<dialect>/ for teams
that use their own migration tool.
`

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts := MigrateOpts{}
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.StringVar(&opts.DB, "db", DefaultDB, dbFlagHelp)
	fs.BoolVar(&opts.DryRun, "dry-run", false, "list the pending migrations and change nothing")
	if err := parseFlags(fs, migrateHelp, args, stdout); err != nil {
		return err
	}
	return (&Migrate{CommandBase{Stdout: stdout, Logger: slog.New(slog.NewTextHandler(stderr, nil))}}).Run(ctx, &opts)
}

// Run applies (or lists) the pending migrations of opts.DB.
func (c *Migrate) Run(ctx context.Context, opts *MigrateOpts) error {
	if isDynamoURL(opts.DB) {
		return c.migrateDynamo(ctx, opts)
	}
	// A dry run must not create the SQLite file it looks at.
	cn, err := openDB(ctx, opts.DB, openOptions{mustExist: opts.DryRun})
	if err != nil {
		return err
	}
	defer cn.Close() //nolint:errcheck // read-only from here on, or committed
	db := cn.db
	if cn.pool != nil {
		// idemmigrate speaks database/sql; on PostgreSQL it runs over the
		// same pool, through pgx's database/sql adapter.
		db = stdlib.OpenDBFromPool(cn.pool)
		defer db.Close() //nolint:errcheck // closes the adapter, not the pool
	}
	dialect := cn.migrationDialect()
	out := c.stdout()
	if opts.DryRun {
		pending, err := idemmigrate.Pending(ctx, db, dialect)
		if err != nil {
			return fmt.Errorf("read the applied migrations: %w", err)
		}
		return printMigrations(out, pending, "pending: ")
	}
	// What this run applied, not what was pending before it took the
	// lock: two processes migrating at once must not both say "applied".
	applied, err := idemmigrate.Apply(ctx, db, dialect)
	if err != nil {
		for _, name := range applied { // what did happen before the failure
			fmt.Fprintln(out, "applied: "+name)
		}
		return err
	}
	return printMigrations(out, applied, "applied: ")
}

func printMigrations(w io.Writer, names []string, prefix string) error {
	if len(names) == 0 {
		_, err := fmt.Fprintln(w, "up to date")
		return err
	}
	for _, n := range names {
		if _, err := fmt.Fprintln(w, prefix+n); err != nil {
			return err
		}
	}
	return nil
}
