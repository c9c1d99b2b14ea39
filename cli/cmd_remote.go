package cli

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/stasis-ckpt/stasis/backend"
	"github.com/stasis-ckpt/stasis/backend/s3"
	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/remote"
	ucli "github.com/urfave/cli/v2"
)

// remoteFlag names the object store; config.toml's remote is the default.
func remoteFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "remote", Usage: "the object store: s3://bucket/prefix (s3+http:// for plain HTTP); default: remote in config.toml", EnvVars: []string{"STASIS_REMOTE"}}
}

// remoteURL is --remote, else config.toml's remote ("" for none).
func remoteURL(c *ucli.Context, s *catalog.Store) (string, s3.Config, error) {
	cfg, err := loadConfig(s)
	if err != nil {
		return "", s3.Config{}, err
	}
	url := cfg.Remote
	switch {
	case c.IsSet("remote-url"): // ls --remote, gc --remote
		url = c.String("remote-url")
	case c.IsSet("remote") && hasStringFlag(c, "remote"):
		url = c.String("remote")
	}
	return url, s3.Config{URL: url, Endpoint: cfg.S3.Endpoint, Region: cfg.S3.Region, Profile: cfg.S3.Profile, Insecure: cfg.S3.Insecure}, nil
}

func hasStringFlag(c *ucli.Context, name string) bool {
	for _, f := range c.Command.Flags {
		if sf, ok := f.(*ucli.StringFlag); ok && sf.Name == name {
			return true
		}
	}
	return false
}

// openRemote opens the remote that --remote or config.toml names.
func openRemote(c *ucli.Context, s *catalog.Store) (backend.Backend, error) {
	url, cfg, err := remoteURL(c, s)
	if err != nil {
		return nil, err
	}
	if url == "" {
		return nil, usagef("no remote: give --remote s3://bucket/prefix, or set remote in " + s.Root + "/config.toml (docs/config.md)")
	}
	return s3.Open(cfg)
}

func (e *env) pushCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "push",
		Usage:     "upload complete checkpoints to the remote object store: data first, the manifest last",
		ArgsUsage: "ID | --job J --latest | --all",
		Flags: append(selectorFlags(), remoteFlag(),
			&ucli.BoolFlag{Name: "all", Usage: "push every complete checkpoint of the store"},
			&ucli.BoolFlag{Name: "json", Usage: "print what was pushed as JSON"},
		),
		Action: func(c *ucli.Context) error {
			s, err := openStore(c)
			if err != nil {
				return err
			}
			var recs []catalog.Record
			if c.Bool("all") {
				if c.Args().Len() > 0 || c.Bool("latest") {
					return usagef("give either --all or a checkpoint, not both")
				}
				if recs, err = s.List(catalog.Filter{Job: c.String("job")}); err != nil {
					return err
				}
			} else {
				rec, err := selectCheckpoint(c, s)
				if err != nil {
					return err
				}
				recs = []catalog.Record{rec}
			}
			b, err := openRemote(c, s)
			if err != nil {
				return err
			}
			results := []*remote.PushResult{}
			for _, rec := range recs {
				bar := newProgress(e.progress, e.stderr, "push", rec.StoredBytes)
				res, err := remote.Push(c.Context, s, b, rec.ID, remote.Options{Progress: bar.Add})
				bar.Finish()
				if err != nil {
					return err
				}
				results = append(results, res)
				if !c.Bool("json") {
					if res.Already {
						fmt.Fprintf(e.stderr, "%s (job %s, step %d) is on %s already\n", res.ID, res.Job, res.Step, res.Remote)
					} else {
						fmt.Fprintf(e.stderr, "pushed %s (job %s, step %d) to %s: %s sent, %s there already, in %s\n", res.ID, res.Job, res.Step, res.Remote,
							humanBytes(res.Uploaded), humanBytes(res.Skipped), (time.Duration(res.Seconds * float64(time.Second))).Round(time.Millisecond))
					}
					fmt.Fprintln(e.stdout, res.ID)
				}
			}
			if c.Bool("json") {
				return printJSON(e.stdout, results)
			}
			return nil
		},
	}
}

func (e *env) pullCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "pull",
		Usage:     "bring a checkpoint from the remote object store into this store, verifying every chunk before it is listed; prints the ID last",
		ArgsUsage: "ID (or a unique prefix of one on the remote)",
		Flags: []ucli.Flag{remoteFlag(),
			&ucli.BoolFlag{Name: "json", Usage: "print the pulled checkpoint's record as JSON"},
		},
		Action: func(c *ucli.Context) error {
			if c.Args().Len() != 1 {
				return usagef("pull takes one checkpoint ID")
			}
			s, err := openStore(c)
			if err != nil {
				return err
			}
			b, err := openRemote(c, s)
			if err != nil {
				return err
			}
			res, err := e.pull(c, s, b, c.Args().First())
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(e.stdout, res)
			}
			fmt.Fprintln(e.stdout, res.ID)
			return nil
		},
	}
}

// pull resolves id (a unique prefix of a checkpoint on b) and pulls it.
func (e *env) pull(c *ucli.Context, s *catalog.Store, b backend.Backend, id string) (*remote.PullResult, error) {
	full, err := remoteID(c, b, id)
	if err != nil {
		return nil, err
	}
	var bar *progressBar
	res, err := remote.Pull(c.Context, s, b, full, remote.Options{
		Total:    func(n int64) { bar = newProgress(e.progress, e.stderr, "pull", n) },
		Progress: func(n int64) { bar.Add(n) },
	})
	bar.Finish()
	if err != nil {
		return nil, err
	}
	if res.Already {
		fmt.Fprintf(e.stderr, "%s (job %s, step %d) is in this store already\n", res.ID, res.Job, res.Step)
	} else {
		fmt.Fprintf(e.stderr, "pulled %s (job %s, step %d, %s made on %s) from %s: %s verified in %s\n", res.ID, res.Job, res.Step, res.Kind, res.Host, res.Remote,
			humanBytes(res.Downloaded), (time.Duration(res.Seconds * float64(time.Second))).Round(time.Millisecond))
	}
	return res, nil
}

// remoteID resolves a full ID or a unique prefix against the checkpoints
// on b (those with a manifest object).
func remoteID(c *ucli.Context, b backend.Backend, id string) (string, error) {
	if err := b.Check(c.Context); err != nil {
		return "", err
	}
	if _, err := uuid.Parse(id); err == nil && len(id) == 36 {
		return strings.ToLower(id), nil
	}
	if id == "" || strings.Trim(strings.ToLower(id), "0123456789abcdef-") != "" {
		return "", fmt.Errorf("%w: %q is not a checkpoint ID or a prefix of one", catalog.ErrNotFound, id)
	}
	var match []string
	err := b.List(c.Context, "checkpoints/"+strings.ToLower(id), func(o backend.Object) error {
		rest := strings.TrimPrefix(o.Key, "checkpoints/")
		if cid, name, ok := strings.Cut(rest, "/"); ok && name == "manifest" {
			match = append(match, cid)
		}
		return nil
	})
	switch {
	case err != nil:
		return "", err
	case len(match) == 0:
		return "", fmt.Errorf("%w: no checkpoint %s... on %s", catalog.ErrNotFound, id, b.Location())
	case len(match) > 1:
		return "", fmt.Errorf("%w: %s matches %d checkpoints on %s", catalog.ErrAmbiguous, id, len(match), b.Location())
	}
	return match[0], nil
}

// openSelectedPulling is openSelected for load and restore: a checkpoint
// named by ID that this store lacks, or the latest of a job of which this
// store has none, is pulled first from the remote, where one is
// configured.
func (e *env) openSelectedPulling(c *ucli.Context) (*catalog.Store, catalog.Record, error) {
	s, rec, err := openSelected(c)
	if err == nil || !errors.Is(err, catalog.ErrNotFound) || s == nil {
		return s, rec, err
	}
	url, _, cerr := remoteURL(c, s)
	if cerr != nil || url == "" {
		return s, rec, err
	}
	b, oerr := openRemote(c, s)
	if oerr != nil {
		return nil, catalog.Record{}, oerr
	}
	id := c.Args().First()
	if c.Bool("latest") {
		ents, lerr := remote.List(c.Context, b, false, nil)
		if lerr != nil {
			return nil, catalog.Record{}, lerr
		}
		var latest *remote.Entry
		for i, en := range ents {
			if en.Job != c.String("job") {
				continue
			}
			if latest == nil || en.Step > latest.Step || (en.Step == latest.Step && en.Created.After(latest.Created)) {
				latest = &ents[i]
			}
		}
		if latest == nil {
			return nil, catalog.Record{}, fmt.Errorf("%w: job %s has no checkpoint here nor on %s", catalog.ErrNotFound, c.String("job"), b.Location())
		}
		id = latest.ID
	}
	fmt.Fprintf(e.stderr, "stasis: %s is not in this store: pulling it from %s\n", id, b.Location())
	res, perr := e.pull(c, s, b, id)
	if perr != nil {
		return nil, catalog.Record{}, perr
	}
	return s, res.Record, nil
}

// lsRemote lists the local and the remote checkpoints together, with
// where each lives.
func (e *env) lsRemote(c *ucli.Context, s *catalog.Store, local []catalog.Record) error {
	b, err := openRemote(c, s)
	if err != nil {
		return err
	}
	remotes, err := remote.List(c.Context, b, c.Bool("all"), func(id string, err error) {
		fmt.Fprintf(e.stderr, "stasis: warning: %s on %s: %s\n", id, b.Location(), oneLine(err))
	})
	if err != nil {
		return err
	}
	type row struct {
		catalog.Record
		Where string `json:"where"`
	}
	byID := map[string]*row{}
	var rows []*row
	for _, r := range local {
		rw := &row{Record: r, Where: "local"}
		byID[r.ID] = rw
		rows = append(rows, rw)
	}
	for _, r := range remotes {
		if c.String("job") != "" && r.Job != c.String("job") {
			continue
		}
		if rw := byID[r.ID]; rw != nil {
			rw.Where = "local+remote"
			continue
		}
		rows = append(rows, &row{Record: r.Record, Where: "remote"})
	}
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Job != b.Job {
			return a.Job < b.Job
		}
		if a.Step != b.Step {
			return a.Step < b.Step
		}
		return a.Created.Before(b.Created)
	})
	if c.Bool("json") {
		if rows == nil {
			rows = []*row{}
		}
		return printJSON(e.stdout, rows)
	}
	return writeRecords(e.stdout, "WHERE", len(rows), func(i int) (catalog.Record, string) { return rows[i].Record, rows[i].Where })
}

// gcRemote removes what interrupted pushes left on the remote.
func (e *env) gcRemote(c *ucli.Context, s *catalog.Store) error {
	b, err := openRemote(c, s)
	if err != nil {
		return err
	}
	rep, err := remote.GC(c.Context, b, c.Duration("grace"))
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(e.stdout, rep)
	}
	fmt.Fprintf(e.stdout, "%s: aborted %d interrupted uploads; removed %d checkpoints without a manifest (%d objects, %s)\n",
		rep.Remote, len(rep.UploadsAborted), len(rep.OrphansRemoved), rep.ObjectsRemoved, humanBytes(rep.BytesReclaimed))
	if len(rep.Young) > 0 {
		fmt.Fprintf(e.stdout, "left %d checkpoints without a manifest younger than --grace %s (a push may be under way)\n", len(rep.Young), c.Duration("grace"))
	}
	return nil
}
