package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/internal/atomicfile"
	ucli "github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

func (e *env) exportCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "export",
		Usage:     "write a checkpoint as one stream (a tar file) that `stasis import` takes on another node",
		ArgsUsage: "ID | --job J --latest",
		Flags: append(selectorFlags(),
			&ucli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "-", Usage: "the file to write, or - for stdout (a pipe)"},
		),
		Action: func(c *ucli.Context) error {
			s, rec, err := openSelected(c)
			if err != nil {
				return err
			}
			out := c.String("output")
			if out == "-" && isTerminal(e.stdout) {
				return usagef("stdout is a terminal; give -o FILE or pipe the stream (stasis export ID | ssh node stasis import -)")
			}
			bar := newProgress(e.progress, e.stderr, "export", rec.StoredBytes)
			start := time.Now()
			err = writeOutput(out, e.stdout, func(w io.Writer) error {
				_, err := s.Export(c.Context, rec.ID, w, catalog.TransferOptions{Progress: bar.Add})
				return err
			})
			bar.Finish()
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "exported %s (job %s, step %d): %s in %s\n", rec.ID, rec.Job, rec.Step,
				humanBytes(rec.StoredBytes), time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
}

// writeOutput runs write on stdout ("-") or on a new file beside name that
// becomes name only once write has succeeded and the file is durable: a
// failed export leaves no file that looks whole.
func writeOutput(name string, stdout io.Writer, write func(io.Writer) error) error {
	if name == "-" {
		return write(stdout)
	}
	return atomicfile.WriteFrom(name, true, write)
}

// openInput opens the import stream, FILE or stdin ("-"), so that a read
// deadline can stop a read that waits for data: SIGINT and SIGTERM must
// end an import whose writer went quiet. Stdin is switched to
// non-blocking mode for Go's poller (the caller sets it back); a pipe or FIFO
// then takes deadlines, and a regular file never blocks.
func openInput(name string) (*os.File, error) {
	if name != "-" {
		f, err := os.Open(name)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, notFoundError{err}
		}
		return f, err
	}
	fd, err := unix.Dup(unix.Stdin)
	if err != nil {
		return nil, fmt.Errorf("stdin: %w", err)
	}
	unix.CloseOnExec(fd)
	// Non-blocking mode is a property of the open file, shared with
	// whoever else holds stdin; restored when the import ends.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stdin: %w", err)
	}
	return os.NewFile(uintptr(fd), "stdin"), nil
}

func (e *env) importCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "import",
		Usage:     "add a checkpoint from a `stasis export` stream (a file, or - for stdin) under its own ID; prints the ID last",
		ArgsUsage: "FILE | -",
		Flags: []ucli.Flag{
			&ucli.BoolFlag{Name: "json", Usage: "print the imported checkpoint's record as JSON"},
		},
		Action: func(c *ucli.Context) error {
			if c.Args().Len() != 1 {
				return usagef("import takes one FILE, or - for stdin")
			}
			in, err := openInput(c.Args().First())
			if err != nil {
				return err
			}
			defer func() {
				in.Close()
				if c.Args().First() == "-" {
					unix.SetNonblock(unix.Stdin, false)
				}
			}()
			stop := context.AfterFunc(c.Context, func() { in.SetReadDeadline(time.Now()) })
			defer stop()
			s, err := openStore(c)
			if err != nil {
				return err
			}
			var bar *progressBar
			start := time.Now()
			rec, err := s.Import(c.Context, in, catalog.TransferOptions{
				Manifest: func(m *catalog.Manifest) { bar = newProgress(e.progress, e.stderr, "import", m.StoredBytes) },
				Progress: func(n int64) { bar.Add(n) },
			})
			bar.Finish()
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(e.stdout, rec)
			}
			fmt.Fprintf(e.stderr, "imported %s (job %s, step %d, %s made on %s): %s verified in %s\n", rec.ID, rec.Job, rec.Step, rec.Kind,
				rec.Host, humanBytes(rec.StoredBytes), time.Since(start).Round(time.Millisecond))
			fmt.Fprintln(e.stdout, rec.ID)
			return nil
		},
	}
}
