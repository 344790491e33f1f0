// Package idemconnecttest runs the front-end conformance suite
// (idemfronttest) against idemconnect, over a real Connect handler and
// client on loopback, in each of Connect's protocols:
//
//	func TestConformance(t *testing.T) {
//		idemfronttest.Exercise(t, idemconnecttest.Harness{Protocol: idemconnecttest.GRPC}, idemconnecttest.Features, nil)
//	}
package idemconnecttest

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemconnect"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemgrpc/idemgrpctest"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Procedure is the suite's procedure.
const Procedure = "/idemconnecttest.Suite/Call"

// Protocol is the protocol the client speaks.
type Protocol int

// The protocols: Connect's own (binary, over HTTP/1.1), Connect's own
// with JSON, gRPC and gRPC-Web (over HTTP/2).
const (
	Connect Protocol = iota
	ConnectJSON
	GRPC
	GRPCWeb
)

// Features is what idemconnect cannot do for the suite: a handler that
// ends its goroutine (runtime.Goexit) is answered by Connect's own
// deferred close as an empty success over Connect's protocol, which no
// interceptor can stop (the engine still holds or releases the key as it
// should); the case is left out.
var Features = idemfronttest.Features{NoGoexit: true}

// The headers carrying the suite's tenant (binary) and the call's name.
const (
	headerTenant = "Idemfronttest-Tenant-Bin"
	headerCall   = "Idemfronttest-Call"
)

// Harness is idemfronttest.Harness for idemconnect.
type Harness struct {
	Protocol Protocol
	// Config is the interceptor's base configuration; Serve sets
	// TenantFunc, WaitInFlight, the limits and a discarding Logger.
	Config idemconnect.Config
}

// TenantFromHeader is the suite's tenant rule.
func TenantFromHeader(_ context.Context, h http.Header) (string, error) {
	v := h.Values(headerTenant)
	if len(v) != 1 {
		return "", errors.New("idemconnecttest: no tenant")
	}
	b, err := connect.DecodeBinaryHeader(v[0])
	return string(b), err
}

// Serve implements idemfronttest.Harness.
func (h Harness) Serve(t *testing.T, engine *idem.Engine, opts idemfronttest.Options, handler idemfronttest.Handler) idemfronttest.Client {
	t.Helper()
	cfg := h.Config
	cfg.TenantFunc = TenantFromHeader
	cfg.SharedKeySpace = false
	cfg.WaitInFlight = opts.WaitInFlight
	if opts.WaitInFlight == 0 {
		cfg.WaitInFlight = -1
	}
	if opts.MaxRequestBody > 0 {
		cfg.MaxRequestBytes = idemgrpctest.RequestBytes(opts.MaxRequestBody)
	}
	if opts.MaxResponseBody > 0 {
		cfg.MaxResponseBytes = idemgrpctest.ResponseBytes(opts.MaxResponseBody)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	in, err := idemconnect.New(engine, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	served := connect.NewUnaryHandler(Procedure, func(ctx context.Context, req *connect.Request[wrapperspb.BytesValue]) (*connect.Response[wrapperspb.BytesValue], error) {
		resp, err := idemgrpctest.Handle(ctx, handler, req.Msg)
		if err != nil {
			return nil, toConnect(err)
		}
		return connect.NewResponse(resp), nil
	}, connect.WithInterceptors(in))
	c := &client{ended: map[string]chan struct{}{}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ch := c.endedChan(r.Header.Get(headerCall)); ch != nil {
			context.AfterFunc(r.Context(), func() { close(ch) })
		}
		served.ServeHTTP(w, r)
	}))
	var clientOpts []connect.ClientOption
	switch h.Protocol {
	case ConnectJSON:
		clientOpts = append(clientOpts, connect.WithProtoJSON())
	case GRPC:
		clientOpts = append(clientOpts, connect.WithGRPC())
	case GRPCWeb:
		clientOpts = append(clientOpts, connect.WithGRPCWeb())
	}
	if h.Protocol == GRPC || h.Protocol == GRPCWeb {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	c.rpc = connect.NewClient[wrapperspb.BytesValue, wrapperspb.BytesValue](srv.Client(), srv.URL+Procedure, clientOpts...)
	return c
}

// toConnect turns the status error idemgrpctest.Handle answers into
// Connect's.
func toConnect(err error) error {
	st := statusOf(err)
	if st == nil {
		return err
	}
	ce := connect.NewError(connect.Code(st.GetCode()), errors.New(st.GetMessage()))
	for _, d := range st.GetDetails() {
		if m, err := d.UnmarshalNew(); err == nil {
			if detail, err := connect.NewErrorDetail(m); err == nil {
				ce.AddDetail(detail)
			}
		}
	}
	return ce
}

type client struct {
	rpc   *connect.Client[wrapperspb.BytesValue, wrapperspb.BytesValue]
	next  atomic.Int64
	mu    sync.Mutex
	ended map[string]chan struct{}
}

func (c *client) endedChan(id string) chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended[id]
}

// Send implements idemfronttest.Client.
func (c *client) Send(ctx context.Context, call idemfronttest.Call) (idemfronttest.Reply, error) {
	id := strconv.FormatInt(c.next.Add(1), 10)
	ended := make(chan struct{})
	c.mu.Lock()
	c.ended[id] = ended
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.ended, id)
		c.mu.Unlock()
	}()
	req := connect.NewRequest(wrapperspb.Bytes(call.Body))
	req.Header().Set(headerTenant, connect.EncodeBinaryHeader([]byte(call.Tenant)))
	req.Header().Set(headerCall, id)
	if call.Key != "" {
		req.Header().Set(idemconnect.HeaderKey, call.Key)
	}
	resp, err := c.rpc.CallUnary(ctx, req)
	if ctx.Err() != nil {
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
		}
		return idemfronttest.Reply{}, ctx.Err()
	}
	if err != nil {
		var ce *connect.Error
		if !errors.As(err, &ce) {
			return idemfronttest.Reply{}, err
		}
		if ce.Code() == connect.CodeUnknown && ce.Details() == nil && errors.Is(err, context.Canceled) {
			return idemfronttest.Reply{}, err
		}
		st := &spb.Status{Code: int32(ce.Code()), Message: ce.Message()}
		for _, d := range ce.Details() {
			st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
		}
		return idemgrpctest.Decode(st, nil, ce.Meta().Get(idemconnect.HeaderReplayed) == "true"), nil
	}
	return idemgrpctest.Decode(nil, resp.Msg, resp.Header().Get(idemconnect.HeaderReplayed) == "true"), nil
}
