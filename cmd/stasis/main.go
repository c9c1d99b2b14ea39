// Command stasis checkpoints and restores GPU training jobs. See README.md.
package main

import (
	"fmt"
	"os"

	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/cli"
	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/hooks"
	"github.com/stasis-ckpt/stasis/internal/trace"
	"github.com/stasis-ckpt/stasis/restore"
)

func main() {
	trace.Mark("main")
	if launched, err := criu.Launch(os.Args[1:]); launched {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if hook, code := criu.RunActionHook(os.Args[1:]); hook {
		os.Exit(code)
	}
	// Not the launcher: its variables, inherited or a user's, must not
	// reach the launchers this process starts.
	criu.ClearLauncherEnv()
	if len(os.Args) > 1 && os.Args[1] == checkpoint.WatchdogArg {
		os.Exit(checkpoint.RunWatchdog(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == restore.PIDNSInitArg {
		os.Exit(restore.RunPIDNSInit(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == hooks.GuardArg {
		os.Exit(hooks.RunGuard(os.Args[2:]))
	}
	os.Exit(cli.Run(os.Args, os.Stdout, os.Stderr))
}
