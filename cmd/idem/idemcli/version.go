package idemcli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
)

func runVersion(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if err := parseFlags(fs, "Usage: idem version\n\nPrints the module version idem was built from.\n", args, stdout); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "idem", Version())
	return nil
}

// Version returns the module version of the running binary ("(devel)" when
// built from a work tree).
func Version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok || info.Main.Version == "" {
		return "(devel)"
	}
	return info.Main.Version
}
