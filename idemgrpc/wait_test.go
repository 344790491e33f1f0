package idemgrpc_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/idemrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The wait mode is on by default and ends before the caller's deadline:
// a duplicate whose deadline comes before the first call's answer reads
// UNAVAILABLE with RetryInfo, not its own DEADLINE_EXCEEDED; one with
// time enough gets the answer replayed.
func TestWaitEndsBeforeTheDeadline(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	s := newServer(t, nil, idemgrpc.Config{}, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		close(started)
		<-release
		return wrapperspb.Bytes([]byte("done")), nil
	})
	conn := dial(t, s.addr)
	first := make(chan answer, 1)
	go func() { first <- call(as(t.Context(), "acme", "k"), conn, methodCreate, "a") }()
	<-started

	short, cancel := context.WithTimeout(as(t.Context(), "acme", "k"), 300*time.Millisecond)
	defer cancel()
	if a := call(short, conn, methodCreate, "a"); a.code != codes.Unavailable || a.reason != "IDEMPOTENCY_KEY_IN_FLIGHT" || a.retryAfter <= 0 {
		t.Fatalf("a duplicate with a short deadline: %v %q RetryInfo %v, want UNAVAILABLE IDEMPOTENCY_KEY_IN_FLIGHT with a delay", a.code, a.reason, a.retryAfter)
	}

	long := make(chan answer, 1)
	go func() { long <- call(as(t.Context(), "acme", "k"), conn, methodCreate, "a") }()
	for s.attempts.Load() < 3 { // the first, the short duplicate, the long one
		time.Sleep(time.Millisecond)
	}
	close(release)
	if a := <-first; a.err != nil || a.replayed {
		t.Fatalf("the first call: %+v", a)
	}
	if a := <-long; a.err != nil || !a.replayed || a.body != "done" {
		t.Fatalf("a duplicate that waited: %+v, want the replay", a)
	}
}

// Map entries in any order are one request.
func TestFingerprintOfMaps(t *testing.T) {
	fields := map[string]any{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		fields[k] = k + "-value"
	}
	m, err := structpb.NewStruct(fields)
	if err != nil {
		t.Fatal(err)
	}
	want := idemrpc.Fingerprint(createOrder, m)
	for range 20 {
		wire, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		again := &structpb.Struct{}
		if err := proto.Unmarshal(wire, again); err != nil {
			t.Fatal(err)
		}
		if got := idemrpc.Fingerprint(createOrder, again); !bytes.Equal(got, want) {
			t.Fatal("the same map got another fingerprint")
		}
	}
	fields["h"] = "other"
	other, _ := structpb.NewStruct(fields)
	if bytes.Equal(idemrpc.Fingerprint(createOrder, other), want) {
		t.Fatal("another map value got the same fingerprint")
	}
}
