package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/checkpoint"
	"github.com/stasis-ckpt/stasis/hooks"
	"github.com/stasis-ckpt/stasis/restore"
	ucli "github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

// hookFlags name hook scripts on the command line, over config.toml's.
func hookFlags(hookNames ...string) []ucli.Flag {
	flags := []ucli.Flag{&ucli.DurationFlag{Name: "hook-timeout", DefaultText: "60s, or config.toml's", Usage: "how long a hook script may run"}}
	for _, h := range hookNames {
		flags = append(flags, &ucli.StringFlag{Name: hookFlagName(h), Usage: "run this executable as the " + h + " hook (over config.toml's)"})
	}
	return flags
}

func hookFlagName(hook string) string { return strings.ReplaceAll(hook, "_", "-") }

// loadConfig reads the store's config.toml.
func loadConfig(s *catalog.Store) (hooks.Config, error) {
	return hooks.LoadConfig(s.Root, s.AllowsUnsafe())
}

// scripts are the hook scripts of the flags over those of the
// configuration.
func scripts(c *ucli.Context, cfg hooks.Config) hooks.Scripts {
	flags := hooks.Scripts{Timeout: c.Duration("hook-timeout")}
	for h, field := range map[string]*string{hooks.PreCheckpoint: &flags.PreCheckpoint, hooks.PostCheckpoint: &flags.PostCheckpoint, hooks.PostRestore: &flags.PostRestore} {
		if name := hookFlagName(h); c.IsSet(name) {
			*field = c.String(name)
		}
	}
	return flags.Over(cfg.Hooks)
}

// fileOr is w when it is a file (as the command line's stdio are), else f.
func fileOr(w io.Writer, f *os.File) *os.File {
	if file, ok := w.(*os.File); ok {
		return file
	}
	return f
}

func (e *env) runCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "run",
		Usage:     "run a job under stasis: resume it, forward signals, checkpoint it on preemption; exit 75 asks for a requeue",
		ArgsUsage: "-- CMD [ARGS...]",
		Flags: append(append([]ucli.Flag{
			&ucli.StringFlag{Name: "job", Usage: "the job's name in the store (required)"},
			&ucli.StringFlag{Name: "mode", DefaultText: "app, or config.toml's", Usage: "app (the job saves itself when told) or process (CRIU)"},
			&ucli.StringFlag{Name: "signal", DefaultText: "USR1, or config.toml's", Usage: "preemption signals, comma-separated; the first is the one prestop sends"},
			&ucli.DurationFlag{Name: "grace", DefaultText: "120s, or config.toml's", Usage: "how long a checkpoint may take after the preemption signal"},
			&ucli.DurationFlag{Name: "kill-after", DefaultText: "10s, or config.toml's", Usage: "between SIGTERM and SIGKILL when the job is stopped"},
			&ucli.StringFlag{Name: "fallback", Usage: "app mode: \"process\" takes a process checkpoint when the job ignores the notice"},
			&ucli.DurationFlag{Name: "fallback-after", DefaultText: "half the grace", Usage: "how long the job has to take up the notice before the fallback"},
			&ucli.DurationFlag{Name: "pid-wait", Value: 5 * time.Second, Usage: "process mode: how long the restore waits for the job's PIDs to be free"},
			&ucli.StringFlag{Name: "new-pidns", Value: string(restore.PIDNSAuto), Usage: "process mode: resume the job in a new PID namespace: auto (when one of its PIDs is taken), always or never"},
		}, processFlags()...), hookFlags(hooks.PreCheckpoint, hooks.PostCheckpoint, hooks.PostRestore)...),
		Action: func(c *ucli.Context) error {
			// Files stasis run inherited (from a batch system, a shell)
			// are not the job's: they would leak into it and its
			// checkpoints.
			cloexecInherited()
			code, err := e.run(c)
			if err != nil && code == ExitOK {
				// stasis run's own failure, not the job's outcome.
				switch {
				case errors.Is(err, hooks.ErrCommandNotFound):
					code = ExitCommandNotFound
				case errors.Is(err, hooks.ErrCannotExecute):
					code = ExitCannotExecute
				default:
					code = ExitRunFailed
				}
			}
			if code == ExitOK {
				return nil
			}
			return exitWith{code: code, err: err}
		},
	}
}

// run runs the job and returns stasis run's exit code.
func (e *env) run(c *ucli.Context) (int, error) {
	s, err := openStore(c)
	if err != nil {
		return 0, err
	}
	cfg, err := loadConfig(s)
	if err != nil {
		return 0, err
	}
	o, err := runOptions(c, cfg)
	if err != nil {
		return 0, err
	}
	o.Stdin, o.Stdout, o.Stderr, o.Log = os.Stdin, fileOr(e.stdout, os.Stdout), fileOr(e.stderr, os.Stderr), e.stderr
	// SIGINT and SIGTERM are the job's to get (forwarded), not a reason
	// for stasis run to stop.
	out, err := hooks.Run(context.WithoutCancel(c.Context), s, o)
	if err != nil {
		return 0, err
	}
	switch out.End {
	case hooks.Checkpointed:
		fmt.Fprintf(e.stderr, "stasis run: job %q preempted and checkpointed as %s: exit %d (requeue it)\n", o.Job, out.Checkpoint.ID, ExitPreempted)
		return ExitPreempted, nil
	case hooks.NotCheckpointed:
		return ExitNoCheckpoint, fmt.Errorf("job %q was preempted and has no new checkpoint: %s", o.Job, out.Reason)
	}
	return out.Status, nil
}

// runOptions reads run's flags over config.toml's [run] and the defaults.
func runOptions(c *ucli.Context, cfg hooks.Config) (hooks.RunOptions, error) {
	d := cfg.Run
	pick := func(flag, fromConfig, def string) string {
		if c.IsSet(flag) {
			return c.String(flag)
		}
		if fromConfig != "" {
			return fromConfig
		}
		return def
	}
	pickDuration := func(flag string, fromConfig, def time.Duration) time.Duration {
		if c.IsSet(flag) {
			return c.Duration(flag)
		}
		if fromConfig > 0 {
			return fromConfig
		}
		return def
	}
	job := c.String("job")
	if job == "" {
		return hooks.RunOptions{}, usagef("stasis run needs --job J")
	}
	mode, err := hooks.ParseMode(pick("mode", d.Mode, string(hooks.ModeApp)))
	if err != nil {
		return hooks.RunOptions{}, usagef("--mode: " + err.Error())
	}
	sigs, err := hooks.ParseSignals(pick("signal", d.Signal, "USR1"))
	if err != nil {
		return hooks.RunOptions{}, usagef("--signal: " + err.Error())
	}
	var fallback hooks.Mode
	if f := pick("fallback", d.Fallback, ""); f != "" {
		if fallback, err = hooks.ParseMode(f); err != nil || fallback != hooks.ModeProcess {
			return hooks.RunOptions{}, usagef(fmt.Sprintf("--fallback %q: the only fallback is process", f))
		}
	}
	co, err := processOptions(c)
	if err != nil {
		return hooks.RunOptions{}, err
	}
	pidns, err := restore.ParsePIDNSMode(c.String("new-pidns"))
	if err != nil {
		return hooks.RunOptions{}, usagef("--new-pidns " + err.Error())
	}
	return hooks.RunOptions{
		Job: job, Mode: mode, Command: c.Args().Slice(), Signals: sigs,
		Grace: pickDuration("grace", d.Grace, 120*time.Second), KillAfter: pickDuration("kill-after", d.KillAfter, 10*time.Second),
		Fallback: fallback, FallbackAfter: c.Duration("fallback-after"),
		Scripts: scripts(c, cfg), Checkpoint: co,
		Restore: restore.Options{PIDWait: c.Duration("pid-wait"), PIDNS: pidns, CRIU: co.CRIU},
	}, nil
}

func (e *env) hookCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "hook",
		Usage: "hooks for schedulers and containers",
		Subcommands: []*ucli.Command{{
			Name:  "prestop",
			Usage: "checkpoint a job before its container stops (Kubernetes preStop); exit 0 once committed",
			Flags: append(append([]ucli.Flag{
				&ucli.StringFlag{Name: "job", Required: true, Usage: "the job"},
				&ucli.IntFlag{Name: "pid", Usage: "the process to checkpoint when the job does not run under stasis run"},
				&ucli.StringFlag{Name: "pid-file", Usage: "a file holding that PID"},
				&ucli.DurationFlag{Name: "timeout", Value: 25 * time.Second, Usage: "how long to wait for the commit"},
			}, processFlags()...), hookFlags(hooks.PreCheckpoint, hooks.PostCheckpoint)...),
			Action: func(c *ucli.Context) error {
				if err := noArgs(c); err != nil {
					return err
				}
				pid := c.Int("pid")
				if f := c.String("pid-file"); f != "" {
					if pid != 0 {
						return usagef("give --pid or --pid-file, not both")
					}
					data, err := os.ReadFile(f)
					if err != nil {
						return fmt.Errorf("%w: --pid-file: %v", checkpoint.ErrNoProcess, err)
					}
					first, _, _ := strings.Cut(strings.TrimSpace(string(data)), "\n")
					if pid, err = strconv.Atoi(strings.TrimSpace(first)); err != nil || pid <= 0 {
						return usagef(fmt.Sprintf("--pid-file %s holds %q, not a PID", f, first))
					}
				}
				s, err := openStore(c)
				if err != nil {
					return err
				}
				cfg, err := loadConfig(s)
				if err != nil {
					return err
				}
				co, err := processOptions(c)
				if err != nil {
					return err
				}
				rec, err := hooks.PreStop(c.Context, s, hooks.PreStopOptions{
					Job: c.String("job"), PID: pid, Timeout: c.Duration("timeout"), Scripts: scripts(c, cfg), Checkpoint: co, Log: e.stderr,
				})
				if rec != nil {
					fmt.Fprintf(e.stderr, "job %q checkpointed as %s (step %d, %s)\n", rec.Job, rec.ID, rec.Step, rec.Kind)
					fmt.Fprintln(e.stdout, rec.ID)
				}
				return err
			},
		}},
	}
}

// cloexecInherited sets close-on-exec on every file descriptor above 2.
func cloexecInherited() {
	if unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	entries, _ := os.ReadDir("/proc/self/fd")
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
}
