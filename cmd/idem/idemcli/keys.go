package idemcli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os/user"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/safetext"
	"github.com/idem-go/idem/idemkeys"
)

const keysHelp = `Usage: idem keys list|release|forget [flags]

  list     the records, filtered by --state (in_flight, abandoned, complete,
           expired), --tenant and --prefix, a page at a time (--after)
  release  a key in flight, by its lease token: the next request runs at
           once; if its holder is alive after all, its completion is
           refused and its writes rolled back
  forget   a completed key: its record is deleted, the next request runs
           again

release and forget need --reason, which is logged with the user's name.
Tenants, keys and reasons are printed quoted, with Go escapes for control
characters, so that none of it can act on the terminal.
`

func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("want a subcommand: list, release or forget (run \"idem keys --help\")")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, keysHelp)
		return flag.ErrHelp
	case "list":
		return runKeysList(ctx, args[1:], stdout, stderr)
	case "release", "forget":
		return runKeysAct(ctx, args[0], args[1:], stdout, stderr)
	}
	return usagef("unknown subcommand %s: want list, release or forget", quoteArg(args[0]))
}

func runKeysList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("keys list", flag.ContinueOnError)
	db := fs.String("db", DefaultDB, dbFlagHelp)
	keys := fs.String("keys", "", "read the records from Redis at this redis:// `URL` instead of --db")
	state := fs.String("state", "", "list only the keys in this `state`: in_flight, abandoned, complete or expired")
	var p idemkeys.ListParams
	fs.StringVar(&p.Tenant, "tenant", "", "list only this `tenant`'s keys")
	fs.StringVar(&p.Prefix, "prefix", "", "list only the keys that start with this `prefix`")
	fs.IntVar(&p.Limit, "limit", 50, "list at most this many keys (at most 1000)")
	fs.StringVar(&p.After, "after", "", "start after this `cursor` (printed after a full page)")
	asJSON := fs.Bool("json", false, "print one JSON object: the keys and the next cursor")
	if err := parseFlags(fs, keysHelp, args, stdout); err != nil {
		return err
	}
	p.Status = idemkeys.Status(*state)
	switch p.Status {
	case "", idemkeys.InFlight, idemkeys.Abandoned, idemkeys.Complete, idemkeys.Expired:
	default:
		return usagef("--state %s: want in_flight, abandoned, complete or expired", quoteArg(*state))
	}
	store, closeStore, err := openListStore(ctx, *db, *keys, slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		return err
	}
	defer closeStore()
	page, err := store.(idemkeys.Lister).ListKeys(ctx, p)
	if err != nil {
		return fmt.Errorf("list: %w", notMigrated(err))
	}
	if *asJSON {
		type item struct {
			Tenant      string          `json:"tenant"`
			Key         string          `json:"key"`
			Status      idemkeys.Status `json:"status"`
			LeaseToken  int64           `json:"lease_token,string"`
			LockedUntil time.Time       `json:"locked_until"`
			CreatedAt   time.Time       `json:"created_at"`
			ExpiresAt   time.Time       `json:"expires_at"`
			Answer      int             `json:"answer_status,omitempty"`
		}
		out := struct {
			Keys []item `json:"keys"`
			Next string `json:"next,omitempty"`
		}{Keys: []item{}, Next: page.Next}
		for _, r := range page.Records {
			out.Keys = append(out.Keys, item{r.Tenant, r.Key, idemkeys.StatusOf(r, page.Now), r.LeaseToken, r.LockedUntil.UTC(), r.CreatedAt.UTC(), r.ExpiresAt.UTC(), r.Result.Status})
		}
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
		_, err := stdout.Write(safetext.JSON(b.Bytes()))
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tKEY\tSTATE\tCLAIMED\tLOCKED UNTIL\tLEASE TOKEN")
	for _, r := range page.Records {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", strconv.Quote(r.Tenant), strconv.Quote(r.Key), idemkeys.StatusOf(r, page.Now),
			r.CreatedAt.UTC().Format(time.RFC3339), r.LockedUntil.UTC().Format(time.RFC3339), r.LeaseToken)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(stdout, "more: --after %s\n", page.Next)
	}
	return nil
}

func runKeysAct(ctx context.Context, action string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("keys "+action, flag.ContinueOnError)
	db := fs.String("db", DefaultDB, dbFlagHelp)
	keys := fs.String("keys", "", "act on the records in Redis at this redis:// `URL` instead of --db")
	a := console.Action{Name: action}
	fs.StringVar(&a.Key, "key", "", "the Idempotency-Key (required)")
	fs.StringVar(&a.Tenant, "tenant", defaultTenant, "the `tenant` of the key")
	fs.StringVar(&a.Reason, "reason", "", "why, for the log (required)")
	fs.Int64Var(&a.Token, "token", 0, "the lease `token` you saw (idem keys list): refuse if the key was claimed again since")
	if err := parseFlags(fs, keysHelp, args, stdout); err != nil {
		return err
	}
	if a.Key == "" {
		return usagef("--key is required")
	}
	if a.Reason == "" {
		return usagef("--reason is required: say why, it is logged")
	}
	a.Who = "idem keys"
	if u, err := user.Current(); err == nil {
		a.Who = u.Username + " (idem keys)"
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	store, closeStore, err := openListStore(ctx, *db, *keys, logger)
	if err != nil {
		return err
	}
	defer closeStore()
	msg, err := console.Act(ctx, store, logger, a)
	if err != nil {
		return notMigrated(err)
	}
	fmt.Fprintf(stdout, "%s %s: %s\n", strconv.Quote(a.Tenant), strconv.Quote(a.Key), msg)
	return nil
}
