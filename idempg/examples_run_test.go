package idempg_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

// The examples need PostgreSQL, so they carry no "// Output:" line (go test
// would run them even where the server is missing); this runs them where it
// is up and checks what they print.
func TestExamples(t *testing.T) {
	testenv.PostgresURL(t)
	testenv.RunExample(t, Example, `
201 {"id":1} replayed: false
201 {"id":1} replayed: true
orders: 1`)
	testenv.RunExample(t, ExampleStore_CompleteTx, "complete")
	testenv.RunExample(t, ExampleNewStore, "claimed: 20")
}
