package idemsql

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql/idemsqlite"
)

func TestCompile(t *testing.T) {
	src := `SELECT @a, @b_c, @a WHERE x = @b_c`
	num := compile(src, numbered)
	if num.text != `SELECT $1, $2, $1 WHERE x = $2` || !slices.Equal(num.names, []string{"a", "b_c"}) {
		t.Errorf("numbered: %q %v", num.text, num.names)
	}
	pos := compile(src, positional)
	if pos.text != `SELECT ?, ?, ? WHERE x = ?` || !slices.Equal(pos.names, []string{"a", "b_c", "a", "b_c"}) {
		t.Errorf("positional: %q %v", pos.text, pos.names)
	}
	if got := pos.args(map[string]any{"a": 1, "b_c": 2}); !slices.Equal(got, []any{1, 2, 1, 2}) {
		t.Errorf("args = %v", got)
	}
}

// TestDialectArgs checks that every statement of every dialect names only
// arguments the store passes, so that no call panics in production.
func TestDialectArgs(t *testing.T) {
	given := map[string][]string{
		"claim":    {"tenant", "key", "fingerprint", "token", "lease", "retention"},
		"read":     {"tenant", "key", "fingerprint"},
		"replace":  {"tenant", "key", "fingerprint", "token", "lease", "retention", "steps", "old"},
		"stepsOf":  {"tenant", "key", "token"},
		"peek":     {"tenant", "key"},
		"get":      {"tenant", "key"},
		"complete": {"tenant", "key", "token", "mode", "status", "headers", "body", "ref"},
		"unit":     {"tenant", "key", "token", "mode", "status", "headers", "body", "ref", "unit"},
		"extend":   {"tenant", "key", "token", "lease"},
		"held":     {"tenant", "key", "token"},
		"release":  {"tenant", "key", "token"},
		"keep":     {"tenant", "key", "token"},
		"save":     {"tenant", "key", "token", "step", "step_len"},
		"purge":    {"limit"},
		"pick":     {"limit"},
	}
	for _, d := range []*dialect{sqliteDialect, mysqlDialect, postgresDialect} {
		queries := map[string]query{"claim": d.claim, "get": d.get, "complete": d.complete, "unit": d.completeUnitQuery(), "extend": d.extend,
			"held": d.held, "release": d.release, "purge": d.purge, "pick": d.purgePick,
			"read": d.claimRead, "replace": d.claimReplace, "stepsOf": d.stepsOf, "peek": d.peek,
			"keep": d.releaseKeep, "save": d.saveStep}
		for name, q := range queries {
			allowed := given[name]
			if name == "purge" && d.purgePick.text != "" {
				allowed = []string{"tenant", "key"} // one picked row at a time
			}
			for _, arg := range q.names {
				if !slices.Contains(allowed, arg) {
					t.Errorf("%s %s uses @%s, which the store does not pass", d.name, name, arg)
				}
			}
			// A server variable is the one "@" a statement may keep.
			if strings.Contains(strings.ReplaceAll(q.text, "@@max_allowed_packet", ""), "@") {
				t.Errorf("%s %s still holds an @: %s", d.name, name, q.text)
			}
		}
	}
}

func TestDBTimeScan(t *testing.T) {
	want := time.Date(2026, 11, 30, 8, 42, 14, 123456000, time.UTC)
	tokyo := time.FixedZone("JST", 9*3600)
	tests := []struct {
		name    string
		utcWall bool
		src     any
	}{
		{"sqlite micros", false, want.UnixMicro()},
		{"postgres timestamptz", false, want.In(tokyo)},
		{"mysql parseTime loc=UTC", true, want},
		{"mysql parseTime loc=Tokyo", true, time.Date(2026, 11, 30, 8, 42, 14, 123456000, tokyo)},
		{"mysql text", true, []byte("2026-11-30 08:42:14.123456")},
	}
	for _, tt := range tests {
		d := dbTime{utcWall: tt.utcWall}
		if err := d.Scan(tt.src); err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if !d.t.Equal(want) || d.t.Location() != time.UTC {
			t.Errorf("%s: got %v, want %v", tt.name, d.t, want)
		}
	}
	d := dbTime{}
	if err := d.Scan(nil); err != nil || !d.t.IsZero() {
		t.Errorf("NULL: %v, %v", d.t, err)
	}
	if err := d.Scan(3.5); err == nil {
		t.Error("a float scanned as a time")
	}
}

// TestSQLitePurgePlan checks that the purge walks the expires_at index
// rather than scanning the table.
func TestSQLitePurgePlan(t *testing.T) {
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := idemmigrate.Migrate(ctx, db, idemmigrate.SQLite); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+sqliteDialect.purge.text, int64(10))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	joined := strings.Join(plan, "\n")
	if !strings.Contains(joined, "USING INDEX idem_keys_expires_at_idx") {
		t.Fatalf("purge plan does not go through the expires_at index:\n%s", joined)
	}
	for _, step := range plan {
		if strings.HasPrefix(step, "SCAN idem_keys") {
			t.Fatalf("purge plan scans the whole table:\n%s", joined)
		}
	}
}
