// Command stasis checkpoints and restores GPU training jobs. See README.md.
package main

import (
	"os"

	"github.com/stasis-ckpt/stasis/cli"
)

func main() {
	os.Exit(cli.Run(os.Args, os.Stdout, os.Stderr))
}
