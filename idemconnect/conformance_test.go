package idemconnect_test

import (
	"testing"

	"github.com/idem-go/idem/idemconnect/idemconnecttest"
	"github.com/idem-go/idem/idemfronttest"
)

// TestConformance runs the front-end suite against the interceptor in
// each of Connect's protocols, on idemmem; tests/idemconnect runs it on
// SQLite and PostgreSQL.
func TestConformance(t *testing.T) {
	for name, p := range map[string]idemconnecttest.Protocol{
		"connect": idemconnecttest.Connect, "connect-json": idemconnecttest.ConnectJSON,
		"grpc": idemconnecttest.GRPC, "grpc-web": idemconnecttest.GRPCWeb,
	} {
		t.Run(name, func(t *testing.T) {
			idemfronttest.Exercise(t, idemconnecttest.Harness{Protocol: p}, idemconnecttest.Features, nil)
		})
	}
}
