package fieldtext

import "testing"

// Every character a terminal acts on counts: C0 but tab, DEL, and C1 (CSI
// U+009B and OSC U+009D start escape sequences as ESC [ and ESC ] do).
func TestIsCTL(t *testing.T) {
	for _, c := range []struct {
		r    rune
		want bool
	}{
		{0x00, true}, {'\n', true}, {'\r', true}, {0x1b, true}, {0x1f, true},
		{'\t', false}, {' ', false}, {'~', false},
		{0x7f, true},
		{0x80, true}, {0x85, true}, {0x9b, true}, {0x9d, true}, {0x9f, true},
		{0xa0, false}, {'é', false}, {0xfffd, false}, {0x2028, false},
	} {
		if got := IsCTL(c.r); got != c.want {
			t.Errorf("IsCTL(%U) = %v, want %v", c.r, got, c.want)
		}
	}
}

func TestEscapeAndSpaced(t *testing.T) {
	for _, c := range []struct {
		in, escaped, spaced string
	}{
		{"plain text, é, \ttab", "plain text, é, \ttab", "plain text, é, \ttab"},
		{"a\nb\rc", `a\nb\rc`, "a b c"},
		{"esc\x1b[31m", `esc\x1b[31m`, "esc [31m"},
		{"del\x7f", `del\x7f`, "del "},
		{"csi\u009b31m", `csi\u009b31m`, "csi 31m"},
		{"osc\u009d0;title\u009c", `osc\u009d0;title\u009c`, "osc 0;title "},
		// Invalid UTF-8 is not a control character: kept byte for byte,
		// never turned into U+FFFD.
		{"raw\x9b\xff\n", "raw\x9b\xff\\n", "raw\x9b\xff "},
		{"raw\x9b only", "raw\x9b only", "raw\x9b only"},
	} {
		if got := Escape(c.in); got != c.escaped {
			t.Errorf("Escape(%q) = %q, want %q", c.in, got, c.escaped)
		}
		if got := Spaced(c.in); got != c.spaced {
			t.Errorf("Spaced(%q) = %q, want %q", c.in, got, c.spaced)
		}
		if Clean(Escape(c.in)) != true || Clean(Spaced(c.in)) != true {
			t.Errorf("Escape or Spaced of %q still holds a control character", c.in)
		}
	}
}
