package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// humanBytes formats n with binary units: 512 B, 1.5 KiB, 3.2 GiB.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ratio is stored/logical, or 1 for empty checkpoints.
func ratio(stored, logical int64) float64 {
	if logical == 0 {
		return 1
	}
	return float64(stored) / float64(logical)
}

// isTerminal reports whether f is a terminal.
func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(file.Fd()), unix.TCGETS)
	return err == nil
}

// progressBar draws "label [=====>     ] 45% 1.2 GiB/2.6 GiB 1.3 GB/s" on w,
// redrawn in place at most every 100 ms. Add is safe from any goroutine.
type progressBar struct {
	w     io.Writer
	label string
	total int64
	done  atomic.Int64
	start time.Time
	last  atomic.Int64 // unix ns of the last draw
	stop  chan struct{}
	ended chan struct{}
}

// newProgress returns a running bar when enabled, else nil (whose methods
// do nothing).
func newProgress(enabled bool, w io.Writer, label string, total int64) *progressBar {
	if !enabled || total <= 0 {
		return nil
	}
	p := &progressBar{w: w, label: label, total: total, start: time.Now(), stop: make(chan struct{}), ended: make(chan struct{})}
	go p.loop()
	return p
}

func (p *progressBar) Add(n int64) {
	if p != nil {
		p.done.Add(n)
	}
}

func (p *progressBar) loop() {
	defer close(p.ended)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			fmt.Fprint(p.w, "\r"+renderBar(p.label, p.done.Load(), p.total, time.Since(p.start)))
		case <-p.stop:
			fmt.Fprint(p.w, "\r"+renderBar(p.label, p.done.Load(), p.total, time.Since(p.start))+"\n")
			return
		}
	}
}

// Finish draws the final state and ends the line.
func (p *progressBar) Finish() {
	if p != nil {
		close(p.stop)
		<-p.ended
	}
}

func renderBar(label string, done, total int64, elapsed time.Duration) string {
	const width = 30
	frac := min(float64(done)/float64(total), 1)
	filled := int(frac * width)
	bar := strings.Repeat("=", filled)
	if filled < width {
		bar += ">" + strings.Repeat(" ", width-filled-1)
	}
	rate := ""
	if s := elapsed.Seconds(); s > 0 {
		rate = fmt.Sprintf(" %.2f GB/s", float64(done)/s/1e9)
	}
	return fmt.Sprintf("%s [%s] %3.0f%% %s/%s%s", label, bar, frac*100, humanBytes(done), humanBytes(total), rate)
}
