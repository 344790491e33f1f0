package idemgrpc_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A call that carries its key keeps it: a program retrying a call made
// before a restart sets the key itself. Each other call gets a key of
// its own.
func TestClientKeepsAKeySetByHand(t *testing.T) {
	var runs atomic.Int64
	s := newServer(t, nil, idemgrpc.Config{}, func(ctx context.Context, req *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
		runs.Add(1)
		return wrapperspb.Bytes([]byte("ok")), nil
	})
	n := 0
	conn := dial(t, s.addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(&idemgrpc.ClientConfig{NewKey: func() string {
		n++
		return "generated-" + string(rune('0'+n))
	}})))
	call(as(t.Context(), "acme", "by-hand"), conn, methodCreate, "a")
	call(as(t.Context(), "acme", ""), conn, methodCreate, "a")
	call(as(t.Context(), "acme", ""), conn, methodCreate, "a")
	keys := s.seenKeys()
	if len(keys) != 3 || keys[0] != "by-hand" || keys[1] != "generated-1" || keys[2] != "generated-2" {
		t.Fatalf("keys %q, want by-hand, generated-1, generated-2", keys)
	}
	if runs.Load() != 3 {
		t.Fatalf("%d runs, want 3 (three logical calls)", runs.Load())
	}
}

func TestGatewayHeaderMatcher(t *testing.T) {
	next := func(key string) (string, bool) {
		if key == "Authorization" {
			return "authorization", true
		}
		return "", false
	}
	m := idemgrpc.GatewayHeaderMatcher(next)
	for _, c := range []struct {
		in, out string
		ok      bool
	}{
		{"Idempotency-Key", "idempotency-key", true},
		{"idempotency-key", "idempotency-key", true},
		{"Authorization", "authorization", true},
		{"X-Other", "", false},
	} {
		if out, ok := m(c.in); out != c.out || ok != c.ok {
			t.Errorf("matcher(%q) = %q, %v; want %q, %v", c.in, out, ok, c.out, c.ok)
		}
	}
	if _, ok := idemgrpc.GatewayHeaderMatcher(nil)("X-Other"); ok {
		t.Error("a nil next matcher forwarded another header")
	}
}
