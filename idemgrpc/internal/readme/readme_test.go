package main

import (
	"os"
	"strings"
	"testing"
)

// The README's gRPC program is this package's main.go, as written: it
// compiles with the module, and this test fails when the two part.
func TestREADMEShowsTheProgram(t *testing.T) {
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+string(program)+"```\n") {
		t.Fatal("README.md does not show idemgrpc/internal/readme/main.go as it is: copy the file into its gRPC section")
	}
}
