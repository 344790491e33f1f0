package idemcli

import (
	"os"
	"strings"
	"testing"
)

// TestKeysOnAnUnmigratedDatabase: on a database without the records
// table, idem keys says to run idem migrate, as idem inspect does,
// rather than only the driver's "no such table".
func TestKeysOnAnUnmigratedDatabase(t *testing.T) {
	for _, kind := range dbKinds {
		t.Run(kind.name, func(t *testing.T) {
			db := kind.fresh(t)
			if path, ok := strings.CutPrefix(db, "sqlite:"); ok {
				// An existing file without the table (a missing one is
				// refused before, with its own message).
				if err := os.WriteFile(path, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			for _, args := range [][]string{
				{"keys", "list", "--db", db},
				{"keys", "release", "--db", db, "--key", "k", "--reason", "test"},
			} {
				code, _, errOut := run(args...)
				if code != ExitFailure || !strings.Contains(errOut, "idem migrate") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
					t.Errorf("%v: exit %d, want %d and one line naming idem migrate: %q", args, code, ExitFailure, errOut)
				}
			}
		})
	}
}
