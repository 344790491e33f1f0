package idemconnecttest

import (
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
)

// statusOf returns the status of a grpc-go status error, nil for
// another error.
func statusOf(err error) *spb.Status {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	return st.Proto()
}
