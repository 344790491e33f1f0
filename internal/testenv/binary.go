package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The idem binary, built once per test process by IdemBinary.
var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// IdemBinary builds cmd/idem as a user would (go build), once per test
// process, and returns its path. Tests that need a real process (to kill
// it, or to run two on one database) start it from there. A package using
// it calls RemoveBinary from its TestMain once the tests have run.
func IdemBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			binErr = fmt.Errorf("the go command is not on PATH: %w", err)
			return
		}
		if binDir, binErr = os.MkdirTemp("", "idem-bin-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "idem")
		out, err := exec.Command(goTool, "build", "-o", binPath, "github.com/idem-go/idem/cmd/idem").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build ./cmd/idem: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// RemoveBinary deletes what IdemBinary built, if anything.
func RemoveBinary() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}
