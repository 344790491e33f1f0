package idemclient_test

// Third-party retrying clients (stripe-go, go-retryablehttp) against an
// idem-protected handler whose first response is lost after the commit:
// each must end with exactly one execution and the original answer. Each
// test fails if the server runs the operation twice. They live in the
// tests module because they import modules from outside the project; the
// server they call is internal/stripeserver, which idemclient's own tests
// call too.

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	retryablehttp "github.com/hashicorp/go-retryablehttp"
	"github.com/stripe/stripe-go/v82"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/stripeserver"
)

func TestStripeGoRetryGetsOriginalCustomer(t *testing.T) {
	c := &stripeserver.Customers{}
	srv, a := stripeserver.LostFirstResponse(t, c)
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		HTTPClient:        srv.Client(),
		MaxNetworkRetries: stripe.Int64(2),
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	sc := stripe.NewClient("sk_test_idem", stripe.WithBackends(&stripe.Backends{API: backend, Connect: backend, Uploads: backend}))

	cus, err := sc.V1Customers.Create(context.Background(), &stripe.CustomerCreateParams{
		Email: stripe.String("jenny@example.com"), Name: stripe.String("Jenny Rosen"),
	})
	if err != nil {
		t.Fatal(err)
	}
	stripeserver.CheckOneExecution(t, c, a, 2)
	if cus.ID != "cus_1" || cus.Email != "jenny@example.com" {
		t.Fatalf("customer %s <%s>, want the original cus_1 <jenny@example.com>", cus.ID, cus.Email)
	}
	if cus.LastResponse == nil || cus.LastResponse.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatal("the retry's answer is not marked as a replay")
	}
	if cus.LastResponse.IdempotencyKey == "" {
		t.Fatal("stripe-go sent no Idempotency-Key of its own")
	}
}

func TestRetryableHTTPWithKeySetOnce(t *testing.T) {
	c := &stripeserver.Customers{}
	srv, a := stripeserver.LostFirstResponse(t, c)
	rc := retryablehttp.NewClient()
	rc.HTTPClient = srv.Client()
	rc.RetryMax = 3
	rc.RetryWaitMin, rc.RetryWaitMax = time.Millisecond, 10*time.Millisecond
	rc.Logger = nil

	form := url.Values{"email": {"jenny@example.com"}}.Encode()
	req, err := retryablehttp.NewRequest(http.MethodPost, srv.URL+"/v1/customers", strings.NewReader(form))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set(idemhttp.HeaderKey, uuid.NewString()) // once, for all its retries
	resp, err := rc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	stripeserver.CheckOneExecution(t, c, a, 2)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"id":"cus_1"`) ||
		resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("got %d %s (replayed %q), want the original cus_1 replayed", resp.StatusCode, body, resp.Header.Get(idemhttp.HeaderReplayed))
	}
}
