package idemcli_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idem-go/idem/cmd/idem/idemcli"
)

// The commands run in-process through Main, as cmd/idem runs them: here
// the migration of a new SQLite database, a purge with nothing to do yet,
// and the inspection of a key that has no record.
func ExampleMain() {
	dir, err := os.MkdirTemp("", "idemcli-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db := "sqlite:" + filepath.Join(dir, "idem.db")

	for _, args := range [][]string{
		{"migrate", "--db", db},
		{"migrate", "--db", db},
		{"purge", "--db", db, "--batch", "500"},
		{"inspect", "--db", db, "--key", "order-42"},
		{"serve", "--lease", "soon"},
	} {
		code := idemcli.Main(context.Background(), args, os.Stdout, os.Stdout)
		fmt.Println("exit", code)
	}
	// Output:
	// applied: 0001_idem_keys
	// applied: 0003_idem_steps
	// applied: 0006_idem_keys_list
	// exit 0
	// up to date
	// exit 0
	// purged 0 expired records
	// exit 0
	// idem inspect: no record for key "order-42" under tenant "default" (never used, released after a failure, or purged)
	// exit 1
	// idem serve: invalid value "soon" for flag --lease: want a duration such as 500ms, 90s, 5m or 24h
	// exit 2
}
