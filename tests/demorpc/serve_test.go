// Package demorpc tries `idem serve --grpc-addr` as a stranger would,
// from another process that links none of the demo's code: a grpc-go
// client that knows the service only from server reflection (dynamicpb
// messages), and plain net/http requests in Connect's JSON protocol.
package demorpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idem-go/idem/internal/atonce"
	"github.com/idem-go/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBinary()
	os.Exit(code)
}

// proc is a running `idem serve`.
type proc struct {
	cmd    *exec.Cmd
	url    string
	mu     sync.Mutex
	logs   strings.Builder
	exited chan struct{}
	err    error
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

var httpListening = regexp.MustCompile(`msg=listening addr=(\S+)`)

// startGRPCServe starts the binary on free ports, on a SQLite file of
// its own, and returns it with the gRPC address once both listen.
func startGRPCServe(t *testing.T, args ...string) (*proc, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: builds the idem binary and starts it (-short)")
	}
	path := filepath.Join(t.TempDir(), "idem.db")
	cmd := exec.Command(testenv.IdemBinary(t), append([]string{"serve", "--addr", "127.0.0.1:0", "--db", "sqlite:" + path, "--grpc-addr", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	addrs := make(chan [2]string, 1)
	go func() {
		var grpcAddr string
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs.WriteString(line + "\n")
			p.mu.Unlock()
			if m := grpcListening.FindStringSubmatch(line); m != nil {
				grpcAddr = m[1]
			}
			if m := httpListening.FindStringSubmatch(line); m != nil {
				addrs <- [2]string{m[1], grpcAddr}
			}
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			cmd.Process.Kill() //nolint:errcheck // it may have exited meanwhile
			<-p.exited
		}
		if t.Failed() {
			t.Logf("idem serve logs:\n%s", p.log())
		}
	})
	select {
	case a := <-addrs:
		if a[1] == "" {
			t.Fatalf("no gRPC listening line before the HTTP one:\n%s", p.log())
		}
		p.url = "http://" + a[0]
		return p, a[1]
	case <-p.exited:
		t.Fatalf("idem serve exited before listening (%v):\n%s", p.err, p.log())
	case <-time.After(2 * time.Minute):
		t.Fatalf("idem serve did not listen within 2 minutes:\n%s", p.log())
	}
	return nil, ""
}

// stop sends SIGTERM and checks for a clean shutdown.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("idem serve did not stop after SIGTERM:\n%s", p.log())
	}
	if p.err != nil || !strings.Contains(p.log(), "msg=stopped") {
		t.Fatalf("idem serve exited with %v, without a clean stop:\n%s", p.err, p.log())
	}
}

// The tests here treat `idem serve --grpc-addr` as a stranger would: a
// grpc-go client that knows the service only from server reflection
// (dynamicpb messages, no generated code), and plain net/http requests
// for Connect's JSON protocol.

var grpcListening = regexp.MustCompile(`msg="grpc listening" addr=(\S+)`)

// reflected is the service as server reflection describes it.
type reflected struct {
	create, list protoreflect.MethodDescriptor
}

func reflectService(t *testing.T, conn *grpc.ClientConn) reflected {
	t.Helper()
	stream, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer stream.CloseSend() //nolint:errcheck // the test is done with it
	if err := stream.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "idem.demo.v1.OrderService"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	fdr := resp.GetFileDescriptorResponse()
	if fdr == nil {
		t.Fatalf("reflection answered %v", resp)
	}
	set := &descriptorpb.FileDescriptorSet{}
	for _, raw := range fdr.GetFileDescriptorProto() {
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(raw, fd); err != nil {
			t.Fatal(err)
		}
		set.File = append(set.File, fd)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatal(err)
	}
	d, err := files.FindDescriptorByName("idem.demo.v1.OrderService")
	if err != nil {
		t.Fatal(err)
	}
	svc := d.(protoreflect.ServiceDescriptor)
	// The client knows the schema from reflection only: nothing of it is
	// registered in this process under these names.
	if _, err := protoregistry.GlobalFiles.FindDescriptorByName("idem.demo.v1.OrderService"); err == nil {
		t.Fatal("the demo's schema is linked into the test: it would not test reflection")
	}
	return reflected{create: svc.Methods().ByName("CreateOrder"), list: svc.Methods().ByName("ListOrders")}
}

func (r reflected) createRequest(cart string, total int64) *dynamicpb.Message {
	md := r.create.Input()
	m := dynamicpb.NewMessage(md)
	m.Set(md.Fields().ByName("cart_id"), protoreflect.ValueOfString(cart))
	m.Set(md.Fields().ByName("total_cents"), protoreflect.ValueOfInt64(total))
	return m
}

type rpcAnswer struct {
	id       string
	code     codes.Code
	replayed bool
	reason   string
	retry    time.Duration
	pushback string
}

func callCreate(ctx context.Context, conn *grpc.ClientConn, r reflected, req *dynamicpb.Message, opts ...grpc.CallOption) rpcAnswer {
	resp := dynamicpb.NewMessage(r.create.Output())
	var header, trailer metadata.MD
	method := "/idem.demo.v1.OrderService/CreateOrder"
	err := conn.Invoke(ctx, method, req, resp, append(opts, grpc.Header(&header), grpc.Trailer(&trailer))...)
	a := rpcAnswer{code: status.Code(err), id: resp.Get(r.create.Output().Fields().ByName("id")).String()}
	a.replayed = len(header.Get("idempotent-replayed")) == 1 && header.Get("idempotent-replayed")[0] == "true"
	if v := trailer.Get("grpc-retry-pushback-ms"); len(v) == 1 {
		a.pushback = v[0]
	}
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			a.reason = d.GetReason()
		case *errdetails.RetryInfo:
			a.retry = d.GetRetryDelay().AsDuration()
		}
	}
	return a
}

func listCount(t *testing.T, conn *grpc.ClientConn, r reflected, tenant, cart string) int {
	t.Helper()
	req := dynamicpb.NewMessage(r.list.Input())
	req.Set(r.list.Input().Fields().ByName("cart_id"), protoreflect.ValueOfString(cart))
	resp := dynamicpb.NewMessage(r.list.Output())
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+tenant)
	if err := conn.Invoke(ctx, "/idem.demo.v1.OrderService/ListOrders", req, resp); err != nil {
		t.Fatal(err)
	}
	return resp.Get(r.list.Output().Fields().ByName("orders")).List().Len()
}

func callAs(ctx context.Context, tenant, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tenant, "idempotency-key", key)
}

// The retry policy of the tests' clients: UNAVAILABLE is retried, after
// the server's pushback.
const demoServiceConfig = `{"methodConfig": [{"name": [{"service": "idem.demo.v1.OrderService"}], "retryPolicy": {
	"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
	"retryableStatusCodes": ["UNAVAILABLE"]}}]}`

func TestServeGRPC(t *testing.T) {
	// A duplicate waits 100ms for the order in flight (which takes 2s),
	// then is told UNAVAILABLE with a pushback of 1s.
	p, addr := startGRPCServe(t, "--handler-delay", "2s", "--wait-in-flight", "100ms")
	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	retrying, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(demoServiceConfig))
	if err != nil {
		t.Fatal(err)
	}
	defer retrying.Close()
	r := reflectService(t, plain)

	t.Run("DuplicatesWithRetryPolicy", func(t *testing.T) {
		// Hedged copies as gRFC A6 sends them: the same call and metadata
		// at once, each retried on UNAVAILABLE; the losers cancelled once
		// one answers.
		const copies = 6
		ctx := callAs(t.Context(), "acme", "grpc-dup-1")
		ctxs := make([]context.Context, copies)
		cancels := make([]context.CancelFunc, copies)
		for i := range ctxs {
			ctxs[i], cancels[i] = context.WithTimeout(ctx, 30*time.Second)
			defer cancels[i]()
		}
		answers := make([]rpcAnswer, copies)
		var once sync.Once
		winner := -1
		atonce.Run(copies, func(i int) {
			answers[i] = callCreate(ctxs[i], retrying, r, r.createRequest("c_grpc", 1200))
			if answers[i].code == codes.OK {
				once.Do(func() {
					winner = i
					for j := range cancels {
						if j != i {
							cancels[j]()
						}
					}
				})
			}
		})
		if winner < 0 {
			t.Fatalf("no copy answered: %+v", answers)
		}
		for i, a := range answers {
			if a.code != codes.OK && a.code != codes.Canceled {
				t.Errorf("copy %d: %v (%s): a status that would cancel the others", i, a.code, a.reason)
			}
			if a.code == codes.OK && a.id != answers[winner].id {
				t.Errorf("copy %d: order %s, want the one order %s", i, a.id, answers[winner].id)
			}
		}
		// Every copy retried until it got the answer, when not cancelled:
		// a late one is the replay.
		late := callCreate(ctx, retrying, r, r.createRequest("c_grpc", 1200))
		if late.code != codes.OK || !late.replayed || late.id != answers[winner].id {
			t.Fatalf("a late copy: %+v, want the replay of %s", late, answers[winner].id)
		}
		if n := listCount(t, plain, r, "acme", "c_grpc"); n != 1 {
			t.Fatalf("%d orders for the cart, want 1", n)
		}
	})

	t.Run("InFlightMismatchTenant", func(t *testing.T) {
		ctx := callAs(t.Context(), "acme", "grpc-inflight")
		answers := make([]rpcAnswer, 2)
		atonce.Run(2, func(i int) { answers[i] = callCreate(ctx, plain, r, r.createRequest("c_wait", 500)) })
		var ok, busy int
		for _, a := range answers {
			switch {
			case a.code == codes.OK && !a.replayed:
				ok++
			case a.code == codes.Unavailable && a.reason == "IDEMPOTENCY_KEY_IN_FLIGHT" && a.retry == time.Second && a.pushback == "1000":
				busy++
			}
		}
		if ok != 1 || busy != 1 {
			t.Fatalf("two copies at once: %+v, want one order and one UNAVAILABLE with RetryInfo 1s and pushback 1000", answers)
		}
		// Another request under the key.
		if a := callCreate(ctx, plain, r, r.createRequest("c_wait", 501)); a.code != codes.FailedPrecondition || a.reason != "IDEMPOTENCY_KEY_REUSED" {
			t.Fatalf("another request under the key: %+v, want FAILED_PRECONDITION IDEMPOTENCY_KEY_REUSED", a)
		}
		// No tenant.
		noAuth := metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", "grpc-noauth")
		if a := callCreate(noAuth, plain, r, r.createRequest("c_wait", 1)); a.code != codes.Unauthenticated {
			t.Fatalf("no authorization: %v, want UNAUTHENTICATED", a.code)
		}
		// The tenant's key space is its own.
		if a := callCreate(callAs(t.Context(), "globex", "grpc-inflight"), plain, r, r.createRequest("c_wait", 501)); a.code != codes.OK || a.replayed {
			t.Fatalf("another tenant under the key: %+v, want a fresh order", a)
		}
		if n := listCount(t, plain, r, "acme", "c_wait"); n != 1 {
			t.Fatalf("%d orders of acme for the cart, want 1", n)
		}
	})

	t.Run("GRPCToTheConnectHandler", func(t *testing.T) {
		// grpc-go against the HTTP port (h2c): Connect's handler speaks
		// gRPC there, its status in trailers, and the interceptor answers
		// as the gRPC port does.
		h2c, err := grpc.NewClient(strings.TrimPrefix(p.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer h2c.Close()
		ctx := callAs(t.Context(), "acme", "h2c-dup")
		first := callCreate(ctx, h2c, r, r.createRequest("c_h2c", 300))
		again := callCreate(ctx, h2c, r, r.createRequest("c_h2c", 300))
		if first.code != codes.OK || first.replayed || again.code != codes.OK || !again.replayed || again.id != first.id {
			t.Fatalf("two calls with one key: %+v then %+v, want an order then its replay", first, again)
		}
		if a := callCreate(ctx, h2c, r, r.createRequest("c_h2c", 301)); a.code != codes.FailedPrecondition || a.reason != "IDEMPOTENCY_KEY_REUSED" {
			t.Fatalf("another request under the key: %+v, want FAILED_PRECONDITION", a)
		}
		noAuth := metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", "h2c-noauth")
		if a := callCreate(noAuth, h2c, r, r.createRequest("c_h2c", 1)); a.code != codes.Unauthenticated {
			t.Fatalf("no authorization: %v, want UNAUTHENTICATED", a.code)
		}
	})

	t.Run("ConnectJSON", func(t *testing.T) {
		url := p.url + "/idem.demo.v1.OrderService/CreateOrder"
		post := func(key, tenant, body string) (int, http.Header, map[string]any) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader([]byte(body)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", key)
			if tenant != "" {
				req.Header.Set("Authorization", "Bearer "+tenant)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var out map[string]any
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("answer %d %q: %v", resp.StatusCode, raw, err)
			}
			return resp.StatusCode, resp.Header, out
		}
		const n = 6
		type res struct {
			status   int
			replayed bool
			id       any
		}
		got := make([]res, n)
		atonce.Run(n, func(i int) {
			// Each retried while answered 503 unavailable, as a client
			// following the advice does.
			for attempt := 0; attempt < 10; attempt++ {
				status, h, body := post("connect-dup", "acme", `{"cartId":"c_connect","totalCents":"900"}`)
				got[i] = res{status, h.Get("Idempotent-Replayed") == "true", body["id"]}
				if status != http.StatusServiceUnavailable {
					return
				}
				time.Sleep(500 * time.Millisecond)
			}
		})
		fresh := 0
		for i, g := range got {
			if g.status != http.StatusOK || g.id != got[0].id {
				t.Fatalf("copy %d: %+v, want 200 and the one order %v", i, g, got[0].id)
			}
			if !g.replayed {
				fresh++
			}
		}
		if fresh != 1 {
			t.Fatalf("%d answers without Idempotent-Replayed, want 1: %+v", fresh, got)
		}
		if status, _, body := post("connect-dup", "acme", `{"cartId":"c_connect","totalCents":"901"}`); status != http.StatusBadRequest || body["code"] != "failed_precondition" {
			t.Fatalf("another request under the key: %d %v, want 400 failed_precondition", status, body)
		}
		if status, _, body := post("connect-noauth", "", `{"cartId":"c_connect","totalCents":"1"}`); status != http.StatusUnauthorized || body["code"] != "unauthenticated" {
			t.Fatalf("no authorization: %d %v, want 401 unauthenticated", status, body)
		}
		// The same order seen over gRPC: one for the cart.
		if c := listCount(t, plain, r, "acme", "c_connect"); c != 1 {
			t.Fatalf("%d orders for the cart, want 1", c)
		}
	})
	p.stop(t)
}

// Without --wait-in-flight, a duplicate waits for the call in flight
// within its own deadline (idemgrpc's default), and gets its answer
// replayed: no retry needed.
func TestServeGRPCWaits(t *testing.T) {
	p, addr := startGRPCServe(t, "--handler-delay", "300ms")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := reflectService(t, conn)
	ctx, cancel := context.WithTimeout(callAs(t.Context(), "acme", "grpc-wait"), 30*time.Second)
	defer cancel()
	const n = 5
	answers := make([]rpcAnswer, n)
	atonce.Run(n, func(i int) { answers[i] = callCreate(ctx, conn, r, r.createRequest("c_waits", 700)) })
	fresh := 0
	for i, a := range answers {
		if a.code != codes.OK || a.id != answers[0].id {
			t.Fatalf("copy %d: %+v, want the one order %s", i, a, answers[0].id)
		}
		if !a.replayed {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("%d answers without the replay marker, want 1: %+v", fresh, answers)
	}
	if c := listCount(t, conn, r, "acme", "c_waits"); c != 1 {
		t.Fatalf("%d orders for the cart, want 1", c)
	}
	p.stop(t)
}
