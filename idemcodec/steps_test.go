package idemcodec_test

import (
	"bytes"
	"slices"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// FuzzUnmarshalSteps feeds arbitrary stored bytes to UnmarshalSteps, the
// decoder of the recovery points every store returns: damaged bytes must
// never panic it, whatever lengths they claim. What it
// accepts re-encodes (MarshalSteps) to bytes that decode to the same
// steps; appending a copy of the encoding, as a store appending steps
// again would, changes nothing (a name keeps its first value); and the
// values it returns are copies.
//
// To fuzz:
//
//	go test -run '^$' -fuzz '^FuzzUnmarshalSteps$' -fuzztime 60s ./idemcodec
func FuzzUnmarshalSteps(f *testing.F) {
	for _, seed := range [][]idem.RecordedStep{
		nil,
		{{Name: "charge", Value: []byte(`{"id":"ch_1"}`)}},
		{{Name: "charge", Value: []byte("a")}, {Name: "charge", Value: []byte("b")}},
		{{Name: "", Value: nil}, {Name: "email", Value: []byte{0, 1, 2, 0xff}}},
		{{Name: "big", Value: bytes.Repeat([]byte("x"), 300)}},
	} {
		f.Add(idemcodec.MarshalSteps(seed))
	}
	for _, raw := range []string{"\x05abc", "\x01a\xff", "\x01a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", "\x80", "\x01a\x80\x00"} {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		orig := bytes.Clone(b)
		steps, err := idemcodec.UnmarshalSteps(b)
		if err != nil {
			if steps != nil {
				t.Fatalf("UnmarshalSteps(%q) returned steps with error %v", b, err)
			}
			return
		}
		names := map[string]bool{}
		for _, s := range steps {
			if names[s.Name] {
				t.Fatalf("UnmarshalSteps(%q) returned %q twice", b, s.Name)
			}
			names[s.Name] = true
		}
		enc := idemcodec.MarshalSteps(steps)
		if len(enc) > len(b) {
			t.Fatalf("re-encoding %q grew to %q", b, enc)
		}
		again, err := idemcodec.UnmarshalSteps(enc)
		if err != nil || !equalSteps(again, steps) {
			t.Fatalf("round trip of %q: %v, %v; want %v", enc, again, err, steps)
		}
		doubled, err := idemcodec.UnmarshalSteps(append(slices.Clone(b), b...))
		if err != nil || !equalSteps(doubled, steps) {
			t.Fatalf("%q appended to itself decodes to %v, %v; want %v", b, doubled, err, steps)
		}
		for i := range b {
			b[i] ^= 0xff
		}
		if !equalSteps(steps, mustSteps(t, orig)) {
			t.Fatalf("the steps decoded from %q share its bytes", orig)
		}
	})
}

func mustSteps(t *testing.T, b []byte) []idem.RecordedStep {
	t.Helper()
	steps, err := idemcodec.UnmarshalSteps(b)
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

func equalSteps(a, b []idem.RecordedStep) bool {
	return slices.EqualFunc(a, b, func(x, y idem.RecordedStep) bool {
		return x.Name == y.Name && bytes.Equal(x.Value, y.Value)
	})
}

// MarshalSteps and AppendStep agree, and their concatenation is the
// encoding of the concatenated lists: what a store appending with SQL ||
// or Redis APPEND relies on.
func TestStepsEncoding(t *testing.T) {
	a := []idem.RecordedStep{{Name: "reserve", Value: []byte("r_1")}, {Name: "charge", Value: []byte(`"ch_1"`)}}
	b := []idem.RecordedStep{{Name: "charge", Value: []byte("again")}, {Name: "email", Value: nil}}
	joined := append(idemcodec.MarshalSteps(a), idemcodec.MarshalSteps(b)...)
	got, err := idemcodec.UnmarshalSteps(joined)
	want := []idem.RecordedStep{a[0], a[1], {Name: "email", Value: []byte{}}}
	if err != nil || !equalSteps(got, want) {
		t.Fatalf("UnmarshalSteps of two encodings = %v, %v; want %v (charge keeps its first value)", got, err, want)
	}
	var appended []byte
	for _, s := range append(slices.Clone(a), b...) {
		appended = idemcodec.AppendStep(appended, s.Name, s.Value)
	}
	if !bytes.Equal(appended, joined) {
		t.Errorf("AppendStep one by one = %q, want MarshalSteps' %q", appended, joined)
	}
	if idemcodec.MarshalSteps(nil) != nil {
		t.Error("MarshalSteps(nil) is not nil")
	}
	for _, bad := range []string{"\x05abc", "\x01a", "\x01a\x05xy", "\x80"} {
		if steps, err := idemcodec.UnmarshalSteps([]byte(bad)); err == nil {
			t.Errorf("UnmarshalSteps(%q) = %v, want an error", bad, steps)
		}
	}
}
