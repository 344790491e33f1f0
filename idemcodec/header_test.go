package idemcodec_test

import (
	"testing"

	"github.com/idem-go/idem/idemcodec"
)

// Stored names are accepted in any case (gRPC metadata keys are
// lowercase), but never one name in two spellings, which a replay would
// send twice.
func TestHeaderNamesInAnyCase(t *testing.T) {
	for _, h := range []map[string][]string{
		{"content-type": {"application/json"}, "x-request-kind": {"a"}},
		{"Content-Type": {"application/json"}, "ETag": {`"v1"`}},
	} {
		b, err := idemcodec.MarshalHeader(h)
		if err != nil {
			t.Fatalf("MarshalHeader(%v): %v", h, err)
		}
		if _, err := idemcodec.UnmarshalHeader(b); err != nil {
			t.Fatalf("UnmarshalHeader(%s): %v", b, err)
		}
	}
	if _, err := idemcodec.MarshalHeader(map[string][]string{"Content-Type": {"a"}, "content-type": {"b"}}); err == nil {
		t.Error("MarshalHeader accepted one name in two spellings")
	}
	if _, err := idemcodec.UnmarshalHeader([]byte(`{"Etag":["a"],"ETAG":["b"]}`)); err == nil {
		t.Error("UnmarshalHeader accepted one name in two spellings")
	}
}
