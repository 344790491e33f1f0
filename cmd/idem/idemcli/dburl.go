package idemcli

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultDB is the --db default: a SQLite file in the working directory, so
// that `idem serve` runs on a fresh machine with nothing installed.
const DefaultDB = "sqlite:idem.db"

const dbFlagHelp = "`URL` of the database: sqlite:PATH, postgres://user@host:port/db or mysql://user[:password]@host:port/db\n(percent-encode '/', '?', '#', '@' and '%' in a password)"

// dialect names the database behind a --db URL.
type dialect string

const (
	dialectSQLite   dialect = "sqlite"
	dialectPostgres dialect = "postgres"
	dialectMySQL    dialect = "mysql"
)

// dbTarget is a parsed --db value.
type dbTarget struct {
	dialect dialect
	// path is the SQLite file.
	path string
	// url is the PostgreSQL URL, as given (pgx reads it).
	url string
	// dsn is the go-sql-driver/mysql DSN.
	dsn string
}

// parseDB reads a --db value. It only parses: nothing is opened. Its
// errors never show a password.
func parseDB(s string) (dbTarget, error) {
	switch {
	case s == "":
		return dbTarget{}, usagef("--db is empty; want sqlite:PATH, postgres://… or mysql://…")
	case strings.HasPrefix(s, "sqlite:"):
		path := strings.TrimPrefix(s, "sqlite:")
		// sqlite:///abs/path and sqlite://rel.db read as the path after //.
		path = strings.TrimPrefix(path, "//")
		if path == "" {
			return dbTarget{}, usagef("--db %q: the SQLite file path is empty (try sqlite:idem.db)", s)
		}
		return dbTarget{dialect: dialectSQLite, path: path}, nil
	case strings.HasPrefix(s, "postgres://"), strings.HasPrefix(s, "postgresql://"):
		if err := checkURLShape("--db", s); err != nil {
			return dbTarget{}, err
		}
		if _, err := pgxpool.ParseConfig(s); err != nil {
			return dbTarget{}, usagef("--db: %v", redactURL(err.Error(), s))
		}
		return dbTarget{dialect: dialectPostgres, url: s}, nil
	case strings.HasPrefix(s, "mysql://"):
		if err := checkURLShape("--db", s); err != nil {
			return dbTarget{}, err
		}
		dsn, err := mysqlDSN(s)
		if err != nil {
			return dbTarget{}, err
		}
		return dbTarget{dialect: dialectMySQL, dsn: dsn}, nil
	}
	// The value itself is not echoed: a mistyped scheme may come with a
	// password.
	return dbTarget{}, usagef("--db %s: unknown form; want sqlite:PATH, postgres://… or mysql://…", schemeOnly(s))
}

// schemeOnly names raw by its scheme alone ("mariadb://…"), for messages
// about a value that may hold a password.
func schemeOnly(raw string) string {
	i := strings.Index(raw, "://")
	if i <= 0 || i > 16 {
		return "(not a URL)"
	}
	for _, c := range raw[:i] {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '-' || c == '.') {
			return "(not a URL)"
		}
	}
	return strconv.Quote(raw[:i+3] + "…")
}

// checkURLShape refuses a URL that a parser would cut in the wrong place,
// the usual cause being a generated password holding '/', '?', '#' or '@'
// unencoded: the parsers then take part of the password for the host, the
// database or the query, and repeat it in their errors, or even connect
// with it. The message says what to fix and never repeats the value.
func checkURLShape(flagName, raw string) error {
	const hidden = " (the value is not shown: it may hold a password)"
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil
	}
	if strings.Contains(rest, "#") {
		return usagef("%s: the URL holds a '#'; percent-encode it as %%23 (in a password, say)%s", flagName, hidden)
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		if strings.Contains(rest[i:], "@") {
			return usagef("%s: an '@' after the host; if the password holds '/', '?' or '@', percent-encode them (%%2F, %%3F, %%40)%s", flagName, hidden)
		}
		authority = rest[:i]
	}
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		userinfo := authority[:at]
		if strings.Contains(userinfo, "@") {
			return usagef("%s: two '@' before the host; percent-encode an '@' in the user or password as %%40%s", flagName, hidden)
		}
		for i := 0; i < len(userinfo); i++ {
			if userinfo[i] == '%' && (i+2 >= len(userinfo) || !isHex(userinfo[i+1]) || !isHex(userinfo[i+2])) {
				return usagef("%s: a '%%' in the user or password is not followed by two hex digits; percent-encode '%%' itself as %%25%s", flagName, hidden)
			}
		}
	}
	return nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// mysqlDSN translates mysql://user:password@host:port/db?param=value into
// the DSN go-sql-driver/mysql reads (user:password@tcp(host:port)/db?…),
// with parseTime on so that DATETIME columns scan into time.Time.
func mysqlDSN(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		// url's error repeats the URL, password included.
		return "", usagef("--db: not a valid mysql:// URL (want mysql://user[:password]@host:port/db)")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return "", usagef("--db: a mysql:// URL needs a database name, as in mysql://root@127.0.0.1:3306/test")
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1:3306"
	} else if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "3306")
	}
	cfg := mysql.NewConfig()
	cfg.Net = "tcp"
	cfg.Addr = host
	cfg.DBName = db
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	// Pass the query parameters through the driver's own parser, so that
	// its known options (tls, timeout, …) are recognised and checked.
	withParams := cfg.FormatDSN()
	if u.RawQuery != "" {
		withParams += "?" + u.RawQuery
	}
	parsed, err := mysql.ParseDSN(withParams)
	if err != nil {
		return "", usagef("--db: %v", redactURL(redactURL(err.Error(), s), withParams))
	}
	parsed.ParseTime = true
	return parsed.FormatDSN(), nil
}

// redact hides the target's password in msg.
func (t dbTarget) redact(msg string) string {
	return redactURL(redactURL(msg, t.url), t.dsn)
}

// describe names the target in logs and errors without its password.
func (t dbTarget) describe() string {
	switch t.dialect {
	case dialectSQLite:
		return "sqlite:" + t.path
	case dialectPostgres:
		if u, err := url.Parse(t.url); err == nil {
			return redactURL(u.Redacted(), t.url)
		}
		return "postgres"
	case dialectMySQL:
		if cfg, err := mysql.ParseDSN(t.dsn); err == nil {
			user := cfg.User
			if cfg.Passwd != "" {
				user += ":xxxxx"
			}
			return fmt.Sprintf("mysql://%s@%s/%s", user, cfg.Addr, cfg.DBName)
		}
		return "mysql"
	}
	return string(t.dialect)
}
