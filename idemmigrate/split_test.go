package idemmigrate

import (
	"slices"
	"testing"
)

func TestSplitStatements(t *testing.T) {
	tests := []struct {
		name   string
		script string
		want   []string
	}{
		{"empty", "  \n-- only a comment\n", nil},
		{"two", "CREATE TABLE a (x INT);\nCREATE INDEX i ON a (x);\n", []string{"CREATE TABLE a (x INT)", "CREATE INDEX i ON a (x)"}},
		{"no trailing semicolon", "SELECT 1", []string{"SELECT 1"}},
		{"semicolon in quotes", `INSERT INTO a VALUES ('x;y', "p;q", ` + "`c;d`" + `);`, []string{`INSERT INTO a VALUES ('x;y', "p;q", ` + "`c;d`" + `)`}},
		{"escaped and doubled quotes", `SELECT 'it''s;', 'a\';b';SELECT 2`, []string{`SELECT 'it''s;', 'a\';b'`, "SELECT 2"}},
		{"semicolon in comments", "SELECT 1 -- not; here\n/* nor; here */;# nor; here\nSELECT 2;", []string{"SELECT 1 -- not; here\n/* nor; here */", "# nor; here\nSELECT 2"}},
		{"trailing comment statement", "SELECT 1;\n-- the end;\n", []string{"SELECT 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := splitStatements(tt.script); !slices.Equal(got, tt.want) {
				t.Errorf("splitStatements(%q)\n got %q\nwant %q", tt.script, got, tt.want)
			}
		})
	}
}
