package idemsql_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoDriverImported: idemsql alone links no module but its own and
// idem's core, so that a program on one database links no other
// database's driver.
func TestNoDriverImported(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("skipping: the go command is not on PATH (%v)", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "github.com/idem-go/idem/idemsql").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, m := range strings.Fields(string(out)) {
		if m != "github.com/idem-go/idem" && m != "github.com/idem-go/idem/idemsql" {
			t.Errorf("idemsql depends on module %s", m)
		}
	}
}
