// Command stasis checkpoints and restores GPU training jobs. See README.md.
package main

import (
	"os"

	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/cli"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == checkpoint.WatchdogArg {
		os.Exit(checkpoint.RunWatchdog(os.Args[2:]))
	}
	os.Exit(cli.Run(os.Args, os.Stdout, os.Stderr))
}
