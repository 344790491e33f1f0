package idemdynamo_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemdynamo"
)

// The kill test's child process reads its orders from these variables.
const (
	envKillPoint    = "IDEM_DYNAMO_KILL_POINT"
	envKillEndpoint = "IDEM_DYNAMO_KILL_ENDPOINT"
	envKillTable    = "IDEM_DYNAMO_KILL_TABLE"
	envKillOrders   = "IDEM_DYNAMO_KILL_ORDERS"
)

// killLease is the lease of the killed execution: the retry takes the
// key over once it has ended.
const killLease = 300 * time.Millisecond

// TestKillDuringCompletion: a process runs an execution whose handler adds
// a business write (a counter incremented by one), and is killed with
// SIGKILL at a fault point of the completion's TransactWriteItems: before
// the request is sent, halfway through sending its body, or after
// DynamoDB answered and before the store saw the answer. The fault hook
// is the HTTP transport of the child's DynamoDB client. In no case is a
// business write without its record, or a record without its write,
// observable: they are one request. The retry then runs the operation
// exactly once in all: the counter ends at 1.
//
// minidyn serves the table from this process, so the data outlives the
// killed child; dynalite has no TransactWriteItems.
func TestKillDuringCompletion(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: starts child processes")
	}
	for _, point := range []string{"before-send", "mid-body", "after-answer"} {
		t.Run(point, func(t *testing.T) {
			endpoint := minidynEndpoint(t)
			table, orders := newTable(t, endpoint), newOrdersTable(t, endpoint)
			cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), envKillPoint+"="+point, envKillEndpoint+"="+endpoint, envKillTable+"="+table, envKillOrders+"="+orders)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if err == nil || !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the child was not killed at %s (%v):\n%s", point, err, out.String())
			}
			cfg := noSkew
			cfg.Transactional = true
			store := newStore(t, endpoint, table, cfg)
			ctx := context.Background()
			rec, gerr := store.Get(ctx, "t1", "order-1")
			count := counterValue(t, endpoint, orders)
			complete := gerr == nil && rec.State == idem.StateComplete
			switch {
			case gerr != nil:
				t.Fatalf("no record after the kill: %v", gerr)
			case complete != (count == 1) || count > 1:
				t.Fatalf("after the kill at %s: record %s, business counter %d: the two must commit together", point, rec.State, count)
			case point == "after-answer" && !complete:
				t.Fatalf("killed after DynamoDB answered, the record is %s", rec.State)
			case point != "after-answer" && complete:
				t.Fatalf("killed before the request was whole, the record is complete")
			}

			// The retry: a replay if the first completed, else a
			// takeover once the lease has ended, which runs the handler.
			time.Sleep(killLease + 200*time.Millisecond)
			engine := newEngine(t, store, nil)
			ran := false
			res, err := engine.Do(ctx, killOperation(), func(ctx context.Context) (idem.Result, error) {
				ran = true
				return increment(ctx, orders)
			})
			if err != nil {
				t.Fatalf("retry: %v", err)
			}
			if ran == complete || res.Replayed != complete {
				t.Errorf("retry after a kill at %s: ran=%v replayed=%v, with the first %s", point, ran, res.Replayed, rec.State)
			}
			if got := counterValue(t, endpoint, orders); got != 1 {
				t.Errorf("business counter after the retry = %d, want 1 (one execution in all)", got)
			}
		})
	}
}

// TestKillChild is the child process of TestKillDuringCompletion; it
// does nothing unless that test started it.
func TestKillChild(t *testing.T) {
	point := os.Getenv(envKillPoint)
	if point == "" {
		t.Skip("skipping: run by TestKillDuringCompletion only")
	}
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(os.Getenv(envKillEndpoint)),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "idem", SecretAccessKey: "idem"}, nil
		}),
		HTTPClient:       &http.Client{Transport: &faultTransport{point: point, next: http.DefaultTransport}},
		RetryMaxAttempts: 1,
	})
	store, err := idemdynamo.NewStore(client, &idemdynamo.Config{Table: os.Getenv(envKillTable), MaxClockSkew: -1, Transactional: true})
	if err != nil {
		t.Fatal(err)
	}
	engine, err := idem.NewEngine(store, &idem.Config{Lease: killLease, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	orders := os.Getenv(envKillOrders)
	_, err = engine.Do(context.Background(), killOperation(), func(ctx context.Context) (idem.Result, error) {
		return increment(ctx, orders)
	})
	t.Fatalf("the fault point %s was not reached: Do returned %v", point, err)
}

func killOperation() idem.Operation {
	return idem.Operation{Tenant: "t1", Key: "order-1", Fingerprint: []byte("a")}
}

// increment adds one to the business counter through the unit of work.
func increment(ctx context.Context, orders string) (idem.Result, error) {
	err := idemdynamo.Tx(ctx).Add(types.TransactWriteItem{Update: &types.Update{
		TableName:                 aws.String(orders),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "counter"}},
		UpdateExpression:          aws.String("ADD n :one"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
	}})
	return idem.Result{Status: 201, Body: []byte("done")}, err
}

func counterValue(t *testing.T, endpoint, orders string) int {
	t.Helper()
	out, err := newClient(endpoint).GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(orders), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "counter"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	n, ok := out.Item["n"].(*types.AttributeValueMemberN)
	if !ok {
		return 0
	}
	v, err := strconv.Atoi(n.Value)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// faultTransport is the fault hook: it kills its process at one point of
// the TransactWriteItems request, and passes every other request through.
type faultTransport struct {
	point string
	next  http.RoundTripper
}

func (f *faultTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("X-Amz-Target") != "DynamoDB_20120810.TransactWriteItems" {
		return f.next.RoundTrip(req)
	}
	switch f.point {
	case "before-send":
		die()
	case "mid-body":
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(&dyingReader{data: body[:len(body)/2]})
		// The announced length is the whole body: the server waits for
		// the rest, which never comes.
		return f.next.RoundTrip(req)
	case "after-answer":
		resp, err := f.next.RoundTrip(req)
		if err == nil {
			_, _ = io.ReadAll(resp.Body)
		}
		die()
	}
	panic(fmt.Sprintf("unknown fault point %q", f.point))
}

// dyingReader yields data, then kills its process on the next read.
type dyingReader struct{ data []byte }

func (r *dyingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		die()
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
