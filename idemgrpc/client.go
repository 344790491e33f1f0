package idemgrpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/idem-go/idem/idemgrpc/idemrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// ClientConfig configures UnaryClientInterceptor.
type ClientConfig struct {
	// NewKey returns a new key; nil uses 128 random bits in hex.
	NewKey func() string
	// Methods, when set, says which methods get a key; by default every
	// unary method but those whose idempotency_level is NO_SIDE_EFFECTS.
	Methods func(fullMethod string) bool
}

// UnaryClientInterceptor gives each logical unary call one key, in the
// idempotency-key metadata, unless the call carries one already (set it
// yourself, metadata.AppendToOutgoingContext, to retry a call made
// earlier, after a restart say). grpc-go's own retries and hedged copies
// resend the call's metadata, so they keep its key; a retrying
// interceptor must come after this one in the chain (see the package
// documentation). Streaming calls get no key: the server interceptor
// lets them through.
func UnaryClientInterceptor(cfg *ClientConfig) grpc.UnaryClientInterceptor {
	if cfg == nil {
		cfg = &ClientConfig{}
	}
	newKey := cfg.NewKey
	if newKey == nil {
		newKey = randomKey
	}
	skip := &idemrpc.Skipper{}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		protected := skip.Protected(method)
		if cfg.Methods != nil {
			protected = cfg.Methods(method)
		}
		if protected {
			md, _ := metadata.FromOutgoingContext(ctx)
			if len(md.Get(MetadataKey)) == 0 {
				ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, newKey())
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

func randomKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// GatewayHeaderMatcher is a grpc-gateway incoming header matcher
// (runtime.WithIncomingHeaderMatcher) that forwards Idempotency-Key as
// the idempotency-key metadata, and every other header as grpc-gateway's
// default matcher does (its permanent headers, and Grpc-Metadata-*):
//
//	mux := runtime.NewServeMux(runtime.WithIncomingHeaderMatcher(idemgrpc.GatewayHeaderMatcher(runtime.DefaultHeaderMatcher)))
//
// grpc-gateway drops the header otherwise, and every call through the
// gateway runs unprotected. The gateway's own retries to the server
// keep the metadata of the one HTTP request.
func GatewayHeaderMatcher(next func(key string) (string, bool)) func(key string) (string, bool) {
	return func(key string) (string, bool) {
		if len(key) == len(MetadataKey) && lowerASCII(key) == MetadataKey {
			return MetadataKey, true
		}
		if next == nil {
			return "", false
		}
		return next(key)
	}
}

func lowerASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
