package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The idem binaries, built once per test process and set of build tags by
// IdemBinary, in one temporary directory.
var (
	binMu     sync.Mutex
	binDir    string
	binBuilds = map[string]*binBuild{}
)

type binBuild struct {
	once sync.Once
	path string
	err  error
}

// IdemBinary builds cmd/idem as a user would (go build), with the given
// build tags (the crash tests need "idemfaults"), once per test process
// and set of tags, and returns its path. Tests that need a real process
// (to kill it, or to run two on one database) start it from there. A
// package using it calls RemoveBinary from its TestMain once the tests
// have run.
func IdemBinary(t testing.TB, tags ...string) string {
	t.Helper()
	tagList := strings.Join(tags, ",")
	binMu.Lock()
	b := binBuilds[tagList]
	if b == nil {
		b = &binBuild{}
		binBuilds[tagList] = b
	}
	binMu.Unlock()
	b.once.Do(func() { b.path, b.err = buildIdem(tagList) })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func buildIdem(tagList string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go command is not on PATH: %w", err)
	}
	binMu.Lock()
	if binDir == "" {
		binDir, err = os.MkdirTemp("", "idem-bin-")
	}
	dir := binDir
	binMu.Unlock()
	if err != nil {
		return "", err
	}
	name := "idem"
	args := []string{"build"}
	if tagList != "" {
		name += "-" + strings.ReplaceAll(tagList, ",", "-")
		args = append(args, "-tags", tagList)
	}
	path := filepath.Join(dir, name)
	args = append(args, "-o", path, "github.com/idem-go/idem/cmd/idem")
	if out, err := exec.Command(goTool, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return path, nil
}

// RemoveBinary deletes what IdemBinary built, if anything.
func RemoveBinary() {
	binMu.Lock()
	defer binMu.Unlock()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}
