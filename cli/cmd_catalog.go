package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	ucli "github.com/urfave/cli/v2"
)

func (e *env) lsCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "ls",
		Usage: "list complete checkpoints, by job and step",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "job", Usage: "only this job"},
			&ucli.BoolFlag{Name: "json", Usage: "print a JSON array"},
			&ucli.BoolFlag{Name: "all", Usage: "also list checkpoints being removed"},
			&ucli.BoolFlag{Name: "remote", Usage: "also list the checkpoints on the remote object store (config.toml's remote, or --remote-url), with where each lives"},
			&ucli.StringFlag{Name: "remote-url", Usage: "the object store for --remote: s3://bucket/prefix", EnvVars: []string{"STASIS_REMOTE"}},
		},
		Action: func(c *ucli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			recs, err := s.List(catalog.Filter{Job: c.String("job"), IncludeAll: c.Bool("all")})
			if err != nil {
				return err
			}
			// Never leave out a complete checkpoint without saying so.
			missing, err := s.Unindexed()
			if err != nil {
				return err
			}
			if len(missing) > 0 {
				fmt.Fprintf(e.stderr, "stasis: warning: %d complete checkpoints are not in the catalog and not listed here (%s): run `stasis gc` to list them\n",
					len(missing), strings.Join(missing, ", "))
			}
			if c.Bool("remote") {
				return e.lsRemote(c, s, recs)
			}
			if c.Bool("json") {
				if recs == nil {
					recs = []catalog.Record{}
				}
				return printJSON(e.stdout, recs)
			}
			return writeRecords(e.stdout, "STATUS", len(recs), func(i int) (catalog.Record, string) { return recs[i], string(recs[i].Status) })
		},
	}
}

// writeRecords prints the table of ls: n records, rec(i) giving each and
// what its last column, headed last, says.
func writeRecords(w io.Writer, last string, n int, rec func(i int) (catalog.Record, string)) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tJOB\tSTEP\tKIND\tCREATED\tSIZE\tSTORED\t"+last)
	for i := range n {
		r, end := rec(i)
		kind := string(r.Kind)
		if r.Kind == catalog.KindJob {
			kind += " (" + r.Tags[catalog.TagWorldSize] + " ranks)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.ID[:8], r.Job, r.Step, kind,
			r.Created.Local().Format(time.DateTime), humanBytes(r.Bytes), humanBytes(r.StoredBytes), end)
	}
	return tw.Flush()
}

// showRecord is what `stasis show --json` prints: the index record with the
// manifest's files and entries.
type showRecord struct {
	catalog.Record
	Ratio   float64         `json:"ratio"`
	Files   []showFile      `json:"files"`
	Entries []catalog.Entry `json:"entries"`
	Meta    any             `json:"meta,omitempty"`
	Dir     string          `json:"dir"`
	Codecs  map[string]int  `json:"codecs"`
}

type showFile struct {
	Name      string `json:"name"`
	Size      int64  `json:"size"`
	RawSize   int64  `json:"raw_size"`
	ChunkSize int64  `json:"chunk_size"`
	Chunks    int    `json:"chunks"`
}

func (e *env) showCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "show",
		Usage:     "describe one checkpoint",
		ArgsUsage: "ID | --job J --latest",
		Flags:     append(selectorFlags(), &ucli.BoolFlag{Name: "json", Usage: "print JSON"}),
		Action: func(c *ucli.Context) error {
			s, rec, err := openSelected(c)
			if err != nil {
				return err
			}
			m, err := s.ReadManifest(rec.ID)
			if err != nil {
				return err
			}
			out := showRecord{Record: rec, Ratio: ratio(rec.StoredBytes, rec.Bytes), Entries: m.Entries, Dir: s.CheckpointDir(rec.ID), Codecs: map[string]int{}}
			if len(m.Meta) > 0 {
				out.Meta = m.Meta
			}
			for _, f := range m.Files {
				out.Files = append(out.Files, showFile{Name: f.Name, Size: f.Size, RawSize: f.RawSize, ChunkSize: f.ChunkSize, Chunks: len(f.Chunks)})
				for _, ch := range f.Chunks {
					out.Codecs[string(ch.Codec)]++
				}
			}
			if c.Bool("json") {
				return printJSON(e.stdout, out)
			}
			tw := tabwriter.NewWriter(e.stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "id:\t%s\n", rec.ID)
			fmt.Fprintf(tw, "job:\t%s\n", rec.Job)
			fmt.Fprintf(tw, "step:\t%d\n", rec.Step)
			fmt.Fprintf(tw, "kind:\t%s\n", rec.Kind)
			fmt.Fprintf(tw, "status:\t%s\n", rec.Status)
			fmt.Fprintf(tw, "created:\t%s on %s\n", rec.Created.Local().Format(time.RFC3339), rec.Host)
			fmt.Fprintf(tw, "size:\t%s stored as %s (%.3f)\n", humanBytes(rec.Bytes), humanBytes(rec.StoredBytes), out.Ratio)
			fmt.Fprintf(tw, "entries:\t%d\n", len(m.Entries))
			fmt.Fprintf(tw, "chunks:\t%v\n", out.Codecs)
			for k, v := range rec.Tags {
				fmt.Fprintf(tw, "tag:\t%s=%s\n", k, v)
			}
			if rec.Kind == catalog.KindJob {
				jm, err := catalog.ReadJobMeta(m)
				if err != nil {
					return err
				}
				fmt.Fprintf(tw, "attempt:\t%s\n", jm.Attempt)
				for _, p := range jm.Parts {
					fmt.Fprintf(tw, "rank %d:\t%s on %s, %s stored as %s\n", p.Rank, p.ID, p.Host, humanBytes(p.Bytes), humanBytes(p.StoredBytes))
				}
			}
			fmt.Fprintf(tw, "dir:\t%s\n", out.Dir)
			return tw.Flush()
		},
	}
}

func (e *env) rmCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "rm",
		Usage:     "remove a checkpoint",
		ArgsUsage: "ID | --job J --latest",
		Flags:     selectorFlags(),
		Action: func(c *ucli.Context) error {
			s, rec, err := openSelected(c)
			if err != nil {
				return err
			}
			if err := s.Remove(rec.ID); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "removed %s (job %s, step %d)\n", rec.ID, rec.Job, rec.Step)
			return nil
		},
	}
}

func (e *env) pruneCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "prune",
		Usage: "remove all but the newest checkpoints of a job",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "job", Required: true},
			&ucli.IntFlag{Name: "keep-last", Required: true, Usage: "how many of the highest steps to keep"},
			&ucli.BoolFlag{Name: "json", Usage: "print the removed records as JSON"},
		},
		Action: func(c *ucli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			removed, err := s.Prune(c.String("job"), c.Int("keep-last"))
			if c.Bool("json") && err == nil {
				if removed == nil {
					removed = []catalog.Record{}
				}
				return printJSON(e.stdout, removed)
			}
			for _, r := range removed {
				fmt.Fprintf(e.stdout, "removed %s (step %d)\n", r.ID, r.Step)
			}
			return err
		},
	}
}

func (e *env) gcCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "gc",
		Usage: "remove what crashed saves left behind and repair the catalog",
		Flags: []ucli.Flag{&ucli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
			&ucli.BoolFlag{Name: "remote", Usage: "clean the remote object store instead: interrupted multipart uploads and objects of checkpoints without a manifest, older than --grace"},
			&ucli.StringFlag{Name: "remote-url", Usage: "the object store for --remote: s3://bucket/prefix", EnvVars: []string{"STASIS_REMOTE"}},
			&ucli.DurationFlag{Name: "grace", Value: time.Hour, Usage: "with --remote: leave what is younger than this (a push may be under way)"},
		},
		Action: func(c *ucli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			if c.Bool("remote") {
				return e.gcRemote(c, s)
			}
			rep, err := s.GC()
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(e.stdout, rep)
			}
			fmt.Fprintf(e.stdout, "removed %d partial checkpoints and %d leftovers (%s); finished %d removals; indexed %d; dropped %d lost records\n",
				len(rep.StagingRemoved), len(rep.TrashRemoved), humanBytes(rep.BytesReclaimed), len(rep.RemovalsDone), len(rep.Indexed), len(rep.Lost))
			if len(rep.StagingBusy) > 0 {
				fmt.Fprintf(e.stdout, "left %d checkpoints that are still being written\n", len(rep.StagingBusy))
			}
			for _, id := range rep.Damaged {
				fmt.Fprintf(e.stderr, "warning: %s has a damaged manifest; left in place (inspect or remove it by hand)\n", s.CheckpointDir(id))
			}
			return nil
		},
	}
}

func (e *env) catalogCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "catalog",
		Usage: "maintain the catalog",
		Subcommands: []*ucli.Command{{
			Name:  "rebuild",
			Usage: "recreate the catalog from the checkpoints' manifests",
			Action: func(c *ucli.Context) error {
				if err := noArgs(c); err != nil {
					return err
				}
				// The catalog it replaces may be damaged: not opened.
				s, err := openStoreWith(c, catalog.Options{NoIndex: true})
				if err != nil {
					return err
				}
				rep, err := s.Rebuild()
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "indexed %d checkpoints\n", rep.Indexed)
				if rep.Previous != "" {
					fmt.Fprintf(e.stdout, "the catalog it replaced (never read) is kept as %s\n", rep.Previous)
				}
				for _, id := range rep.Damaged {
					fmt.Fprintf(e.stderr, "warning: %s: manifest unreadable; not indexed\n", s.CheckpointDir(id))
				}
				return nil
			},
		}},
	}
}
