// Package trace prints, when STASIS_TRACE is set in the environment, where
// a command's time goes: one line on standard error per mark, with the
// milliseconds since the process started its Go code. The first line also
// gives that start as Unix microseconds, for a script that timed the exec
// to line the marks up with. Unset, a mark costs one branch.
package trace

import (
	"fmt"
	"os"
	"sync"
	"time"
)

var (
	enabled = os.Getenv("STASIS_TRACE") != ""
	start   = time.Now()
	once    sync.Once
)

// Enabled reports whether marks are printed.
func Enabled() bool { return enabled }

// Mark prints what happened now.
func Mark(what string) {
	if !enabled {
		return
	}
	once.Do(func() {
		fmt.Fprintf(os.Stderr, "stasis: trace: Go code started at %d (Unix µs)\n", start.UnixMicro())
	})
	fmt.Fprintf(os.Stderr, "stasis: trace: %8.3f ms %s\n", float64(time.Since(start).Microseconds())/1000, what)
}
