package idemmigrate_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-go/idem/idemmigrate"
)

// Migrate brings the idempotency records' table up to date, under a lock,
// whatever other process migrates at the same time. The program registers
// its database/sql driver (here SQLite's, as idemsqlite.Open does).
func ExampleMigrate() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idemmigrate-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	pending, err := idemmigrate.Pending(ctx, db, idemmigrate.SQLite)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", pending)
	if err := idemmigrate.Migrate(ctx, db, idemmigrate.SQLite); err != nil {
		log.Fatal(err)
	}
	pending, err = idemmigrate.Pending(ctx, db, idemmigrate.SQLite)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending after Migrate:", pending)
}

// Teams with their own migration tool copy the files.
func ExampleFiles() {
	names, err := fs.Glob(idemmigrate.Files(idemmigrate.MySQL), "*.sql")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(names[0])
	// Output: 0001_idem_keys.sql
}
