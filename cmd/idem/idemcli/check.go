package idemcli

import (
	"context"
	"io"

	"github.com/idem-go/idem/cmd/idem/idemcheck"
)

// runCheck is `idem check`: idemcheck.Main, which owns its flags, help,
// report and exit statuses.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return idemcheck.Main(ctx, args, stdout, stderr)
}
