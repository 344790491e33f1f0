package idemmigrate

import (
	"io/fs"
	"slices"
	"testing"
)

func TestFilesListsEveryDialect(t *testing.T) {
	for _, d := range Dialects() {
		names, err := fs.Glob(Files(d), "*.sql")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(names, "0001_idem_keys.sql") {
			t.Errorf("%s: files %v lack 0001_idem_keys.sql", d, names)
		}
		ms, err := migrations(d)
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		for i := 1; i < len(ms); i++ {
			if ms[i-1].version >= ms[i].version {
				t.Errorf("%s: migrations out of order: %s before %s", d, ms[i-1].name, ms[i].name)
			}
		}
	}
}

func TestFilesUnknownDialect(t *testing.T) {
	names, err := fs.Glob(Files("oracle"), "*.sql")
	if err != nil || len(names) != 0 {
		t.Fatalf("Files(oracle) = %v, %v; want nothing", names, err)
	}
	if _, err := migrations("oracle"); err == nil {
		t.Fatal("migrations(oracle) did not fail")
	}
}

func TestParseDialect(t *testing.T) {
	for in, want := range map[string]Dialect{"postgres": Postgres, "PostgreSQL": Postgres, "pgx": Postgres,
		"sqlite3": SQLite, " SQLite ": SQLite, "mariadb": MySQL, "mysql": MySQL} {
		if got, err := ParseDialect(in); err != nil || got != want {
			t.Errorf("ParseDialect(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if got, err := ParseDialect("oracle"); err == nil {
		t.Errorf("ParseDialect(oracle) = %q, want an error", got)
	}
}
