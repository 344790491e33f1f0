package safetext

import (
	"encoding/json"
	"testing"
)

// Every bidirectional control, the other invisible characters and the C1
// controls come out of JSON as \u escapes: still valid JSON, the same
// string once decoded, and nothing a terminal would apply.
func TestJSON(t *testing.T) {
	invisible := []rune{
		0x202a, 0x202b, 0x202c, 0x202d, 0x202e, // embeddings and overrides
		0x2066, 0x2067, 0x2068, 0x2069, // isolates
		0x200b, 0x200d, 0x200e, 0x200f, 0x2060, 0xfeff, 0x00ad, 0x061c, // zero-width, marks, BOM, soft hyphen
		0xe0041,          // a tag character, beyond the BMP
		0x9b, 0x9d, 0x7f, // C1 and DEL
	}
	for _, r := range invisible {
		key := "order-" + string(r) + "42"
		raw, err := json.Marshal(map[string]string{"key": key})
		if err != nil {
			t.Fatal(err)
		}
		out := JSON(raw)
		for _, c := range string(out) {
			if IsInvisible(c) || c >= 0x7f && c <= 0x9f {
				t.Errorf("U+%04X: %q still holds U+%04X", r, out, c)
			}
		}
		var back map[string]string
		if err := json.Unmarshal(out, &back); err != nil || back["key"] != key {
			t.Errorf("U+%04X: %s decodes to %q, %v; want %q", r, out, back["key"], err, key)
		}
	}
	plain := []byte(`{"key":"order-42 é 漢字"}`)
	if got := JSON(plain); string(got) != string(plain) {
		t.Errorf("JSON(%s) = %s, want it unchanged", plain, got)
	}
}

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"order-42":            "order-42",
		"abc\u202edcba":       `abc\u202edcba`,
		"a\u2066b\u2069":      `a\u2066b\u2069`,
		"zero\u200bwidth":     `zero\u200bwidth`,
		"line\nbreak\x1b[31m": `line\nbreak\x1b[31m`,
		"c1\u009b":            `c1\u009b`,
		"tag\U000e0041":       `tag\U000e0041`,
		"é 漢字":                "é 漢字",
		"bad\xffutf8":         "bad\xffutf8",
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
}
