// Command plserve serves a powerloss disk at a directory for a test that
// controls it over stdin and stdout (powerloss.StartChild). It is built
// without the race detector even when the tests use it, so that the disk
// under a daemon costs little per request.
package main

import (
	"fmt"
	"os"

	"github.com/ckptfs/ckptfs/test/powerloss"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: plserve DIR")
		os.Exit(2)
	}
	if err := powerloss.Serve(os.Args[1], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "plserve:", err)
		os.Exit(1)
	}
}
