package idemconnect_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemconnect"
	"github.com/idem-go/idem/idemmem"
	"google.golang.org/protobuf/types/known/structpb"
)

// The fingerprint is the message's, not its encoding's: a retry sent in
// JSON after a binary first call (another client of the same service) is
// the same request, replayed; another message under the key is refused.
func TestFingerprintAcrossCodecs(t *testing.T) {
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close(context.Background())
	in := idemconnect.NewInterceptor(engine, &idemconnect.Config{SharedKeySpace: true, Logger: slog.New(slog.DiscardHandler)})
	var runs atomic.Int64
	const procedure = "/idemconnect.test.Orders/Create"
	h := connect.NewUnaryHandler(procedure, func(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
		runs.Add(1)
		return connect.NewResponse(req.Msg), nil
	}, connect.WithInterceptors(in))
	srv := httptest.NewServer(h)
	defer srv.Close()
	binary := connect.NewClient[structpb.Struct, structpb.Struct](http.DefaultClient, srv.URL+procedure)
	json := connect.NewClient[structpb.Struct, structpb.Struct](http.DefaultClient, srv.URL+procedure, connect.WithProtoJSON())
	send := func(c *connect.Client[structpb.Struct, structpb.Struct], fields map[string]any) (*connect.Response[structpb.Struct], error) {
		msg, err := structpb.NewStruct(fields)
		if err != nil {
			t.Fatal(err)
		}
		req := connect.NewRequest(msg)
		req.Header().Set(idemconnect.HeaderKey, "k")
		return c.CallUnary(t.Context(), req)
	}
	// Many map entries: their order differs between encodings and runs.
	order := map[string]any{"cart": "c1", "total": 1200.0, "a": "x", "b": true, "c": "y", "d": 2.0, "e": "z"}
	if _, err := send(binary, order); err != nil {
		t.Fatal(err)
	}
	again, err := send(json, order)
	if err != nil || again.Header().Get(idemconnect.HeaderReplayed) != "true" {
		t.Fatalf("the same message in JSON: %v, replayed %q; want the replay", err, again.Header().Get(idemconnect.HeaderReplayed))
	}
	if got := again.Msg.GetFields()["cart"].GetStringValue(); got != "c1" {
		t.Fatalf("the replayed message: %v", again.Msg)
	}
	other := map[string]any{"cart": "c1", "total": 1300.0}
	if _, err := send(json, other); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("another message under the key: %v, want FAILED_PRECONDITION", err)
	}
	if runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.Load())
	}
}
