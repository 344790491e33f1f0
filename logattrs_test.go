package idem_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// TestEngineLogsEscaped: the engine's log lines, through slog's JSON
// handler (which writes C1 controls raw), carry a tenant's U+009B
// escaped, and a panicking handler's value not at all (it may carry the
// request's body): only its type.
func TestEngineLogsEscaped(t *testing.T) {
	var logs bytes.Buffer
	store := idemmem.NewStore(nil)
	e, err := idem.NewEngine(store, &idem.Config{Heartbeat: -1, Lease: time.Minute, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background()) //nolint:errcheck // nothing runs
	const tenant = "acme\u009b31mred"
	_, err = e.Do(context.Background(), idem.Operation{Tenant: tenant, Key: "k1"}, func(ctx context.Context) (idem.Result, error) {
		panic("card=4242424242424242 body={\"secret\":1}")
	})
	if err == nil {
		t.Fatal("Do after a panic returned no error")
	}
	out := logs.String()
	if !strings.Contains(out, `acme\\u009b31mred`) {
		t.Errorf("the tenant is not in the logs, escaped:\n%s", out)
	}
	if strings.Contains(out, "\u009b") {
		t.Errorf("a raw U+009B reached the logs:\n%q", out)
	}
	if strings.Contains(out, "4242") || strings.Contains(out, "secret") {
		t.Errorf("the panic's value reached the logs:\n%s", out)
	}
	if !strings.Contains(out, "a value of type string") {
		t.Errorf("the panic is not named by its type:\n%s", out)
	}
}
