package cli

import (
	"fmt"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/fileset"
	"github.com/stasis-ckpt/stasis/gdswriter"
	ucli "github.com/urfave/cli/v2"
)

func (e *env) saveCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "save",
		Usage:     "save files and directories as a checkpoint; prints the new ID last",
		ArgsUsage: "PATH...",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "job", Required: true, Usage: "the job the checkpoint belongs to"},
			&ucli.Int64Flag{Name: "step", Required: true, Usage: "the training step it was taken at"},
			&ucli.StringFlag{Name: "compress", Value: "auto", Usage: "none, zstd, s2 or auto (auto also tries byte planes for bf16/fp32 data)"},
			&ucli.StringSliceFlag{Name: "tag", Usage: "key=value, repeatable"},
			&ucli.BoolFlag{Name: "json", Usage: "print the new checkpoint's record as JSON"},
		},
		Action: func(c *ucli.Context) error {
			method, tags, err := parseWriting(c)
			if err != nil {
				return err
			}
			if c.Args().Len() == 0 {
				return usagef("save needs at least one PATH")
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			_, total, err := fileset.Plan(c.Args().Slice())
			if err != nil {
				return err
			}
			bar := newProgress(e.progress, e.stderr, "save", total)
			start := time.Now()
			rec, err := fileset.Save(c.Context, s, c.Args().Slice(), fileset.SaveOptions{
				Job: c.String("job"), Step: c.Int64("step"), Tags: tags,
				Writer: gdswriter.WriterOptions{Method: method, Progress: bar.Add},
			})
			bar.Finish()
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(e.stdout, rec)
			}
			fmt.Fprintf(e.stderr, "saved %s as %s (%.3f of its size) in %s\n",
				humanBytes(rec.Bytes), humanBytes(rec.StoredBytes), ratio(rec.StoredBytes, rec.Bytes), time.Since(start).Round(time.Millisecond))
			fmt.Fprintln(e.stdout, rec.ID)
			return nil
		},
	}
}

func (e *env) loadCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "load",
		Usage:     "write a files checkpoint into a new or empty directory, verifying every chunk",
		ArgsUsage: "ID | --job J --latest",
		Flags: append(selectorFlags(),
			&ucli.StringFlag{Name: "to", Required: true, Usage: "the directory to load into (must not exist or be empty)"},
			remoteFlag(),
		),
		Action: func(c *ucli.Context) error {
			s, rec, err := e.openSelectedPulling(c)
			if err != nil {
				return err
			}
			bar := newProgress(e.progress, e.stderr, "load", rec.Bytes)
			m, err := fileset.Load(c.Context, s, rec.ID, c.String("to"), fileset.LoadOptions{Read: catalog.ReadOptions{Progress: bar.Add}})
			bar.Finish()
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "loaded %d entries (%s) of %s into %s\n", len(m.Entries), humanBytes(m.Bytes), m.ID, c.String("to"))
			return nil
		},
	}
}

func (e *env) verifyCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "verify",
		Usage:     "re-read a checkpoint and check every checksum",
		ArgsUsage: "ID | --job J --latest",
		Flags:     selectorFlags(),
		Action: func(c *ucli.Context) error {
			s, rec, err := openSelected(c)
			if err != nil {
				return err
			}
			bar := newProgress(e.progress, e.stderr, "verify", rec.Bytes)
			start := time.Now()
			ids := []string{rec.ID}
			if rec.Kind == catalog.KindJob {
				// Every rank's part, each as the job checkpoint names it.
				_, jm, err := s.JobParts(rec.ID)
				if err != nil {
					return err
				}
				ids = ids[:0]
				for _, p := range jm.Parts {
					ids = append(ids, p.ID)
				}
			}
			var m *catalog.Manifest
			files, chunks, stored := 0, 0, int64(0)
			for _, id := range ids {
				if m, err = s.Verify(c.Context, id, catalog.ReadOptions{Progress: bar.Add}); err != nil {
					break
				}
				files += len(m.Files)
				stored += m.StoredBytes
				for _, f := range m.Files {
					chunks += len(f.Chunks)
				}
			}
			bar.Finish()
			if err != nil {
				return err
			}
			if rec.Kind == catalog.KindJob {
				fmt.Fprintf(e.stdout, "%s: ok (%d ranks, %d files, %d chunks, %s checked in %s)\n", rec.ID, len(ids), files, chunks, humanBytes(stored), time.Since(start).Round(time.Millisecond))
				return nil
			}
			fmt.Fprintf(e.stdout, "%s: ok (%d files, %d chunks, %s checked in %s)\n", m.ID, len(m.Files), chunks, humanBytes(m.StoredBytes), time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
}
