package idemjanitor_test

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemmem"
)

// A janitor runs one pass at once (idem purge does the same from the
// command line), or Run in the background.
func Example() {
	store := idemmem.NewStore(nil)
	janitor, err := idemjanitor.NewJanitor(store, &idemjanitor.Config{BatchSize: 500})
	if err != nil {
		fmt.Println(err)
		return
	}
	n, err := janitor.PurgeOnce(context.Background())
	fmt.Println(n, err)
	// Output: 0 <nil>
}
