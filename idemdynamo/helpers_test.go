package idemdynamo_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/truora/minidyn/server"

	"github.com/idem-go/idem/idemdynamo"
	"github.com/idem-go/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	stopDynalite()
	os.Exit(code)
}

// The dynalite server of this test process, started once by
// dynaliteEndpoint and stopped by TestMain.
var (
	dynaliteOnce sync.Once
	dynaliteURL  string
	dynaliteStop = func() {}
	dynaliteErr  error
)

// dynaliteEndpoint returns the URL of a dynalite server (an npm package
// run by Node: a real server process, in memory), started on a free port
// the first time. It skips the test where Node or dynalite is missing,
// and fails it under CI=true.
func dynaliteEndpoint(t testing.TB) string {
	t.Helper()
	dynaliteOnce.Do(func() {
		var stop func()
		dynaliteURL, stop, dynaliteErr = testenv.StartDynalite()
		if stop != nil {
			dynaliteStop = stop
		}
	})
	if dynaliteErr != nil {
		testenv.Unavailable(t, "dynalite", dynaliteErr)
	}
	return dynaliteURL
}

func stopDynalite() { dynaliteStop() }

// minidynEndpoint starts minidyn's HTTP server in this process, for what
// dynalite lacks (TransactWriteItems), and returns its URL.
func minidynEndpoint(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(server.NewServer())
	t.Cleanup(srv.Close)
	return srv.URL
}

// newClient returns a DynamoDB client on endpoint, with dummy credentials
// (neither server checks them). Each call has a connection pool of its
// own, as a second process would.
func newClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "idem", SecretAccessKey: "idem", Source: "test"}, nil
		}),
	})
}

// newTable creates a fresh table on endpoint and returns its name.
func newTable(t testing.TB, endpoint string) string {
	t.Helper()
	name := testenv.Name()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := idemdynamo.CreateTable(ctx, newClient(endpoint), name); err != nil && !errors.Is(err, idemdynamo.ErrNoTTL) {
		t.Fatalf("CreateTable: %v", err)
	}
	t.Cleanup(func() {
		_, _ = newClient(endpoint).DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(name)})
	})
	return name
}

// newStore returns a store on table through a client of its own.
func newStore(t testing.TB, endpoint, table string, cfg idemdynamo.Config) *idemdynamo.Store {
	t.Helper()
	cfg.Table = table
	st, err := idemdynamo.NewStore(newClient(endpoint), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
