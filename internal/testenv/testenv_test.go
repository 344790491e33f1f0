package testenv

import "testing"

func TestParseMySQLDSN(t *testing.T) {
	for _, tc := range []struct{ in, addr, want string }{
		{"root@tcp(127.0.0.1:3306)/test", "127.0.0.1:3306", "root@tcp(127.0.0.1:3306)/x?parseTime=true"},
		{"u:p@tcp(db:3307)/test?timeout=5s", "db:3307", "u:p@tcp(db:3307)/x?timeout=5s&parseTime=true"},
		{"u:p@tcp(db:3307)/test?parseTime=false", "db:3307", "u:p@tcp(db:3307)/x?parseTime=false"},
		{"/test", "127.0.0.1:3306", "/x?parseTime=true"},
	} {
		d, err := parseMySQLDSN(tc.in)
		if err != nil || d.addr != tc.addr || d.withDatabase("x") != tc.want {
			t.Errorf("parseMySQLDSN(%q) = %+v, %v → %q; want addr %q, %q", tc.in, d, err, d.withDatabase("x"), tc.addr, tc.want)
		}
	}
}
