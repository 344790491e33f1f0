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

const dbFlagHelp = "`URL` of the database: sqlite:PATH, postgres://user@host:port/db or mysql://user[:password]@host:port/db"

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

// parseDB reads a --db value. It only parses: nothing is opened.
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
		if _, err := pgxpool.ParseConfig(s); err != nil {
			return dbTarget{}, usagef("--db: %v", redactURL(err.Error(), s))
		}
		return dbTarget{dialect: dialectPostgres, url: s}, nil
	case strings.HasPrefix(s, "mysql://"):
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
	if i := strings.Index(raw, "://"); i > 0 && i <= 16 {
		return strconv.Quote(raw[:i+3] + "…")
	}
	return "(not a URL)"
}

// mysqlDSN translates mysql://user:password@host:port/db?param=value into
// the DSN go-sql-driver/mysql reads (user:password@tcp(host:port)/db?…),
// with parseTime on so that DATETIME columns scan into time.Time.
func mysqlDSN(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		// url's error repeats the URL, password included.
		return "", usagef("--db: not a valid mysql:// URL")
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
		return "", usagef("--db: %v", err)
	}
	parsed.ParseTime = true
	return parsed.FormatDSN(), nil
}

// redactURL hides the secrets of raw in msg, since errors end up in logs:
// the password of its user information and the values of its password
// parameters, found by hand, so that a URL too malformed for net/url (whose
// errors repeat it whole) is covered too.
func redactURL(msg, raw string) string {
	for _, secret := range urlSecrets(raw) {
		msg = strings.ReplaceAll(msg, secret, "xxxxx")
		if unescaped, err := url.QueryUnescape(secret); err == nil && unescaped != "" {
			msg = strings.ReplaceAll(msg, unescaped, "xxxxx")
		}
	}
	return msg
}

// urlSecrets returns the secrets raw carries: scheme://user:SECRET@host…
// and ?password=SECRET (or sslpassword, passwd, pass).
func urlSecrets(raw string) []string {
	var out []string
	rest := raw
	if i := strings.Index(rest, "://"); i >= 0 {
		rest = rest[i+3:]
	}
	authority := rest
	if i := strings.IndexAny(authority, "/?#"); i >= 0 {
		authority = authority[:i]
	}
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		if _, pw, ok := strings.Cut(authority[:at], ":"); ok && pw != "" {
			out = append(out, pw)
		}
	}
	if _, query, ok := strings.Cut(raw, "?"); ok {
		query, _, _ = strings.Cut(query, "#")
		for _, part := range strings.Split(query, "&") {
			name, value, _ := strings.Cut(part, "=")
			switch strings.ToLower(name) {
			case "password", "sslpassword", "passwd", "pass":
				if value != "" {
					out = append(out, value)
				}
			}
		}
	}
	return out
}

// describe names the target in logs without its password.
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
			return fmt.Sprintf("mysql://%s@%s/%s", cfg.User, cfg.Addr, cfg.DBName)
		}
		return "mysql"
	}
	return string(t.dialect)
}
