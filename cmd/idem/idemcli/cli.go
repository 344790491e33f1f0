// Package idemcli is the idem command line, one command per file: serve
// (the demo orders API, internal/demo, behind the idempotency middleware),
// migrate (the schema of the idempotency records), purge (their expired
// rows), inspect (one record), check (a live API, idemcheck) and version.
//
// cmd/idem is a thin main over Main, so that the commands can be run and
// tested in-process.
//
// # Commands
//
// The maintenance commands are also structs with a Run(ctx, opts) method
// and an options struct that their flags fill: Migrate and MigrateOpts,
// Purge and PurgeOpts, Inspect and InspectOpts. A program that embeds idem
// can run them without going through flags. The demo server has no such
// API: it is a demo, run through Main.
package idemcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/idem-go/idem/cmd/idem/internal/safetext"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Exit statuses of Main.
const (
	ExitOK      = 0 // the command succeeded
	ExitFailure = 1 // the command ran and failed (database unreachable, …)
	ExitUsage   = 2 // the command line was wrong; nothing ran
)

// CommandBase holds what every command writes to. The zero value writes
// nowhere.
type CommandBase struct {
	// Stdout receives the command's results (counts, lists).
	Stdout io.Writer
	// Logger receives progress and diagnostics. Defaults to discarding.
	Logger *slog.Logger
}

func (b *CommandBase) stdout() io.Writer {
	if b.Stdout == nil {
		return io.Discard
	}
	return b.Stdout
}

func (b *CommandBase) logger() *slog.Logger {
	if b.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return b.Logger
}

// usageError is a command line that cannot run: Main prints it on one line
// and exits with ExitUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// command is one entry of the command table.
type command struct {
	name    string
	summary string
	// run parses args (its own flags and --help) and runs the command;
	// Main prints its error.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	// main, set instead of run, owns its flags, help, errors and exit
	// status.
	main func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{name: "serve", summary: "run the demo orders API behind the idempotency middleware", run: runServe},
		{name: "proxy", summary: "run a reverse proxy that adds Idempotency-Key to any HTTP service", run: runProxy},
		{name: "migrate", summary: "create or update the idempotency records table", run: runMigrate},
		{name: "purge", summary: "delete idempotency records past their retention, once", run: runPurge},
		{name: "inspect", summary: "print the idempotency record of one key: state, lease, stored answer", run: runInspect},
		{name: "keys", summary: "list the idempotency records, release a key in flight, forget a completed one", run: runKeys},
		{name: "console", summary: "serve the operator console: records by state, keys, release and forget", run: runConsole},
		{name: "check", summary: "fire identical requests with one key at a live API and verify one effect", main: runCheck},
		{name: "version", summary: "print the version of idem", run: runVersion},
	}
}

const mainHelp = `idem makes retried requests harmless (the Idempotency-Key pattern).

Usage:
  idem <command> [flags]

Commands:
%s
Run "idem <command> --help" for the flags of a command.
`

func printMainHelp(w io.Writer) {
	var b strings.Builder
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, mainHelp, b.String())
}

// Main runs the idem command line. args excludes the program name. It
// returns the exit status: ExitOK, ExitFailure, or ExitUsage for a command
// line that cannot run. Every error is one line on stderr, prefixed with the
// command ("idem serve: …"), with its control characters escaped and no
// password from a URL among args. ctx ends the command early (serve stops
// cleanly when it ends).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printMainHelp(stderr)
		return ExitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		printMainHelp(stdout)
		return ExitOK
	case "-version", "--version":
		name = "version"
		args = append([]string{name}, args[1:]...)
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		if c.main != nil {
			return c.main(ctx, args[1:], stdout, stderr)
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return ExitOK
		case errors.Is(err, flag.ErrHelp):
			return ExitOK
		}
		fmt.Fprintf(stderr, "idem %s: %s\n", c.name, errorLine(err, args[1:]))
		var ue *usageError
		if errors.As(err, &ue) {
			return ExitUsage
		}
		return ExitFailure
	}
	fmt.Fprintln(stderr, unknownCommand(name))
	return ExitUsage
}

// errorLine is err as Main prints it: one line (a driver's multi-line
// error folded), without the password of any URL among args (whatever
// quoted it: a parser, a driver, the flag package), and with every control
// character and every invisible one (a bidirectional override) escaped,
// since the text may quote what a server or a stored record holds.
func errorLine(err error, args []string) string {
	s := strings.TrimSpace(err.Error())
	s = strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
	for _, a := range args {
		s = redactURL(s, a)
	}
	return safetext.Escape(s)
}

// maxArgQuote bounds how much of an argument a message repeats.
const maxArgQuote = 64

// quoteArg quotes a command-line argument for a message, cut to
// maxArgQuote bytes.
func quoteArg(s string) string {
	if len(s) <= maxArgQuote {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:maxArgQuote]) + "…"
}

// parseFlags parses args into fs. --help prints help and the flags to
// stdout and returns flag.ErrHelp; a bad flag or a stray argument is a
// usageError.
func parseFlags(fs *flag.FlagSet, help string, args []string, stdout io.Writer) error {
	fs.SetOutput(io.Discard) // errors are reported by Main, in one line
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, help)
			printFlags(stdout, fs)
			return flag.ErrHelp
		}
		return flagParseError(fs, err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %s (run \"idem %s --help\")", quoteArg(fs.Arg(0)), fs.Name())
	}
	return nil
}

// isSet reports whether the command line gave the flag name.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// printFlags lists the flags GNU-style (--name), which the flag package
// accepts as well as -name.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	var lines []string
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		if _, ok := f.Value.(*durationFlag); ok && typ == "value" {
			typ = "duration"
		}
		head := "  --" + f.Name
		if typ != "" {
			head += " " + typ
		}
		line := head + "\n      " + strings.ReplaceAll(usage, "\n", "\n      ")
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		lines = append(lines, line)
	})
	sort.Strings(lines)
	fmt.Fprintln(w, "\nFlags:")
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

// durationFlag is a time.Duration flag whose parse error says what a
// duration looks like (the flag package's own only says "parse error").
type durationFlag struct{ p *time.Duration }

func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var(&durationFlag{p}, name, usage)
}

func (d *durationFlag) String() string {
	if d.p == nil {
		return ""
	}
	return d.p.String()
}

func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration such as 500ms, 90s, 5m or 24h")
	}
	*d.p = v
	return nil
}
