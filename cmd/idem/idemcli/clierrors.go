package idemcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// suggest returns the candidate closest to typed, for a "did you mean"
// hint, or "" when none is close: at most two edits away (one for names
// of up to four letters), or typed a prefix of exactly one.
func suggest(typed string, candidates []string) string {
	best, bestDist := "", -1
	for _, c := range candidates {
		d := editDistance(typed, c)
		if bestDist < 0 || d < bestDist {
			best, bestDist = c, d
		}
	}
	limit := 2
	switch n := utf8.RuneCountInString(typed); {
	case n <= 2:
		limit = 0 // one letter off a two-letter name is any name
	case n <= 4:
		limit = 1
	}
	if bestDist >= 0 && bestDist <= limit {
		return best
	}
	prefixed := ""
	for _, c := range candidates {
		if len(typed) >= 2 && strings.HasPrefix(c, typed) {
			if prefixed != "" {
				return ""
			}
			prefixed = c
		}
	}
	return prefixed
}

// editDistance is the Levenshtein distance of a and b, in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// unknownCommand is Main's line for a command that does not exist.
func unknownCommand(name string) string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	hint := ""
	if s := suggest(strings.TrimLeft(name, "-"), names); s != "" {
		hint = fmt.Sprintf("; did you mean %q?", s)
	}
	return fmt.Sprintf("idem: unknown command %s%s (run \"idem --help\" for the list)", quoteArg(name), hint)
}

// flagParseError rewrites the flag package's error for fs as one line
// that names flags GNU-style (--name), and suggests the flag meant when
// one is close to an unknown one.
func flagParseError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	const undefined = "flag provided but not defined: -"
	if name, ok := strings.CutPrefix(msg, undefined); ok {
		name = strings.TrimPrefix(name, "-")
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		hint := ""
		if s := suggest(name, names); s != "" {
			hint = fmt.Sprintf("; did you mean --%s?", s)
		}
		if !plainName(name) {
			// Not shown: a password that begins with a dash, split by
			// the shell from its flag's value at a space, reads as a
			// flag.
			return usagef("an unknown flag (not shown: it may be a credential split from a flag's value at a space%s) (run \"idem %s --help\")", hint, fs.Name())
		}
		return usagef("unknown flag --%s%s (run \"idem %s --help\")", name, hint, fs.Name())
	}
	// The flag package names flags with one dash; the help uses two.
	return usagef("%s", strings.Replace(msg, " -", " --", 1))
}

// plainName reports a name that reads as a flag's: lower-case words
// joined by dashes, short.
func plainName(name string) bool {
	if name == "" || len(name) > 20 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r == '-') {
			return false
		}
	}
	return true
}

// intFlag is an int flag whose parse error says what it wants (the flag
// package's own only says "parse error").
type intFlag struct{ p *int }

func intVar(fs *flag.FlagSet, p *int, name string, value int, usage string) {
	*p = value
	fs.Var(&intFlag{p}, name, usage)
}

func (f *intFlag) String() string {
	if f.p == nil {
		return ""
	}
	return strconv.Itoa(*f.p)
}

func (f *intFlag) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("want a whole number, such as 1000")
	}
	*f.p = v
	return nil
}

// notMigrated adds to err, when it says that the records table is
// missing, what to run.
func notMigrated(err error) error {
	if err == nil || !isUndefinedTable(err) {
		return err
	}
	return fmt.Errorf("%w (the idempotency records table is not there: run \"idem migrate --db …\" on this database first)", err)
}

// isUndefinedTable reports a database's "no such table" error:
// PostgreSQL's 42P01, MySQL's 1146, SQLite's "no such table".
func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "42P01"
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		return myErr.Number == 1146
	}
	return strings.Contains(err.Error(), "no such table")
}

// pgConnectError is pgx's connection error as one line: pgx lists each
// attempt on a line of its own (one per address and TLS mode), often the
// same error twice, after a "failed to connect to `user=… database=…`:"
// that the command's own message says better.
func pgConnectError(err error) string {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return err.Error()
	}
	var attempts []error
	inner := ce.Unwrap()
	if j, ok := inner.(interface{ Unwrap() []error }); ok {
		attempts = j.Unwrap()
	} else if inner != nil {
		attempts = []error{inner}
	}
	var parts []string
	for _, a := range attempts {
		// Each attempt says "host:port (ip): dial error: <the dial's
		// error>"; the dial's error names the address already.
		if u := errors.Unwrap(a); u != nil {
			a = u
		}
		if s := a.Error(); !slices.Contains(parts, s) {
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		return err.Error()
	}
	return strings.Join(parts, "; ")
}

// quietMySQL drops what go-sql-driver/mysql logs (its packets.go lines
// about a server that does not speak its protocol): the command says
// what failed on its one line.
var quietMySQL sync.Once

func silenceMySQL() {
	quietMySQL.Do(func() { _ = mysql.SetLogger(log.New(io.Discard, "", 0)) })
}

// reachTimeout bounds the first contact with a database: a server that
// accepts the connection and never answers as the database should (a
// MySQL URL pointing at Redis) would otherwise hang the command.
const reachTimeout = 10 * time.Second

// reachContext is ctx bounded by reachTimeout.
func reachContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, reachTimeout)
}
