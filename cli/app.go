// Package cli is stasis's command line: it parses flags, calls the packages
// that do the work, prints their results (as text or --json) and maps errors
// to documented exit codes. It holds no logic of its own.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/stasis-ckpt/stasis/catalog"
	"github.com/stasis-ckpt/stasis/gdswriter"
	"github.com/stasis-ckpt/stasis/internal/trace"
	"github.com/stasis-ckpt/stasis/restore"
	ucli "github.com/urfave/cli/v2"
)

// Version is set at build time (-ldflags "-X ...cli.Version=...").
var Version = "dev"

// env carries what every command needs.
type env struct {
	stdout, stderr io.Writer
	// progress is true when stdout is a terminal: long work draws bars on
	// stderr.
	progress bool
}

// Run runs stasis with args (args[0] is the program name) and returns the
// exit code. SIGINT and SIGTERM cancel the running command, which cleans up
// before returning.
func Run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := &env{stdout: stdout, stderr: stderr, progress: isTerminal(stdout)}
	app := e.app()
	err := app.RunContext(ctx, flagsFirst(app, args))
	if err == nil {
		return ExitOK
	}
	if strings.HasPrefix(err.Error(), "Required flag") {
		// urfave/cli's missing-flag error has no exported type.
		err = usagef(err.Error())
	}
	code := exitCode(err)
	var mismatch *restore.MismatchError
	if errors.As(err, &mismatch) {
		// One line per mismatch, then what they mean.
		for _, m := range mismatch.Mismatches {
			fmt.Fprintf(stderr, "stasis: mismatch: %s\n", m)
		}
		for _, w := range mismatch.Warnings {
			fmt.Fprintf(stderr, "stasis: warning: %s\n", w)
		}
		fmt.Fprintf(stderr, "stasis: %s\n", mismatch.Summary())
		return code
	}
	if msg := oneLine(err); msg != "" {
		fmt.Fprintf(stderr, "stasis: %s\n", msg)
	}
	return code
}

// oneLine keeps an error message to one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", " ")), " ")
}

func (e *env) app() *ucli.App {
	app := &ucli.App{
		Name:                 "stasis",
		Usage:                "checkpoint and restore for GPU training jobs",
		Version:              Version,
		Writer:               e.stdout,
		ErrWriter:            e.stderr,
		EnableBashCompletion: true,
		HideHelpCommand:      true,
		ExitErrHandler:       func(*ucli.Context, error) {},
		OnUsageError: func(_ *ucli.Context, err error, _ bool) error {
			return usagef(err.Error())
		},
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "home", Usage: "the checkpoint store (default /var/lib/stasis for root, else ~/.local/share/stasis)", EnvVars: []string{"STASIS_HOME"}},
			&ucli.BoolFlag{Name: "allow-unsafe-store", Usage: "accept a store that another user owns or that others may write (and the config.toml and hooks in it)", EnvVars: []string{catalog.AllowUnsafeEnv}},
			&ucli.DurationFlag{Name: "lock-timeout", Value: 10 * time.Second, Usage: "how long to wait for the catalog when another process holds it", EnvVars: []string{"STASIS_LOCK_TIMEOUT"}},
		},
		Commands: []*ucli.Command{
			e.saveCommand(),
			e.loadCommand(),
			e.checkpointCommand(),
			e.restoreCommand(),
			e.recoverCommand(),
			e.migrateCommand(),
			e.cudaCommand(),
			e.lsCommand(),
			e.showCommand(),
			e.verifyCommand(),
			e.exportCommand(),
			e.importCommand(),
			e.pushCommand(),
			e.pullCommand(),
			e.rmCommand(),
			e.pruneCommand(),
			e.gcCommand(),
			e.catalogCommand(),
			e.doctorCommand(),
			e.benchCommand(),
			e.runCommand(),
			e.hookCommand(),
		},
		Action: func(c *ucli.Context) error {
			if c.Args().Present() {
				return usagef(fmt.Sprintf("no command %q (see `stasis --help`)", c.Args().First()))
			}
			return ucli.ShowAppHelp(c)
		},
	}
	setUsageErrors(app.Commands)
	// stasis run's own failures, bad flags included, are 125: its other
	// codes are the job's.
	run := findCommand(app.Commands, "run")
	run.OnUsageError = func(_ *ucli.Context, err error, _ bool) error {
		return exitWith{code: ExitRunFailed, err: usagef(err.Error())}
	}
	return app
}

// setUsageErrors makes every command report flag errors as usage errors (exit
// code 2, one line) instead of printing its help.
func setUsageErrors(cmds []*ucli.Command) {
	for _, c := range cmds {
		c.OnUsageError = func(_ *ucli.Context, err error, _ bool) error {
			return usagef(err.Error())
		}
		setUsageErrors(c.Subcommands)
	}
}

// openStore opens the store named by --home / $STASIS_HOME or the default.
func openStore(c *ucli.Context) (*catalog.Store, error) {
	return openStoreWith(c, catalog.Options{})
}

// openStoreWith is openStore with o's NoIndex.
func openStoreWith(c *ucli.Context, o catalog.Options) (*catalog.Store, error) {
	home := c.String("home")
	if home == "" {
		var err error
		if home, err = catalog.DefaultHome(); err != nil {
			return nil, err
		}
	}
	if c.Bool("allow-unsafe-store") {
		// The stasis processes this one starts (CRIU's action script,
		// hooks' commands) accept it too.
		os.Setenv(catalog.AllowUnsafeEnv, "1")
	}
	trace.Mark("cli: opening the store")
	s, err := catalog.Open(home, catalog.Options{LockTimeout: c.Duration("lock-timeout"), AllowUnsafe: c.Bool("allow-unsafe-store"), NoIndex: o.NoIndex})
	trace.Mark("cli: store open")
	return s, err
}

func storeDir(c *ucli.Context) string {
	if home := c.String("home"); home != "" {
		return home
	}
	home, _ := catalog.DefaultHome()
	return home
}

// selectorFlags choose a checkpoint by --job and --latest instead of an ID.
func selectorFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "job", Usage: "with --latest: the job whose newest checkpoint to use"},
		&ucli.BoolFlag{Name: "latest", Usage: "use the job's checkpoint with the highest step"},
	}
}

// selectCheckpoint resolves the ID argument (a unique prefix) or
// --job J --latest.
func selectCheckpoint(c *ucli.Context, s *catalog.Store) (catalog.Record, error) {
	args := c.Args()
	switch {
	case c.Bool("latest"):
		if args.Len() > 0 {
			return catalog.Record{}, usagef("give either an ID or --job J --latest, not both")
		}
		if c.String("job") == "" {
			return catalog.Record{}, usagef("--latest needs --job J")
		}
		return s.Latest(c.String("job"))
	case args.Len() == 1:
		return s.Resolve(args.First())
	case args.Len() == 0:
		return catalog.Record{}, usagef("give a checkpoint ID (or a unique prefix of one), or --job J --latest")
	}
	return catalog.Record{}, usagef(fmt.Sprintf("expected one checkpoint ID, got %d arguments", args.Len()))
}

// openSelected opens the store and resolves the checkpoint the command
// names (selectCheckpoint).
func openSelected(c *ucli.Context) (*catalog.Store, catalog.Record, error) {
	s, err := openStore(c)
	if err != nil {
		return nil, catalog.Record{}, err
	}
	rec, err := selectCheckpoint(c, s)
	return s, rec, err
}

// parseWriting reads the --compress and --tag flags of save.
func parseWriting(c *ucli.Context) (gdswriter.Method, map[string]string, error) {
	method, err := gdswriter.ParseMethod(c.String("compress"))
	if err != nil {
		return "", nil, usagef("--compress: " + err.Error())
	}
	tags, err := parseTags(c.StringSlice("tag"))
	return method, tags, err
}

func noArgs(c *ucli.Context) error {
	if c.Args().Len() > 0 {
		return usagef(fmt.Sprintf("%s takes no arguments (got %q)", c.Command.Name, c.Args().First()))
	}
	return nil
}

// parseTags reads repeated --tag key=value flags.
func parseTags(list []string) (map[string]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	tags := map[string]string{}
	for _, t := range list {
		k, v, ok := strings.Cut(t, "=")
		if !ok {
			return nil, usagef(fmt.Sprintf("--tag %q: use key=value", t))
		}
		tags[k] = v
	}
	return tags, nil
}
