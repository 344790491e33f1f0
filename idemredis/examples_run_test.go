package idemredis_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

// The example needs Redis, so it carries no "// Output:" line (go test
// would run it even where the server is missing); this runs it where it is
// up and checks what it prints.
func TestExamples(t *testing.T) {
	testenv.RedisURL(t)
	testenv.RunExample(t, Example, `
creating order 42
201 {"id":42} replayed: false
201 {"id":42} replayed: true`)
}
