package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/criu"
	"github.com/stasis-ckpt/stasis/cuda"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"github.com/stasis-ckpt/stasis/hooks"
	"github.com/stasis-ckpt/stasis/restore"
	ucli "github.com/urfave/cli/v2"
)

func criuFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.BoolFlag{Name: "shell-job", Usage: "allow a process tree that belongs to a terminal session"},
		&ucli.BoolFlag{Name: "tcp-established", Usage: "checkpoint established TCP connections"},
		&ucli.BoolFlag{Name: "ext-unix-sk", Usage: "allow unix sockets connected outside the tree"},
		&ucli.BoolFlag{Name: "file-locks", Usage: "checkpoint file locks"},
	}
}

// processFlags are the flags of a process checkpoint's CRIU, GPU and
// writer options (processOptions).
func processFlags() []ucli.Flag {
	return append([]ucli.Flag{
		&ucli.DurationFlag{Name: "gpu-lock-timeout", Value: checkpoint.DefaultLockTimeout, Usage: "how long the CUDA lock waits for GPU work already submitted; past it the checkpoint is rolled back"},
		&ucli.StringFlag{Name: "compress", Value: "auto", Usage: "none, zstd, s2 or auto"},
		&ucli.StringFlag{Name: "dump-pages", Value: "auto", Usage: "how the memory gets into a process checkpoint: copy (CRIU leaves out the private anonymous memory, which stasis copies itself: its largest run while CRIU dumps, the rest from the frozen tree once CRIU is done), criu (CRIU writes all of it, on one thread, streamed into the store as it comes), or auto (copy, but criu for a tree that uses CUDA)"},
		&ucli.BoolFlag{Name: "early-copy", Value: true, Usage: "where stasis copies the memory: start on the largest run of it while CRIU dumps (checked page for page at the end; --early-copy=false copies it all once CRIU is done)"},
	}, criuFlags()...)
}

// processOptions reads processFlags.
func processOptions(c *ucli.Context) (checkpoint.Options, error) {
	method, err := gdswriter.ParseMethod(c.String("compress"))
	if err != nil {
		return checkpoint.Options{}, usagef("--compress: " + err.Error())
	}
	dumpPages, err := checkpoint.ParseDumpPages(c.String("dump-pages"))
	if err != nil {
		return checkpoint.Options{}, usagef("--dump-pages " + err.Error())
	}
	return checkpoint.Options{
		DumpPages:   dumpPages,
		NoEarlyCopy: !c.Bool("early-copy"),
		LockTimeout: c.Duration("gpu-lock-timeout"),
		CRIU: criu.Options{ShellJob: c.Bool("shell-job"), TCPEstablished: c.Bool("tcp-established"),
			ExtUnixSockets: c.Bool("ext-unix-sk"), FileLocks: c.Bool("file-locks")},
		Writer: gdswriter.WriterOptions{Method: method},
	}, nil
}

func (e *env) checkpointCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "checkpoint",
		Usage: "checkpoint a running process tree with CRIU; prints the new ID last",
		Flags: append([]ucli.Flag{
			&ucli.IntFlag{Name: "pid", Required: true, Usage: "the root of the process tree"},
			&ucli.StringFlag{Name: "job", Usage: "the job it belongs to (default: the process's name)"},
			&ucli.Int64Flag{Name: "step", Usage: "the training step, if known"},
			&ucli.BoolFlag{Name: "leave-running", Usage: "keep the process running after the checkpoint"},
			&ucli.BoolFlag{Name: "fast", Usage: "pause the job only for the dump into RAM; compress and store after it resumes (implies --leave-running)"},
			&ucli.StringSliceFlag{Name: "tag", Usage: "key=value, repeatable"},
			&ucli.BoolFlag{Name: "json", Usage: "print the record and timings as JSON"},
		}, append(processFlags(), hookFlags(hooks.PreCheckpoint, hooks.PostCheckpoint)...)...),
		Action: func(c *ucli.Context) error {
			if err := noArgs(c); err != nil {
				return err
			}
			o, err := processOptions(c)
			if err != nil {
				return err
			}
			if o.Tags, err = parseTags(c.StringSlice("tag")); err != nil {
				return err
			}
			o.PID, o.Job, o.Step, o.LeaveRunning, o.Fast = c.Int("pid"), c.String("job"), c.Int64("step"), c.Bool("leave-running"), c.Bool("fast")
			s, err := openStore(c)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(s)
			if err != nil {
				return err
			}
			res, err := hooks.Checkpoint(c.Context, s, o, scripts(c, cfg), e.stderr)
			if res == nil {
				return err
			}
			// err, if any, is a failed post_checkpoint hook: the
			// checkpoint is stored all the same.
			hookErr := err
			rec := res.Record
			if c.Bool("json") {
				return errors.Join(printJSON(e.stdout, map[string]any{
					"record": rec, "hash_seconds": res.Hash.Seconds(), "gpu_lock_seconds": res.GPULock.Seconds(), "gpu_checkpoint_seconds": res.GPUCheckpoint.Seconds(),
					"dump_seconds": res.Dump.Seconds(), "store_seconds": res.Store.Seconds(), "gpu_resume_seconds": res.GPUResume.Seconds(),
					"pause_seconds": res.Pause.Seconds(), "store_backlog_seconds": res.Backlog.Seconds(), "commit_seconds": res.Commit.Seconds(),
					"total_seconds": res.Total.Seconds(), "images_in_ram": res.ImagesInRAM, "copied_pages_bytes": res.CopiedPages, "dump_pages": dumpPagesUsed(res),
					"early_copied_bytes": res.EarlyCopied, "early_copy_dropped": res.EarlyDropped, "preflight": res.Plan,
				}), hookErr)
			}
			if res.Plan != nil {
				for _, ch := range res.Plan.Options {
					if ch.By == "preflight" {
						fmt.Fprintf(e.stderr, "stasis: preflight: %s\n", describeChoice(ch))
					}
				}
			}
			pause := ""
			if res.Pause > 0 {
				pause = fmt.Sprintf(", job paused %s", res.Pause.Round(time.Millisecond))
			}
			fmt.Fprintf(e.stderr, "checkpointed PID %d (job %s): %s of images stored as %s (%.3f); dump %s, store %s, total %s%s\n",
				c.Int("pid"), rec.Job, humanBytes(rec.Bytes), humanBytes(rec.StoredBytes), ratio(rec.StoredBytes, rec.Bytes),
				res.Dump.Round(time.Millisecond), res.Store.Round(time.Millisecond), res.Total.Round(time.Millisecond), pause)
			fmt.Fprintln(e.stdout, rec.ID)
			return hookErr
		},
	}
}

func (e *env) restoreCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "restore",
		Usage:     "restore a process checkpoint with CRIU, detached; prints the restored PID last",
		ArgsUsage: "ID | --job J --latest",
		Flags: append(append(selectorFlags(),
			&ucli.DurationFlag{Name: "pid-wait", Value: 5 * time.Second, Usage: "how long to wait for the checkpoint's PIDs to become free"},
			&ucli.StringFlag{Name: "gpu-map", Usage: "OLD=NEW,... (GPU indexes or UUIDs): restore GPU state onto other GPUs (default: the same GPUs, or the same index when they are not here)"},
			&ucli.BoolFlag{Name: "force", Usage: "restore even if this machine does not match the checkpoint (files, mounts, driver, GPU models); the differences are printed as warnings"},
			&ucli.BoolFlag{Name: "new-pidns", Usage: "restore into a new PID namespace, where the tree gets its own PIDs even if they are taken here"},
			&ucli.StringFlag{Name: "pages", Value: string(restore.PagesFill), Usage: "how the memory comes back: fill (CRIU restores file mappings and the like, stasis writes the private anonymous memory into the rebuilt tree on every core before it runs), stream (the memory images streamed to CRIU as they are verified) or unpack (every image verified into a scratch directory before CRIU runs); a bad chunk always stops the restore and nothing of the tree runs"},
			&ucli.BoolFlag{Name: "verify-first", Usage: "the same as --pages unpack"},
			&ucli.BoolFlag{Name: "json", Usage: "print the PID and timings as JSON"},
			remoteFlag(),
		), hookFlags(hooks.PostRestore)...),
		Action: func(c *ucli.Context) error {
			s, rec, err := e.openSelectedPulling(c)
			if err != nil {
				return err
			}
			gpuMap, err := cuda.ParseGPUMap(c.String("gpu-map"))
			if err != nil {
				return usagef(err.Error())
			}
			cfg, err := loadConfig(s)
			if err != nil {
				return err
			}
			pidns := restore.PIDNSNever
			if c.Bool("new-pidns") {
				pidns = restore.PIDNSAlways
			}
			pages, err := restore.ParsePagesMode(c.String("pages"))
			if err != nil {
				return usagef("--pages " + err.Error())
			}
			if c.Bool("verify-first") {
				if c.IsSet("pages") && pages != restore.PagesUnpack {
					return usagef("--verify-first is --pages unpack; it cannot go with --pages " + string(pages))
				}
				pages = restore.PagesUnpack
			}
			res, err := hooks.Restore(c.Context, s, rec.ID, restore.Options{PIDWait: c.Duration("pid-wait"), Read: catalog.ReadOptions{}, GPUMap: gpuMap, Force: c.Bool("force"), PIDNS: pidns, Pages: pages}, scripts(c, cfg), e.stderr)
			if res == nil {
				return err
			}
			// err, if any, is a failed post_restore hook: the tree runs.
			hookErr := err
			for _, w := range res.Warnings {
				fmt.Fprintf(e.stderr, "stasis: warning: %s\n", w)
			}
			if c.Bool("json") {
				return errors.Join(printJSON(e.stdout, map[string]any{
					"warnings": res.Warnings, "id": rec.ID, "pid": res.PID, "unpack_seconds": res.Unpack.Seconds(), "criu_seconds": res.CRIU.Seconds(),
					"gpu_seconds": res.GPU.Seconds(), "gpu_remapped": len(res.GPUPairs) > 0, "pid_inside_namespace": res.PIDInside,
					"total_seconds": res.Total.Seconds(), "images_in_ram": res.ImagesInRAM, "pages": res.Pages,
					"fill_seconds": res.Fill.Seconds(), "filled_bytes": res.Filled, "filled_zero_bytes": res.FilledZero, "kept_for_criu_bytes": res.KeptForCRIU,
					"checked_bytes": res.Checked, "check_seconds": res.Check.Seconds(), "unchecked_shared_bytes": res.UncheckedShared,
					"stream_write_seconds": res.StreamWrite.Seconds(),
				}), hookErr)
			}
			criuStep := "criu " + res.CRIU.Round(time.Millisecond).String()
			switch res.Pages {
			case restore.PagesFill:
				criuStep += fmt.Sprintf(" (of which %s writing %s of memory into the tree, %s of zeros left out; %s checking %s of it against the checkpoint)", res.Fill.Round(time.Millisecond), humanBytes(res.Filled), humanBytes(res.FilledZero), res.Check.Round(time.Millisecond), humanBytes(res.Checked))
			case restore.PagesStream:
				criuStep += " (memory streamed)"
			}
			fmt.Fprintf(e.stderr, "restored %s (job %s, step %d): unpack %s, %s\n", rec.ID, rec.Job, rec.Step,
				res.Unpack.Round(time.Millisecond), criuStep)
			fmt.Fprintln(e.stdout, res.PID)
			return hookErr
		},
	}
}

// dumpPagesUsed names what --dump-pages came to for a checkpoint: copy or
// criu.
func dumpPagesUsed(res *checkpoint.Result) string {
	if res.PagesCopied {
		return "copy"
	}
	return "criu"
}

// describeChoice says what the preflight chose, and why, on one line.
func describeChoice(ch checkpoint.Choice) string {
	opt := ch.Option
	if ch.Value != "" {
		opt += "=" + ch.Value
	}
	return fmt.Sprintf("%s: %s", opt, ch.Why)
}
